"""Credentials inside URIs: masked wherever a URI is printed, and refused where a spec would carry them.

``redact_uri`` masks the password of ``scheme://user:password@host`` (or a bare
``scheme://token@host``) and secret query values (``?token=...``); every URI printed, logged or
written into a report goes through it (``orchestrator.track.tracking`` re-exports it). A spec is
uploaded with a job and logged as an artifact, so ``credentials_problem`` refuses a spec URI
holding any of them: credentials come from the environment (MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD, PGPASSWORD or ~/.pgpass, the cloud SDK's own variables). Standard
library only: the spec validates it without MLflow.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

REDACTED = "***"


# A URI inside any text: scheme, '://', then up to whitespace, a quote, '<', '>' or a backtick.
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
# A query key names a secret if one of its words is one of these ("token", "hf_token"; not
# "tokens" or "tokenizer").
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "secret",
        "token",
        "apikey",
        "credential",
        "credentials",
        "authorization",
        "auth",
        "cookie",
        "signature",
        "privatekey",
        "sessiontoken",
    }
)
_SECRET_COMPOUNDS = ("api_key", "api-key", "private_key", "private-key", "access_key_secret")


def _secret_key(key: str) -> bool:
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()  # apiKey -> api_key
    return any(c in snake for c in _SECRET_COMPOUNDS) or any(w in _SECRET_WORDS for w in re.split(r"[^a-z0-9]+", snake))


def _redact_one(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    # The authority ends at the first '/': a '?', '#' or '@' inside an unencoded password must
    # not end it early, so a query holding '@' with no path is over-masked rather than leaked.
    cut = rest.find("/")
    authority, tail = (rest, "") if cut < 0 else (rest[:cut], rest[cut:])
    userinfo, at, host = authority.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"
    base, q, query = (authority + tail).partition("?")
    if q:
        query, hash_, fragment = query.partition("#")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_key(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if _secret_key(k) else v) for k, v in pairs], safe="*")
        base += "?" + query + hash_ + fragment
    return f"{scheme}://{base}"


def redact_uri(text: str) -> str:
    """Mask the credentials of every URI in ``text`` (a URI, or a message holding URIs).

    The password of ``scheme://user:password@host`` (or a bare ``scheme://token@host``) and
    the values of secret query parameters (``token``, ``password``, ``api_key``, ...) become
    ``***``: ``postgresql://mlflow:s3cr3t@db/mlflow`` -> ``postgresql://mlflow:***@db/mlflow``,
    ``https://h/x?token=abc&a=1`` -> ``https://h/x?token=***&a=1``. Text without a URI
    (a local path) comes back unchanged.
    """
    return _URI_RE.sub(lambda m: _redact_one(m[0]), text)


# Database URIs may name their user: the password then comes from PGPASSWORD or ~/.pgpass.
_USER_ONLY_OK = ("sqlite", "postgresql", "mysql", "mssql")


def credentials_problem(uri: str) -> str | None:
    """Why ``uri`` (a spec's ``tracking_uri`` or ``storage_path``) may not be written in a spec,
    or None: it holds a password (``user:password@``), a bare ``token@`` outside a database
    URI, or a secret query parameter (``?token=``, ``?api_key=``). The message shows the URI
    redacted."""
    if "://" not in uri:
        return None  # a path
    parts = urlsplit(uri)
    scheme = parts.scheme.partition("+")[0].lower()
    where = None
    if parts.password is not None:
        where = "a password"
    elif parts.username is not None and scheme not in _USER_ONLY_OK:
        where = "a token as its user"
    elif any(_secret_key(k) for k, _ in parse_qsl(parts.query, keep_blank_values=True)):
        where = "a secret query parameter"
    if where is None:
        return None
    return (
        f"{redact_uri(uri)!r} embeds {where}; a spec is uploaded with the job and logged, so it holds no "
        "credentials: set them in the environment (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, "
        "PGPASSWORD or ~/.pgpass, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
    )
