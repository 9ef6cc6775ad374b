"""Every published MLflow store (results/*-mlflow.db.gz) holds only live records: a run or an
experiment deleted in MLflow (lifecycle_stage 'deleted') is hidden from the UI and the report
yet still read by anyone opening the file, so a published store carries none."""

import sqlite3
from pathlib import Path

import pytest

from tests.published import unzip_store

STORES = sorted((Path(__file__).resolve().parents[1] / "results").glob("*-mlflow.db.gz"))


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
