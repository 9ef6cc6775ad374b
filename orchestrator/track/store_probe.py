"""One bounded connection attempt to a tracking store's database before a read command asks MLflow.

MLflow builds a SQLAlchemy store with ten attempts and exponential backoff
(``mlflow.store.db.utils.create_sqlalchemy_engine_with_retry``: about 100 s in all), right
for a server starting beside a training run, wrong for ``qkstudy status`` typed at a
database that is down or unreachable: the user waits with no word. A read command first tries
the database once, with the driver's own connect timeout, and says what failed.
"""

from __future__ import annotations

import os

from orchestrator.plan.tracking_uri import DATABASE_SCHEMES
from orchestrator.track.tracking import redact_uri

CONNECT_TIMEOUT_S = float(os.environ.get("QKSTUDY_STORE_CONNECT_TIMEOUT_S", "10"))
_TIMEOUT_ARG = {"postgresql": "connect_timeout", "mysql": "connect_timeout", "mssql": "timeout"}


class StoreUnreachable(ConnectionError):
    """A tracking store's database that did not accept a connection within the timeout."""


def probe_store(uri: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Connect once to ``uri``'s database (postgresql, mysql, mssql; any other URI returns at
    once: SQLite files and MLflow servers are checked by their readers), waiting at most about
    ``timeout_s`` seconds (whole seconds for the drivers that take an integer).

    Raises:
        StoreUnreachable: the database refused, timed out or rejected the credentials; the
            message names the store (password redacted) and the driver's first line.
    """
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme not in DATABASE_SCHEMES or scheme == "sqlite":
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(
        uri, connect_args={_TIMEOUT_ARG[scheme]: max(1, round(timeout_s))}, poolclass=sqlalchemy.pool.NullPool
    )
    try:
        with engine.connect():
            pass
    except (sqlalchemy.exc.DBAPIError, OSError) as e:  # refused, timed out, unknown host, bad credentials
        first = str(getattr(e, "orig", None) or e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StoreUnreachable(
            f"tracking store {redact_uri(uri)} did not accept a connection within {timeout_s:g} s: {first} "
            "(is the database up and reachable from here? QKSTUDY_STORE_CONNECT_TIMEOUT_S sets the wait)"
        ) from None
    finally:
        engine.dispose()
