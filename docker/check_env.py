"""Refuse the stack's secrets while they are unset, too short, or still a placeholder.

docker/.env.example ships ``change-me-...`` values so that a copy renders; started as they
are, the cluster would run with secrets anyone can read in the repository. Two places check:

    python3 docker/check_env.py docker/.env          `make stack-up`, before anything starts
    check_env.py [--role ray] --exec CMD [ARG...]    image entrypoints: check the secrets in
                                                     this process's environment, then exec CMD

Rules, per secret variable (``SECRETS``) and per password inside a ``*_URI`` variable: not
empty, no placeholder word (``change-me``, ``changeme``, ``example``, ``placeholder``...), at
least ``MIN_LENGTH`` characters; in a file, every secret must be set, the three MLflow passwords (admin, training, reader)
must differ, so must their usernames, and POSTGRES_PASSWORD must be URL-safe (it goes into a connection URI). With
``--role ray`` (the Ray nodes) the server-side secrets (``SERVER_ONLY``) must be absent: a Ray
node runs users' code, so it gets the training account and the Ray token, nothing more.
Exit code 2 with one line per problem, naming the file (or "environment") and the variable.
Standard library only: it runs in the images before anything else.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

SECRETS = ("MLFLOW_ADMIN_PASSWORD", "QKSTUDY_TRAINING_PASSWORD", "QKSTUDY_READER_PASSWORD",
           "MLFLOW_FLASK_SERVER_SECRET_KEY", "RAY_AUTH_TOKEN", "POSTGRES_PASSWORD")
# Secrets as the containers name them (compose maps the file's names onto these).
RUNTIME_SECRETS = SECRETS + ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD")
# Secrets only the MLflow server / Postgres hold; a Ray node started with one is refused.
SERVER_ONLY = ("POSTGRES_PASSWORD", "MLFLOW_ADMIN_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_ADMIN_PASSWORD_PREVIOUS",
               "MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_BACKEND_STORE_URI")
# The accounts' names, with compose.yaml's defaults for a file that leaves one out.
USERNAMES = {"MLFLOW_ADMIN_USERNAME": "qkstudy-admin", "QKSTUDY_TRAINING_USERNAME": "qkstudy-train",
             "QKSTUDY_READER_USERNAME": "qkstudy-read"}
MIN_LENGTH = 16
_PLACEHOLDER = re.compile(r"change[-_ ]?me|changeit|example|placeholder|secret-here|<.*>", re.I)
_URL_SAFE = re.compile(r"[A-Za-z0-9._~-]+")


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a compose env file (comments and blank lines skipped, no quoting)."""
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def value_problem(value: str) -> str | None:
    """Why `value` is not acceptable as a secret, or None."""
    if not value:
        return "is empty"
    if _PLACEHOLDER.search(value):
        return "is still a placeholder (copy of docker/.env.example?): generate one with " \
               "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
    if len(value) < MIN_LENGTH:
        return f"is shorter than {MIN_LENGTH} characters"
    return None


def _uri_password(value: str) -> str | None:
    try:
        return urlsplit(value).password
    except ValueError:
        return None


def problems(env: Mapping[str, str], *, names: tuple[str, ...], require_all: bool) -> list[str]:
    """Every problem with the secrets among `names` in `env` (plus passwords in ``*_URI``)."""
    found = []
    for name in names:
        if name not in env:
            if require_all:
                found.append(f"{name} is not set")
            continue
        why = value_problem(env[name])
        if why:
            found.append(f"{name} {why}")
    for name, value in env.items():
        password = _uri_password(value) if name.endswith("_URI") else None
        if password is not None and (why := value_problem(password)):
            found.append(f"{name}: its password {why}")
    if require_all:
        pg = env.get("POSTGRES_PASSWORD", "")
        if pg and not _URL_SAFE.fullmatch(pg):
            found.append("POSTGRES_PASSWORD must be URL-safe (letters, digits, . _ ~ -): it goes into a URI")
        accounts = ("MLFLOW_ADMIN_PASSWORD", "QKSTUDY_TRAINING_PASSWORD", "QKSTUDY_READER_PASSWORD")
        for i, a in enumerate(accounts):
            for b in accounts[i + 1:]:
                if env.get(a) and env.get(a) == env.get(b):
                    found.append(f"{b} must differ from {a}")
        # One name for two accounts would make the bootstrap re-key or demote the other one.
        users = {name: env.get(name) or default for name, default in USERNAMES.items()}
        names = list(users)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if users[a] == users[b]:
                    found.append(f"{b} ({users[b]}) must differ from {a}: each account needs its own name")
    return found


def main(argv: list[str]) -> int:
    """`check_env.py FILE` or `check_env.py [--role ray] --exec CMD...` (module docstring)."""
    role = None
    if argv[:1] == ["--role"] and len(argv) >= 2:
        role, argv = argv[1], argv[2:]
    if argv[:1] == ["--exec"]:
        bad = problems(os.environ, names=RUNTIME_SECRETS, require_all=False)
        if role == "ray":
            bad += [f"{n} is set, but a Ray node must not hold server secrets (pass only the training "
                    "account and RAY_AUTH_TOKEN)" for n in SERVER_ONLY if n in os.environ]
        where = "environment"
    elif len(argv) == 1:
        path = Path(argv[0])
        if not path.is_file():
            print(f"error: {path} not found: cp docker/.env.example {path} and set every secret", file=sys.stderr)
            return 2
        bad = problems(read_env_file(path), names=SECRETS, require_all=True)
        where = str(path)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for problem in bad:
        print(f"error: {where}: {problem}", file=sys.stderr)
    if bad:
        return 2
    if argv[:1] == ["--exec"] and len(argv) > 1:
        os.execvp(argv[1], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
