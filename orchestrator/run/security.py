"""Secure defaults shared by `qkstudy submit`, the runner and anything that logs or loads.

Why this module exists: a study crosses trust boundaries the laptop demo never sees. A spec is
turned into a Ray job whose entrypoint Ray runs *through a shell* on the head node; MLflow
credentials travel in the environment; checkpoints come back from shared storage (NFS, S3)
that other people can write to. So:

- `check_submit_address` refuses to send a job (which carries code and, implicitly, the
  user's authority over the cluster) over plain HTTP to anything but loopback, unless the
  user says so explicitly (`--allow-insecure`).
- `shell_join` is the only way an argv becomes a shell command line: every element is
  quoted, so a spec field such as ``$(rm -rf ~)`` stays one literal argument.
- `redact` / `redact_text` / `redact_uri` / `RedactingFilter` keep passwords, tokens and
  basic-auth URIs (``http://user:pass@host``) out of logs and printed specs.
- `safe_torch_load` loads a checkpoint with ``torch.load(weights_only=True)``: a pickle in
  a shared bucket must not be able to run code. (DeepSpeed checkpoints load through
  DeepSpeed's own loader, `engine.load_checkpoint`, never through a bare `torch.load`.)

All functions are pure except `safe_torch_load` (reads a file) and `known_secrets` (reads
the environment).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import pickle
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from io import BytesIO
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "InsecureAddressError",
    "UnsafeCheckpointError",
    "REDACTED",
    "SECRET_ENV_VARS",
    "check_submit_address",
    "is_loopback_host",
    "is_secret_key",
    "known_secrets",
    "redact",
    "redact_text",
    "redact_uri",
    "RedactingFilter",
    "shell_join",
    "safe_torch_load",
]

REDACTED = "***"

# Environment variables whose *values* are secrets wherever they appear in text.
SECRET_ENV_VARS: tuple[str, ...] = (
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "POSTGRES_PASSWORD",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MINIO_ROOT_PASSWORD",
    "RAY_JOB_HEADERS",
    "RAY_AUTH_TOKEN",
    "HF_TOKEN",
    "WANDB_API_KEY",
)

# A key names a secret if any underscore/dash-separated word is one of these (so "token"
# and "hf_token" match, but "tokens", "max_tokens" and "tokenizer" do not).
_SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "secret", "token", "apikey", "credential", "credentials",
    "authorization", "auth", "cookie", "signature", "privatekey", "sessiontoken",
})
_SECRET_COMPOUNDS = ("api_key", "api-key", "private_key", "private-key", "access_key_secret")


class InsecureAddressError(ValueError):
    """A job-submission address would send the job unencrypted over a network."""


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds objects that a weights-only load refuses (possible code)."""


# --------------------------------------------------------------------------- addresses


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IPs (127.0.0.0/8, ::1, IPv4-mapped 127.x).

    A hostname other than ``localhost`` is *not* resolved: DNS could point it anywhere.
    """
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def check_submit_address(address: str, *, allow_insecure: bool = False) -> str:
    """Validate and normalise a Ray Job Submission address (the dashboard URL, port 8265).

    Returns ``scheme://host[:port][/path]`` with scheme and host lower-cased and no trailing
    slash. An address without a scheme (``HOST:8265``) is read as ``http://`` (what Ray
    itself assumes) and then checked like one.

    Accepted: ``https://`` anywhere; ``http://`` to a loopback host (127.0.0.0/8, ::1,
    localhost), e.g. an SSH tunnel or ``docker compose`` on the same machine.

    Raises:
        InsecureAddressError: ``http://`` to a non-loopback host and ``allow_insecure`` is
            False (the job, its code and any auth header would travel in clear text).
        ValueError: empty or unparsable address, a scheme other than http/https (``ray://``
            is the Ray Client port, not the Job Submission API), a missing host, an invalid
            port, credentials embedded in the address (they would end up in logs: pass them
            as headers instead), or a query/fragment.
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError("submit address is empty: expected e.g. https://ray-head.example:8265")
    raw = address.strip()
    if "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urlsplit(raw)
        port = parts.port  # parses and range-checks the port
    except ValueError as err:
        raise ValueError(f"submit address {address!r} is not a valid URL: {err}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(
            f"submit address {address!r}: scheme {scheme!r} is not supported; the Ray Job "
            "Submission API is the dashboard URL, e.g. https://ray-head.example:8265"
        )
    host = parts.hostname
    if not host:
        raise ValueError(f"submit address {address!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"submit address {redact_uri(address)!r} embeds credentials; they would be logged. "
            "Pass authentication as request headers (RAY_JOB_HEADERS) instead"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"submit address {address!r} must not have a query or fragment")
    if any(ch.isspace() for ch in raw):
        raise ValueError(f"submit address {address!r} contains whitespace")
    if scheme == "http" and not is_loopback_host(host) and not allow_insecure:
        raise InsecureAddressError(
            f"refusing to submit to {address!r} over plain http: the job would cross the network "
            "unencrypted. Use https:// (TLS in front of the Ray dashboard), an SSH tunnel to "
            "http://127.0.0.1:8265, or pass --allow-insecure if this network is trusted"
        )
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))


# --------------------------------------------------------------------------- shell


def shell_join(argv: Sequence[str]) -> str:
    """Quote an argv into one shell command line, for APIs that insist on a string.

    Ray's Job Submission API takes ``entrypoint`` as a string and runs it with a shell on
    the head node, so every element is quoted with `shlex.quote`: ``shlex.split`` of the
    result gives back `argv` exactly, and shell metacharacters (``$( )``, backticks, ``;``,
    ``|``, newlines) stay literal. Everywhere else launch processes with an argv list and
    never ``shell=True``.

    Raises:
        TypeError: `argv` is a string (almost always a bug) or holds a non-string element.
        ValueError: `argv` is empty or an element contains a NUL byte.
    """
    if isinstance(argv, (str, bytes)):
        raise TypeError("shell_join expects a list of arguments, not a single string")
    args = list(argv)
    if not args:
        raise ValueError("shell_join: empty argv")
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise TypeError(f"shell_join: argv[{i}] is {type(arg).__name__}, expected str")
        if "\x00" in arg:
            raise ValueError(f"shell_join: argv[{i}] contains a NUL byte")
    return shlex.join(args)


# --------------------------------------------------------------------------- redaction


def is_secret_key(key: object) -> bool:
    """True if a mapping key / variable name names a secret (password, token, api key...)."""
    if not isinstance(key, str):
        return False
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()  # apiKey -> api_key
    if any(c in snake for c in _SECRET_COMPOUNDS):
        return True
    return any(w in _SECRET_WORDS for w in re.split(r"[^a-z0-9]+", snake))


def known_secrets(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of the secret environment variables (`SECRET_ENV_VARS`) that are set.

    Values shorter than 4 characters are ignored: masking them would shred ordinary text.
    """
    env = os.environ if env is None else env
    return [env[k] for k in SECRET_ENV_VARS if len(env.get(k) or "") >= 4]


_USERINFO_RE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<user>[^/\s:@]*):(?P<pw>[^/\s@]*)@")
_AUTH_HEADER_RE = re.compile(r"(?i)\b(authorization|proxy-authorization)(\s*[:=]\s*)(\"?)(basic|bearer|token)?\s*[^\s\"',}]+")
# key=value, key: value, "key": "value" where the key names a secret
_KV_RE = re.compile(
    r"(?P<key>[\"']?[A-Za-z_][A-Za-z0-9_.\-]*[\"']?)(?P<sep>\s*[:=]\s*)(?P<q>[\"']?)(?P<val>[^\s\"',;&}]+)"
)


def redact_uri(uri: str) -> str:
    """Mask the password of ``scheme://user:password@host`` and secret query parameters.

    ``postgresql://mlflow:s3cr3t@db/mlflow`` -> ``postgresql://mlflow:***@db/mlflow``;
    ``https://h/x?token=abc&a=1`` -> ``https://h/x?token=***&a=1``. A string that is not a
    URI comes back unchanged.
    """
    try:
        parts = urlsplit(uri)
    except ValueError:
        return redact_text(uri, secrets=())
    if not parts.scheme or not parts.netloc:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{hostport}" if ":" in userinfo else f"{REDACTED}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_key(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if is_secret_key(k) else v) for k, v in pairs],
                              safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Mask secrets in free text (log lines, printed specs, error messages).

    Masks: URI passwords (``http://u:p@h``), ``Authorization: Basic ...`` headers,
    ``key=value`` / ``key: value`` pairs whose key names a secret (`is_secret_key`), and
    every literal occurrence of `secrets` (default: `known_secrets()` from the environment).
    """
    secrets = known_secrets() if secrets is None else list(secrets)
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _USERINFO_RE.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    text = _AUTH_HEADER_RE.sub(
        lambda m: f"{m[1]}{m[2]}{m[3]}{(m[4] + ' ') if m[4] else ''}{REDACTED}", text
    )

    def _kv(m: re.Match[str]) -> str:
        key = m["key"].strip("\"'")
        # Authorization headers were masked above, scheme kept ("Basic ***").
        if not is_secret_key(key) or m["val"] == REDACTED or key.lower().endswith("authorization"):
            return m[0]
        return f"{m['key']}{m['sep']}{m['q']}{REDACTED}"

    return _KV_RE.sub(_kv, text)


def redact(obj: Any, secrets: Iterable[str] | None = None) -> Any:
    """Return a copy of `obj` safe to log or print: strings, mappings, lists, tuples, sets.

    Mapping values under a secret key (`is_secret_key`) become ``"***"`` whatever their
    type; strings are passed through `redact_text` (URI passwords, secret ``k=v`` pairs,
    known secret values); containers are walked recursively; pydantic models are dumped
    first; other objects are returned unchanged. The input is never modified.
    """
    secrets = known_secrets() if secrets is None else list(secrets)
    if hasattr(obj, "model_dump") and callable(obj.model_dump):
        obj = obj.model_dump()
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    if isinstance(obj, Mapping):
        return {
            k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact(v, secrets))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [redact(v, secrets) for v in obj]
        return items if isinstance(obj, list) else type(obj)(items)
    return obj


class RedactingFilter(logging.Filter):
    """`logging.Filter` that rewrites each record's message through `redact_text`.

    Attach it to a handler (``handler.addFilter(RedactingFilter())``) so that nothing the
    product or a library logs reaches a file or console with a secret in it. The secrets
    known at construction (plus any in `extra_secrets`) are masked literally.
    """

    def __init__(self, extra_secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets = known_secrets() + [s for s in extra_secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logger's problem, not ours
            return True
        clean = redact_text(message, self._secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True


# --------------------------------------------------------------------------- checkpoints


def safe_torch_load(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> Any:
    """Load a (non-DeepSpeed) checkpoint with ``torch.load(weights_only=True)``.

    `path` is a local path or a pyarrow filesystem URI (``s3://bucket/ckpt.pt``,
    ``file:///abs/path``), matching how the product addresses shared storage. Only tensors,
    primitive containers and the types torch allow-lists can come back, so a tampered file
    cannot execute code on load.

    Raises:
        FileNotFoundError: `path` does not exist.
        UnsafeCheckpointError: the file needs arbitrary unpickling (the message names it).
    """
    import torch

    target = os.fspath(path)
    if "://" in target:
        import pyarrow.fs

        fs, inner = pyarrow.fs.FileSystem.from_uri(target)
        if fs.get_file_info(inner).type == pyarrow.fs.FileType.NotFound:
            raise FileNotFoundError(f"checkpoint {target} does not exist")
        with fs.open_input_file(inner) as fh:
            source: Any = BytesIO(fh.read())
    else:
        if not os.path.exists(target):
            raise FileNotFoundError(f"checkpoint {target} does not exist")
        source = target
    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"checkpoint {redact_uri(target)} refused by a weights-only load (it pickles "
            f"objects other than tensors/containers): {str(err).splitlines()[0]}"
        ) from err
