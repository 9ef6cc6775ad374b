"""Every published MLflow store (results/*-mlflow.db.gz) holds only live records: a run or an
experiment deleted in MLflow (lifecycle_stage 'deleted') is hidden from the UI and the report
yet still read by anyone opening the file, so a published store carries none. And none names
the artifact folders of the machine that trained it (orchestrator/track/publish.py)."""

import sqlite3
from pathlib import Path

import pytest

from orchestrator.track.publish import PUBLISHED_SCHEME, publish_store
from tests.helpers import REPO
from tests.published import unzip_store

STORES = sorted((REPO / "results").glob("*-mlflow.db.gz"))


def deleted_records(db: Path) -> dict[str, int]:
    """Count of runs and experiments in the SQLite MLflow store ``db`` whose lifecycle_stage is 'deleted'."""
    with sqlite3.connect(db) as con:
        return {
            t: con.execute(f"SELECT count(*) FROM {t} WHERE lifecycle_stage = 'deleted'").fetchone()[0] for t in ("runs", "experiments")
        }


@pytest.mark.parametrize("gz", STORES, ids=lambda p: p.name)
def test_a_published_store_holds_no_deleted_runs(gz, tmp_path):
    unzip_store(gz, tmp_path)
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    assert deleted_records(db) == {"runs": 0, "experiments": 0}


def test_the_deleted_check_sees_a_deleted_run(tmp_path):
    """Negative control: one run marked deleted in a copy is counted."""
    unzip_store(STORES[0], tmp_path)
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET lifecycle_stage = 'deleted' WHERE run_uuid = (SELECT run_uuid FROM runs LIMIT 1)")
    assert deleted_records(db) == {"runs": 1, "experiments": 0}


def machine_paths(db: Path) -> list[str]:
    """Artifact locations in the store ``db`` that are not ``publish_store``'s placeholders."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT artifact_uri FROM runs UNION ALL SELECT artifact_location FROM experiments").fetchall()
    return [u for (u,) in rows if not str(u).startswith(f"{PUBLISHED_SCHEME}:/")]


@pytest.mark.parametrize("gz", STORES, ids=lambda p: p.name)
def test_a_published_store_names_no_artifact_folder_of_its_machine(gz, tmp_path):
    unzip_store(gz, tmp_path)
    assert machine_paths(tmp_path / "mlflow.db") == []


def test_publishing_rewrites_every_artifact_location_and_keeps_the_record(tmp_path):
    """Negative control first: a store as training left it names its folders."""
    unzip_store(STORES[0], tmp_path)
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET artifact_uri = 'file:///home/someone/runs/' || run_uuid")
        con.execute("UPDATE experiments SET artifact_location = 'file:///home/someone/runs'")
        before = con.execute("SELECT count(*), sum(value) FROM metrics").fetchone()
    assert len(machine_paths(db)) > 0
    publish_store(db, tmp_path / "out.db.gz")
    (tmp_path / "pub").mkdir()
    unzip_store(tmp_path / "out.db.gz", tmp_path / "pub")
    assert machine_paths(tmp_path / "pub" / "mlflow.db") == []
    with sqlite3.connect(tmp_path / "pub" / "mlflow.db") as con:
        assert con.execute("SELECT count(*), sum(value) FROM metrics").fetchone() == before
        uri, run = con.execute("SELECT artifact_uri, run_uuid FROM runs LIMIT 1").fetchone()
    assert uri.endswith(f"/{run}") and b"/home/someone" not in (tmp_path / "pub" / "mlflow.db").read_bytes()
    assert machine_paths(db) != []  # the source store is left as it was
