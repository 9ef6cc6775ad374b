"""Which MLflow tracking URIs a study (or ``--tracking-uri``) may name, checked before anything
runs: an unknown scheme would otherwise pass validation and fail inside the first run (MLflow's
``UnsupportedModelRegistryStoreURIException`` / "Could not find a registered tracking store"),
after Ray started and leases were taken.

The schemes are those MLflow 3's tracking-store registry serves
(``mlflow.tracking._tracking_service.registry``: file, the SQLAlchemy databases, the REST
server, Databricks and Unity Catalog), listed here so that validating a spec imports no MLflow.
"""

from __future__ import annotations

import os
import re

# A plain path (no scheme, or a one-letter one: a Windows drive) is a file store, like "file:":
# MLflow 3 serves one only when MLFLOW_ALLOW_FILE_STORE is true.
TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")
# SQLAlchemy URIs may name one driver ("postgresql+psycopg", "mysql+pymysql"), and only in
# lower case: SQLAlchemy looks the dialect up by that exact name.
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be the tracking URI of a study, or None when it can: empty, a scheme
    MLflow has no tracking store for (``bogus://``, ``s3://``: artifacts only), a database
    scheme SQLAlchemy would not load (upper case, two drivers, a driver on a non-database
    scheme), or an in-memory SQLite store (each process would get its own, empty). Only the
    form is checked, not whether a server answers (that is a connection error later)."""
    if not uri.strip():
        return "empty tracking URI"
    m = _SCHEME_RE.match(uri)
    if m is None and uri.strip() in TRACKING_SCHEMES:  # "databricks": a profile, not a path
        return None
    if m is None or len(m.group(1)) == 1 or m.group(1).lower() == "file":  # a path (C:\\mlruns, C:mlruns)
        return _file_store_problem(uri)
    scheme, _, driver = m.group(1).partition("+")
    allowed = ", ".join(f"{s}:" for s in TRACKING_SCHEMES)
    if scheme.lower() not in TRACKING_SCHEMES or "+" in driver or (driver and scheme.lower() not in DATABASE_SCHEMES):
        return f"unsupported tracking URI scheme {m.group(1)!r} in {uri!r}: expected a path or one of {allowed}"
    if scheme.lower() in DATABASE_SCHEMES and m.group(1) != m.group(1).lower():
        return f"database scheme {m.group(1)!r} in {uri!r} must be lower case ({m.group(1).lower()}:)"
    if scheme == "sqlite" and uri[m.end() :].split("?", 1)[0] in ("", "//", "///", "///:memory:"):
        return f"{uri!r} is an in-memory SQLite store: every process would get its own, empty (give a file: sqlite:///path/mlflow.db)"
    return None


def _file_store_problem(uri: str) -> str | None:
    """Why a plain path or ``file:`` URI cannot be the store: MLflow 3 refuses its file store
    (MlflowException "filesystem backend ... deprecated") unless ``MLFLOW_ALLOW_FILE_STORE`` is
    true; a path ending in .db / .sqlite / .sqlite3 was meant as a SQLite file."""
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("1", "true", "yes"):
        return None
    path = re.sub(r"^file:(//)?", "", uri)
    sqlite = path if path.lower().endswith(SQLITE_SUFFIXES) else f"{path.rstrip('/')}/mlflow.db"
    return (
        f"{uri!r} is a plain path, which MLflow reads as its file store (refused by MLflow 3 unless "
        f"MLFLOW_ALLOW_FILE_STORE=true): did you mean sqlite:///{sqlite}"
    )


class TrackingURIError(ValueError):
    """A tracking URI given on the command line (``--tracking-uri``) or in ``MLFLOW_TRACKING_URI``
    that MLflow has no store for; the message names where it came from."""


def check_tracking_uri(uri: str, source: str) -> str:
    """``uri`` unchanged when MLflow can serve it (``tracking_uri_problem``).

    Raises:
        TrackingURIError: "<source>: <why>", source naming the option or variable it came from.
    """
    problem = tracking_uri_problem(uri)
    if problem:
        raise TrackingURIError(f"{source}: {problem}")
    return uri
