"""Create (or re-key) the MLflow account training runs log with: a non-admin user.

Runs once per `make stack-up` as the compose service ``mlflow-users``, after the server is
healthy. It holds the admin credentials; the Ray nodes never do: they get only the account
made here, which can create experiments and runs (and manage the ones it created) but cannot
read other users' experiments, create users or change permissions.

Environment: MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (the
admin), QKSTUDY_TRAINING_USERNAME / QKSTUDY_TRAINING_PASSWORD (the account to ensure).
Exit code 0 when the account exists with that password and is not an admin, 2 on missing
settings. Idempotent: a second run updates the password and changes nothing else.
Standard library only (mlflow's own client would import the whole server first).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

API = "/api/2.0/mlflow/users"
RETRY_S = 180.0


class ServerRefused(RuntimeError):
    """The auth API answered with an error (status and MLflow error code in the message)."""


def _call(uri: str, auth: tuple[str, str], method: str, path: str, body: dict | None = None,
          retry_s: float = RETRY_S) -> dict:
    """One JSON request to MLflow's auth REST API with basic auth; returns the decoded body.
    Standard library only: importing mlflow's client pulls in the whole server (a minute here).
    A dropped connection is retried for `retry_s`: the server answers /health (so compose
    starts this) while its second worker may still be loading the auth app."""
    data = json.dumps(body).encode() if body is not None else None
    deadline = time.monotonic() + retry_s
    while True:
        req = urllib.request.Request(uri.rstrip("/") + path, data=data, method=method)
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read().decode() or "{}")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            if err.code < 500 or time.monotonic() > deadline:
                raise ServerRefused(f"{method} {path}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as err:
            if time.monotonic() > deadline:
                raise ServerRefused(f"{method} {path}: {err}") from None
        time.sleep(2)


def ensure_user(uri: str, admin: tuple[str, str], username: str, password: str) -> str:
    """Create `username` with `password`, or set its password if it exists; never an admin.

    Returns "created" or "updated". Raises ServerRefused when the server refuses (e.g. the
    `admin` credentials are wrong or not an admin's)."""
    try:
        _call(uri, admin, "POST", f"{API}/create", {"username": username, "password": password})
        outcome = "created"
    except ServerRefused as err:
        if "RESOURCE_ALREADY_EXISTS" not in str(err):
            raise
        _call(uri, admin, "PATCH", f"{API}/update-password", {"username": username, "password": password})
        outcome = "updated"
    query = urllib.parse.urlencode({"username": username})
    if _call(uri, admin, "GET", f"{API}/get?{query}")["user"]["is_admin"]:
        _call(uri, admin, "PATCH", f"{API}/update-admin", {"username": username, "is_admin": False})
    return outcome


def main() -> int:
    """Read the settings from the environment and ensure the training account."""
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
             "QKSTUDY_TRAINING_USERNAME", "QKSTUDY_TRAINING_PASSWORD")
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        print(f"error: set {', '.join(missing)}", file=sys.stderr)
        return 2
    user = os.environ["QKSTUDY_TRAINING_USERNAME"]
    if user == os.environ["MLFLOW_TRACKING_USERNAME"]:
        print("error: QKSTUDY_TRAINING_USERNAME must differ from the admin account", file=sys.stderr)
        return 2
    admin = (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"])
    outcome = ensure_user(os.environ["MLFLOW_TRACKING_URI"], admin, user, os.environ["QKSTUDY_TRAINING_PASSWORD"])
    print(f"MLflow training user {user!r} {outcome} (not an admin)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
