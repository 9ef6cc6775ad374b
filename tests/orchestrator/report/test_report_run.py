"""The study's one report run: found again and updated by each `report`, one for a per-corpus
study, older per-call runs reused; and the steps `report` shows while it works."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.report import build_report
from orchestrator.report.query import query_study
from orchestrator.report.report_run import REPORT_TAG, REVISION_TAG, UPDATED_TAG
from orchestrator.track.tracking import KIND_REPORT, KIND_TAG
from tests.helpers import mlflow_store
from tests.synthetic_study import SyntheticStudy

SMALL = dict(scales={"xs": 2e6}, seeds=(0, 1), extend=(2.0,), n_eval=6)


def _reports(uri: str, study: str) -> list:
    client = MlflowClient(uri)
    eid = client.get_experiment_by_name(study).experiment_id
    return client.search_runs([eid], f"tags.`{KIND_TAG}` = '{KIND_REPORT}'")


@pytest.fixture()
def store(tmp_path):
    return mlflow_store(tmp_path, SyntheticStudy(study="one-report", **SMALL))


def test_each_report_call_updates_the_studys_one_report_run(store, tmp_path):
    first = build_report("one-report", store, tmp_path / "a", n_boot=20)
    second = build_report("one-report", store, tmp_path / "b", n_boot=20, target="coupled", contrasts=[("coupled", "standard")])
    runs = _reports(store, "one-report")
    assert len(runs) == 1 and first["mlflow_report_run"] == second["mlflow_report_run"] == runs[0].info.run_id
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "report-one-report"
    assert run.data.tags[REVISION_TAG] == "2" and run.data.tags[REPORT_TAG] == "report-one-report" and UPDATED_TAG in run.data.tags
    logged = MlflowClient(store).download_artifacts(run.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(open(logged).read()) == json.loads((tmp_path / "b" / "summary.json").read_text())  # the latest report


def test_a_report_run_of_an_older_version_is_reused_and_a_corpus_report_is_its_own(store, tmp_path):
    client = MlflowClient(store)
    eid = client.get_experiment_by_name("one-report").experiment_id
    old = [client.create_run(eid, run_name="report-one-report", tags={KIND_TAG: KIND_REPORT}).info.run_id for _ in range(2)]
    for r in old:
        client.set_terminated(r, "FINISHED")
    summary = build_report("one-report", store, tmp_path / "a", n_boot=20)
    assert summary["mlflow_report_run"] == old[1]  # the newest, not a third
    assert len(_reports(store, "one-report")) == 2
    # negative control: a report of one corpus is another report, with its own run
    corpus = build_report("one-report", store, tmp_path / "c", n_boot=20, corpus="synthetic")
    assert corpus["mlflow_report_run"] not in old and len(_reports(store, "one-report")) == 3


def test_a_per_corpus_study_logs_index_and_corpora_into_one_run(tmp_path):
    uri = mlflow_store(tmp_path, *(SyntheticStudy(study="corpora", corpus=corpus, **SMALL) for corpus in ("code", "web")))
    summary = build_report("corpora", uri, tmp_path / "out", n_boot=20)
    runs = _reports(uri, "corpora")
    assert [r.info.run_id for r in runs] == [summary["mlflow_report_run"]]
    client = MlflowClient(uri)
    top = {a.path for a in client.list_artifacts(runs[0].info.run_id)}
    assert {"report.md", "summary.json", "code", "web"} <= top
    assert "code/report.md" in {a.path for a in client.list_artifacts(runs[0].info.run_id, "code")}


def test_report_says_each_step_as_it_starts(store, tmp_path):
    steps: list[str] = []
    build_report("one-report", store, tmp_path / "a", n_boot=20, progress=steps.append)
    assert [s.split()[0] for s in steps] == ["querying", "analysing", "drawing", "writing", "logging"]
    assert steps[1].endswith(" runs") and int(steps[1].split()[-2]) == len(query_study("one-report", store, with_metrics=False).runs)
    # in a log (not a terminal) the CLI prints a line per step with the seconds since it started
    res = CliRunner().invoke(app, ["report", "one-report", "--tracking-uri", store, "--out", str(tmp_path / "cli"), "--no-log"])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("[") and " s] " in line]
    assert [line.split("] ", 1)[1].split()[0] for line in lines] == ["querying", "analysing", "drawing", "writing"]
