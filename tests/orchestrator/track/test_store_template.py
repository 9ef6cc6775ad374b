"""A new SQLite store copied from a migrated template is the store MLflow would have made.

Real MLflow throughout: the template is migrated by MLflow's own store, and every copy is
opened by ``MlflowClient`` (which checks the schema revision itself).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.track import store_template
from orchestrator.track.store_template import digest_path, schema_head, seed_store, store_revision, template_path
from orchestrator.track.tracking import client_for, sqlite_uri


@pytest.fixture
def templates(tmp_path, monkeypatch) -> Path:
    """A template folder of this test's own."""
    monkeypatch.setenv(store_template.TEMPLATE_DIR_ENV, str(tmp_path / "templates"))
    return tmp_path / "templates"


def schema(db: Path) -> list[tuple[str, list[str]]]:
    """Every table, index and trigger of ``db`` with the lines of its SQL, sorted: MLflow's own
    migrations write a table's constraints in an order that varies from one store to the next."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    finally:
        con.close()
    return sorted((name, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())) for name, sql in rows)


def test_a_seeded_store_has_mlflows_schema_and_its_own_default_experiment(templates, tmp_path):
    migrated = tmp_path / "migrated" / "mlflow.db"
    migrated.parent.mkdir()
    MlflowClient(sqlite_uri(migrated)).search_experiments()  # MLflow's own migrations
    seeded = tmp_path / "study" / "mlflow.db"
    seeded.parent.mkdir()

    assert seed_store(seeded) is True
    assert template_path().exists() and store_revision(template_path()) == schema_head()
    assert store_revision(seeded) == schema_head() == store_revision(migrated)
    assert schema(seeded) == schema(migrated)
    client = MlflowClient(sqlite_uri(seeded))
    (default,) = client.search_experiments()
    assert (default.experiment_id, default.name) == ("0", "Default")  # made on open, not copied from the template
    exp = client.create_experiment("s", artifact_location=(tmp_path / "study" / "artifacts").as_uri())
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "val/loss", 2.5, step=128)
    assert [m.value for m in client.get_metric_history(run.info.run_id, "val/loss")] == [2.5]


def test_schema_comparison_sees_a_missing_table(templates, tmp_path):
    """Negative control of the schema check above: a store with one table dropped differs."""
    db = tmp_path / "mlflow.db"
    seed_store(db)
    before = schema(db)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE experiment_tags")
    con.commit()
    con.close()
    assert schema(db) != before


def test_a_template_at_another_revision_is_rebuilt_not_copied(templates, tmp_path):
    seed_store(tmp_path / "a.db")
    con = sqlite3.connect(template_path())
    con.execute("UPDATE alembic_version SET version_num = 'stale0000000'")
    con.commit()
    con.close()

    assert seed_store(tmp_path / "b.db") is True
    assert store_revision(tmp_path / "b.db") == schema_head()
    assert store_revision(template_path()) == schema_head()
    MlflowClient(sqlite_uri(tmp_path / "b.db")).search_experiments()  # MLflow's own revision check passes


def test_an_existing_store_is_never_replaced(templates, tmp_path):
    db = tmp_path / "mlflow.db"
    client = client_for(sqlite_uri(db))
    client.create_experiment("kept")
    assert seed_store(db) is False
    assert [e.name for e in MlflowClient(sqlite_uri(db)).search_experiments()] == ["kept", "Default"]
    assert seed_store(tmp_path / "no-such-folder" / "mlflow.db") is False
    assert not (tmp_path / "no-such-folder").exists()


def test_a_template_folder_that_cannot_be_written_leaves_the_store_to_mlflow(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(store_template.TEMPLATE_DIR_ENV, str(blocker / "templates"))
    db = tmp_path / "mlflow.db"
    assert seed_store(db) is False and not db.exists()
    client_for(sqlite_uri(db)).search_experiments()  # MLflow migrates it as without a template
    assert store_revision(db) == schema_head()


def test_a_file_that_only_claims_the_head_revision_is_rebuilt_not_copied(templates, tmp_path):
    """A template with the right ``alembic_version`` and nothing else (or a damaged one) fails its
    digest: copied, MLflow would skip its migrations on it and fail on a missing column."""
    head = schema_head()
    fake = template_path(head)
    fake.parent.mkdir(parents=True)
    con = sqlite3.connect(fake)
    con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    con.execute("INSERT INTO alembic_version VALUES (?)", (head,))
    con.commit()
    con.close()
    assert store_revision(fake) == head  # what the revision check alone would have accepted

    db = tmp_path / "mlflow.db"
    assert seed_store(db) is True
    MlflowClient(sqlite_uri(db)).create_experiment("x")  # a whole store
    assert digest_path(fake).exists() and len(schema(fake)) > 10

    with fake.open("r+b") as f:  # damaged after its build: its digest no longer matches
        f.seek(200)
        f.write(b"\0" * 64)
    assert seed_store(tmp_path / "again.db") is True
    MlflowClient(sqlite_uri(tmp_path / "again.db")).create_experiment("y")


def test_a_seeded_store_has_the_mode_mlflows_own_store_gets(templates, tmp_path):
    os.umask(old := os.umask(0o022))  # this process's umask, read without changing it
    migrated = tmp_path / "migrated.db"
    MlflowClient(sqlite_uri(migrated)).search_experiments()
    seeded = tmp_path / "seeded.db"
    seed_store(seeded)
    mode = stat.S_IMODE(seeded.stat().st_mode)
    assert mode == stat.S_IMODE(migrated.stat().st_mode) == 0o666 & ~old


def test_an_in_memory_or_uri_filename_database_is_left_to_mlflow(templates, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert seed_store(Path(":memory:")) is False
    assert seed_store(Path("file:x.db")) is False
    assert list(tmp_path.iterdir()) == []
