"""A new SQLite tracking store copied from a migrated template, not built by MLflow's migrations.

Why: MLflow makes a new SQLite store by running every Alembic migration of its schema, each
with its own commits and fsyncs: 1.7-3.0 s of a one-run study's start-up and 5-11 s of
wall-clock on a plain disk, paid by every new study and by every test that makes a store
(BENCHMARKS.md). A copy of an already migrated store takes about 0.15 s.

When is a template right? Only for the MLflow that built it, byte for byte as it was built: a
template is kept per installed MLflow version and schema head (the head revision read from
MLflow's own migration scripts), beside the SHA-256 of the file its build checked, and before
every copy both its ``alembic_version`` (against that head) and its digest are checked, so a
template of another MLflow or another schema, a damaged one or a file that only claims the head
revision is never copied: it is built again. MLflow itself checks the copied store's revision
when it opens it (``_verify_schema``), as for any store.

What differs from a store MLflow migrates? Nothing a reader sees: the template holds the
migrated tables and no experiment (its Default experiment is deleted before it is published),
so MLflow creates the copy's Default experiment on first open, with the copy's own artifact
location. A template is written to a temporary file and renamed into place; a copy is
published with a hard link, which never replaces a store that appeared meanwhile (two drivers
creating one store: one copy wins, the other opens it), and gets the mode a file this process
creates gets (the umask's), as MLflow's own store does. An in-memory database
(``sqlite:///:memory:``) or a SQLite URI filename (``file:...``) is left to MLflow.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import secrets
import shutil
import sqlite3
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

TEMPLATE_DIR_ENV = "QKSTUDY_STORE_TEMPLATES"  # where templates live; default ~/.cache/qkstudy/mlflow-store


def schema_head() -> str:
    """The head revision of the installed MLflow's tracking schema, from its Alembic scripts
    (``mlflow/store/db_migrations``), read without importing MLflow.

    Raises:
        RuntimeError: MLflow is not installed, or its scripts do not have exactly one head."""
    from alembic.script import ScriptDirectory

    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("MLflow is not installed: no tracking schema to copy")
    heads = ScriptDirectory(str(Path(spec.submodule_search_locations[0]) / "store" / "db_migrations")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"MLflow's migration scripts have {len(heads)} heads ({heads}), expected 1")
    return heads[0]


def template_path(head: str | None = None) -> Path:
    """The template file of the installed MLflow version and ``head`` (default: ``schema_head()``),
    under ``$QKSTUDY_STORE_TEMPLATES`` or ``~/.cache/qkstudy/mlflow-store``; nothing is created.

    Raises:
        RuntimeError: as ``schema_head`` when ``head`` is not given."""
    root = Path(os.environ.get(TEMPLATE_DIR_ENV) or Path.home() / ".cache" / "qkstudy" / "mlflow-store")
    return root / f"mlflow-{importlib.metadata.version('mlflow')}-{head or schema_head()}.db"


def store_revision(db: Path) -> str | None:
    """The ``alembic_version`` of SQLite file ``db``; None when it has none (not an MLflow store).

    Raises:
        sqlite3.OperationalError: ``db`` does not exist or cannot be opened read-only."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.DatabaseError:
        return None
    finally:
        con.close()
    return row[0] if row else None


def digest_path(template: Path) -> Path:
    """Where the SHA-256 of ``template`` (as its build checked it) is kept: beside it."""
    return template.with_name(template.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def template_ok(template: Path, head: str) -> bool:
    """True when ``template`` is at revision ``head`` and is byte for byte the file its build
    checked (its digest file); False for a missing, damaged or foreign file."""
    try:
        return store_revision(template) == head and digest_path(template).read_text().strip() == _sha256(template)
    except (OSError, sqlite3.DatabaseError):
        return False


def build_template(path: Path, head: str) -> None:
    """Migrate a fresh store with MLflow's own SQLAlchemy store, drop its Default experiment, check
    its revision is ``head``, write its digest (``digest_path``) and rename it to ``path``.

    Raises:
        RuntimeError: the migrated store's revision is not ``head``.
        OSError: the template folder cannot be written."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
        db = Path(tmp) / "mlflow.db"
        store = SqlAlchemyStore(f"sqlite:///{db.resolve()}", Path(tmp).as_uri())  # MLflow runs its migrations
        store.engine.dispose()  # closed before the rename
        con = sqlite3.connect(db)
        with con:  # the copy's own Default experiment is made by MLflow when it opens the copy
            con.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
            con.execute("DELETE FROM experiments WHERE experiment_id = 0")
        con.close()
        if (rev := store_revision(db)) != head:
            raise RuntimeError(f"a store MLflow just migrated is at revision {rev}, its scripts' head is {head}")
        (Path(tmp) / "digest").write_text(_sha256(db))
        os.replace(Path(tmp) / "digest", digest_path(path))
        os.replace(db, path)


def seed_store(db: Path) -> bool:
    """Create SQLite store file ``db`` as a copy of the template when it does not exist yet,
    building the template first if this MLflow has none or its template fails ``template_ok``. Returns True when it copied; False
    for an existing file, an in-memory or URI-filename database, a folder that does not exist
    (MLflow reports it as before) or a
    template that cannot be made (MLflow then migrates the store itself, as without a
    template; the reason goes to the debug log). Never replaces a file: a store created by
    another process meanwhile is used as it is."""
    if db.name == ":memory:" or str(db).startswith("file:") or db.exists() or not db.parent.is_dir():
        return False
    try:
        head = schema_head()
        template = template_path(head)
        if not template_ok(template, head):
            build_template(template, head)
        # created by the copy itself (not mkstemp's 0600): the umask's mode, as MLflow's own store
        tmp = db.parent / f".{db.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            shutil.copyfile(template, tmp)
            os.link(tmp, db)
        finally:
            tmp.unlink(missing_ok=True)
    except FileExistsError:
        return False
    except (OSError, RuntimeError, sqlite3.DatabaseError) as e:
        log.debug("no store template for %s (MLflow migrates it): %s", db, e)
        return False
    return True
