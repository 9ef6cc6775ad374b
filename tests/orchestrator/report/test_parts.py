"""The report's optional parts (report.parts) and the one read of the store they share.

A part is placed in the reading order after the section it names; building a report reads
MLflow once (report.query brings the experiment's tags and the tuning runs with the runs),
so no part opens a client of its own.
"""

from __future__ import annotations

import pytest

from orchestrator.plan.tuning import KIND as KIND_TUNE
from orchestrator.report import build
from orchestrator.report.parts import PARTS
from orchestrator.report.query import query_study
from orchestrator.report.sections import CORE, reading_order
from orchestrator.track.tracking import KIND_TAG, KIND_TRAIN, client_for, find_train_runs, tag
from tests.fixtures.synthetic import MAIN


def test_every_part_is_read_after_the_section_it_names():
    names = [name for name, _ in reading_order(PARTS)]
    assert len(names) == len(CORE) + len(PARTS) and len(set(names)) == len(names)
    for p in PARTS:
        assert names.index(p.after) < names.index(p.name), p.name


def test_parts_after_one_section_keep_their_order():
    class Fake:
        def __init__(self, name: str, after: str) -> None:
            self.name, self.after = name, after

        def build(self, given) -> None: ...

        def section(self, summary, tables) -> None: ...

    names = [n for n, _ in reading_order([Fake("b", "a"), Fake("a", "cost"), Fake("c", "cost")])]
    assert names[names.index("cost") + 1 : names.index("cost") + 4] == ["a", "b", "c"]


def test_a_part_after_no_section_is_refused():
    """Negative control: a part naming no section is not silently dropped."""

    class Lost:
        name, after = "lost", "no_such_section"

        def build(self, given) -> None: ...

        def section(self, summary, tables) -> None: ...

    with pytest.raises(ValueError, match="no_such_section"):
        reading_order([Lost()])


def test_a_report_reads_the_store_once(synthetic_store, tmp_path, monkeypatch):
    """build_report (not logged) queries the study once and opens no MLflow client read."""
    from mlflow.tracking import MlflowClient

    calls = []
    real = build.query_study
    monkeypatch.setattr(build, "query_study", lambda *a, **k: calls.append(a) or real(*a, **k))
    for read in ("get_experiment", "get_experiment_by_name", "search_runs", "get_metric_history"):
        monkeypatch.setattr(MlflowClient, read, lambda *a, _read=read, **k: pytest.fail(f"a report part read MLflow again: {_read}"))
    summary = build.build_report(MAIN.study, synthetic_store, tmp_path / "r", log_to_mlflow=False, n_boot=20)
    assert len(calls) == 1 and summary["study"] == MAIN.study


@pytest.mark.parametrize("store", ["sqlite", "file"])
def test_the_query_brings_experiment_tags_and_tuning_runs_as_the_client_sees_them(tmp_path, store, monkeypatch):
    """StudyData.experiment_tags and .tuning against the client's get_experiment and
    find_train_runs (the view the report read before), through the SQL path and the client
    path (a file store): a retried tuning point (same run_id) keeps its latest start, its
    loss the latest logged, and a tune run without a loss None."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}" if store == "sqlite" else (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a store the client path reads, no server needed
    client = client_for(uri)
    eid = client.create_experiment("q", tags={"qkstudy.tune": '{"grid": [0.001]}', "other": "x"})
    run = client.create_run(eid, tags={KIND_TAG: KIND_TRAIN, tag("variant"): "standard", tag("scale"): "s", tag("seed"): "0"})
    client.log_metric(run.info.run_id, "val/ppl", 10.0, step=100)
    for start, loss, lr in ((1000, 3.0, "0.001"), (2000, 2.5, "0.001"), (1500, None, "0.01")):
        point = "t-0.001" if lr == "0.001" else "t-0.01"
        t = {KIND_TAG: KIND_TUNE, tag("run_id"): point, tag("variant"): "standard", tag("scale"): "s", tag("seed"): "0"}
        r = client.create_run(eid, start_time=start, tags=t | {tag("status"): "finished"})
        client.log_param(r.info.run_id, "lr", lr)
        if loss is not None:
            client.log_metric(r.info.run_id, "final/val_loss", loss + 1, step=0)
            client.log_metric(r.info.run_id, "final/val_loss", loss, step=1)
    data = query_study("q", uri)
    assert data.experiment_tags == client.get_experiment(eid).tags
    want = list(find_train_runs(client, eid, KIND_TUNE).values())
    assert list(data.tuning["run_uuid"]) == [r.info.run_id for r in want]
    assert list(data.tuning["final_val_loss"]) == [r.data.metrics.get("final/val_loss") for r in want] == [2.5, None]
    assert list(data.runs["kind"]) == [KIND_TRAIN] and set(data.metrics["run_uuid"]) == {run.info.run_id}
