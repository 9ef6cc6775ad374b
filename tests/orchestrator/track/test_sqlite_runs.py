"""The sqlite3 reader of a study's runs (``track.sqlite_runs``, what `qkstudy status` reads a
SQLite store with) against MLflow's own client on the same real store: the same runs, keys,
names, statuses, latest metrics, tags and params, for every case the store holds (a retried
run_id, a deleted run, a tuning run, a report run, NaN and re-logged metrics, another study)."""

from __future__ import annotations

import math
import sqlite3

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.track.sqlite_runs import sqlite_runs
from orchestrator.track.status import study_status
from orchestrator.track.tracking import KIND_TAG, find_train_runs, sqlite_uri
from tests.helpers import mlflow_store


def _view(runs: dict) -> dict:
    """What status reads of each run, NaN made comparable."""

    def metrics(m):
        return {k: "nan" if math.isnan(v) else v for k, v in m.items()}

    return {
        k: (r.info.run_id, r.info.run_name, r.info.status, metrics(r.data.metrics), dict(r.data.tags), dict(r.data.params))
        for k, r in runs.items()
    }


@pytest.fixture()
def store(tmp_path):
    db = tmp_path / "mlflow.db"
    c = MlflowClient(mlflow_store(tmp_path))
    eid = c.create_experiment("s")

    def run(run_id, kind="train", status="finished", metrics=(), params=None, name=None):
        r = c.create_run(eid, run_name=name or run_id, tags={KIND_TAG: kind, "run_id": run_id, "status": status})
        for key, value, step in metrics:
            c.log_metric(r.info.run_id, key, value, step=step)
        for k, v in (params or {}).items():
            c.log_param(r.info.run_id, k, v)
        return r.info.run_id

    run(
        "a",
        metrics=[("tokens", 512, 512), ("tokens", 1024, 1024), ("val/ppl", 30.5, 512), ("val/ppl", 20.25, 1024)],
        params={"planned_tokens": 1024, "data_hash": "h1"},
    )
    run("b", status="failed", metrics=[("train/loss", float("nan"), 512)], params={"planned_tokens": 2048})
    c.set_terminated(run("b", status="running", metrics=[("tokens", 256, 256)]), "RUNNING")  # retry: newest wins
    c.delete_run(run("c"))
    run("t", kind="tune")
    run("r", kind="report")
    other = c.create_experiment("other")
    c.create_run(other, tags={KIND_TAG: "train", "run_id": "z"})
    return db, c, eid


def test_the_reader_returns_what_mlflows_client_returns(store) -> None:
    db, c, eid = store
    for kind in ("train", "tune"):
        got, want = _view(sqlite_runs(db, "s", kind)), _view(find_train_runs(c, eid, kind))
        assert got == want
    runs = sqlite_runs(db, "s")
    assert sorted(runs) == ["a", "b"]  # c deleted, t tune, r report, z another study
    assert runs["a"].data.metrics == {"tokens": 1024.0, "val/ppl": 20.25}  # the latest points
    assert runs["b"].data.tags["status"] == "running" and runs["b"].info.status == "RUNNING"
    assert sqlite_runs(db, "no-such-study") is None


def test_ties_in_start_time_and_a_deleted_experiment_read_as_the_client_reads_them(tmp_path) -> None:
    c = MlflowClient(mlflow_store(tmp_path))
    eid = c.create_experiment("s")
    for i in range(6):  # three run_ids retried at the same millisecond: the tie-break decides which wins
        c.create_run(eid, start_time=1_000, tags={KIND_TAG: "train", "run_id": f"r{i % 3}", "status": f"s{i}"})
    assert _view(sqlite_runs(tmp_path / "mlflow.db", "s")) == _view(find_train_runs(c, eid))
    c.delete_experiment(eid)  # its runs go with it; the experiment is still found by name
    assert c.get_experiment_by_name("s") is not None and find_train_runs(c, eid) == {}
    assert sqlite_runs(tmp_path / "mlflow.db", "s") == {}


def test_the_comparison_sees_a_difference(store) -> None:
    """Negative control: the same comparison against the client before a change to the store
    differs from the reader after it."""
    db, c, eid = store
    before = _view(find_train_runs(c, eid))
    c.log_metric(sqlite_runs(db, "s")["a"].info.run_id, "tokens", 2048, step=2048)
    assert _view(sqlite_runs(db, "s")) != before
    assert _view(sqlite_runs(db, "s")) == _view(find_train_runs(c, eid))


def test_status_rows_are_the_same_through_either_reader(store, monkeypatch) -> None:
    db, *_ = store
    via_sqlite = study_status("s", sqlite_uri(db))

    def unreadable(*_a, **_k):
        raise sqlite3.OperationalError("no such table: latest_metrics")  # a schema this reader does not know

    monkeypatch.setattr("orchestrator.track.sqlite_runs.sqlite_runs", unreadable)
    said: list[str] = []
    via_client = study_status("s", sqlite_uri(db), warn=said.append)  # falls back to MLflow's client
    assert via_sqlite == via_client
    assert said == [f"{db}: read through MLflow's client (OperationalError: no such table: latest_metrics)"]
    assert [(r["run_name"], r["status"], r["tokens"], r["val_ppl"]) for r in via_sqlite] == [
        ("b", "running", 256, None),
        ("a", "finished", 1024, 20.25),
    ]


def test_a_file_that_is_not_an_mlflow_store_raises_sqlite_error(tmp_path) -> None:
    db = tmp_path / "x.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(sqlite3.OperationalError, match="no such table: experiments"):
        sqlite_runs(db, "s")
