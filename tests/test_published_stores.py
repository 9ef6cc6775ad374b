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


@pytest.mark.parametrize("gz", STORES, ids=lambda p: p.name)
def test_a_published_store_answers_a_readme_query_and_lists_each_run_once(gz, tmp_path):
    """README's tag names (``qkstudy.variant``) find every training run of the store; ``status``
    with the store's committed spec lists each of them once (runs trained under an earlier
    identity or at a tuned LR are matched by name, said in one warning), none as planned."""
    from mlflow.tracking import MlflowClient

    from orchestrator.plan.spec import load_spec
    from orchestrator.track.status import study_status

    uri = unzip_store(gz, tmp_path)
    name = gz.name.removesuffix("-mlflow.db.gz")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    train = client.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'", max_results=5000)
    by_variant = client.search_runs([exp.experiment_id], "tags.`qkstudy.variant` != ''", max_results=5000)
    assert train and {r.info.run_id for r in train} <= {r.info.run_id for r in by_variant}
    warned: list[str] = []
    rows = study_status(name, uri, load_spec(REPO / "jobs" / f"{name}.yaml"), warn=warned.append)
    names = [r["run_name"] for r in rows]
    assert len(names) == len(set(names))  # each run once
    stored = {r.info.run_name for r in train}
    assert {r["run_name"] for r in rows if r["status"] in ("finished", "gated")} == stored  # every stored run, as trained
    assert not stored & {r["run_name"] for r in rows if r["status"] == "planned"}  # planned: only what the store lacks
    renamed = [w for w in warned if "carry other run ids" in w]
    assert len(renamed) <= 1 and (not renamed or any(r["note"].startswith("planned here as ") for r in rows))


def test_publishing_puts_bare_run_tags_in_the_namespace_and_keeps_their_values(tmp_path):
    """Negative control first: a store with the pre-namespace tag names; after publishing, the
    README query finds its runs, every value is kept, and a bare tag beside its twin is dropped."""
    unzip_store(STORES[0], tmp_path)
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("UPDATE tags SET key = substr(key, 9) WHERE key LIKE 'qkstudy.%' AND key != 'qkstudy.kind'")
        run = con.execute("SELECT run_uuid FROM tags WHERE key = 'variant' LIMIT 1").fetchone()[0]
        con.execute("INSERT INTO tags (key, value, run_uuid) VALUES ('qkstudy.variant', 'twin', ?)", (run,))
        values = dict(con.execute("SELECT run_uuid || '/' || key, value FROM tags WHERE key IN ('scale', 'seed', 'status')").fetchall())
        assert con.execute("SELECT count(*) FROM tags WHERE key = 'qkstudy.scale'").fetchone()[0] == 0
    publish_store(db, tmp_path / "out.db.gz")
    (tmp_path / "pub").mkdir()
    unzip_store(tmp_path / "out.db.gz", tmp_path / "pub")
    with sqlite3.connect(tmp_path / "pub" / "mlflow.db") as con:
        after = dict(
            con.execute(
                "SELECT run_uuid || '/' || substr(key, 9), value FROM tags WHERE key IN ('qkstudy.scale', 'qkstudy.seed', 'qkstudy.status')"
            ).fetchall()
        )
        assert (
            after == values
            and con.execute("SELECT count(*) FROM tags WHERE key IN ('scale', 'seed', 'status', 'variant')").fetchone()[0] == 0
        )
        assert con.execute("SELECT value FROM tags WHERE key = 'qkstudy.variant' AND run_uuid = ?", (run,)).fetchone()[0] == "twin"


def test_a_report_of_a_published_store_is_written_and_logs_nothing(tmp_path):
    """``report`` on a published store writes its files and says it logged nothing: no report
    run is created (its artifacts could only fail to store), none is left FAILED."""
    from orchestrator.report import build_report

    gz = REPO / "results" / "cpu-evidence-mqar-medium-mlflow.db.gz"
    uri = unzip_store(gz, tmp_path)
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        before = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    summary = build_report("cpu-evidence-mqar-medium", uri, tmp_path / "report", n_boot=10)
    assert summary["mlflow_not_logged"].startswith("not logged to MLflow: a published store")
    assert (tmp_path / "report" / "report.md").is_file()
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == before
        assert con.execute("SELECT count(*) FROM runs WHERE status = 'FAILED'").fetchone()[0] == 0
