"""Which MLflow tracking URIs a study (or ``--tracking-uri``) may name, checked before anything
runs: an unknown scheme would otherwise pass validation and fail inside the first run (MLflow's
``UnsupportedModelRegistryStoreURIException`` / "Could not find a registered tracking store"),
after Ray started and leases were taken.

The schemes are those MLflow 3's tracking-store registry serves
(``mlflow.tracking._tracking_service.registry``: file, the SQLAlchemy databases, the REST
server, Databricks and Unity Catalog), listed here so that validating a spec imports no MLflow.
"""

from __future__ import annotations

import re

# A plain path (no scheme) is a file store, like "file:". SQLAlchemy URIs may name a driver
# ("postgresql+psycopg", "mysql+pymysql").
TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be an MLflow tracking URI, or None when it can: empty, or a scheme
    MLflow has no tracking store for (``bogus://``). Only the form is checked, not whether a
    server answers (that is the run's or the query's connection error)."""
    if not uri.strip():
        return "empty tracking URI"
    m = _SCHEME_RE.match(uri)
    if m is None or (len(m.group(1)) == 1 and uri[1:3] in (":\\", ":/")):  # a path (C:\ on Windows)
        return None
    scheme = m.group(1).lower().split("+", 1)[0]
    if scheme in TRACKING_SCHEMES:
        return None
    return (f"unsupported tracking URI scheme {m.group(1)!r} in {uri!r}: expected a path or one of "
            + ", ".join(f"{s}:" for s in TRACKING_SCHEMES))


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
