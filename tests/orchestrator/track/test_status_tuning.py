"""`status` shows each run's final-pass perplexity and lists the LR-tuning runs; `export` has a
tokens column and, on request, the tuning runs."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.report import export_study
from orchestrator.track.status import study_status, tuning_status
from orchestrator.track.tracking import KIND_TAG, tag
from tests.helpers import mlflow_store


@pytest.fixture()
def store(tmp_path):
    uri = mlflow_store(tmp_path)
    c = MlflowClient(uri)
    eid = c.create_experiment("s")

    def run(run_id, kind, lr, points, final=None):
        r = c.create_run(eid, run_name=f"{kind}-{run_id}", tags={KIND_TAG: kind, tag("run_id"): run_id, tag("status"): "finished"})
        c.log_param(r.info.run_id, "lr", lr)
        for tokens, ppl in points:
            c.log_metric(r.info.run_id, "val/ppl", ppl, step=tokens)
            c.log_metric(r.info.run_id, "tokens", tokens, step=tokens)
        if final is not None:
            c.log_metric(r.info.run_id, "final/val_ppl", final, step=points[-1][0])

    run("a", "train", "1e-3", [(512, 30.0), (1024, 20.0)], final=19.5)
    run("t1", "tune", "1e-3", [(256, 40.0)], final=39.0)
    run("t2", "tune", "3e-3", [(256, 45.0)])
    return uri


def test_status_rows_have_the_final_pass_perplexity_and_tuning_runs_are_listed(store):
    [row] = study_status("s", store)
    assert (row["run_id"], row["val_ppl"], row["final_ppl"]) == ("a", 20.0, 19.5)
    tune = tuning_status("s", store)
    assert [(r["run_id"], r["lr"], r["tokens"], r["final_ppl"]) for r in tune] == [("t1", "1e-3", 256, 39.0), ("t2", "3e-3", 256, None)]
    res = CliRunner().invoke(app, ["status", "s", "--tracking-uri", store])
    assert res.exit_code == 0, res.output
    assert "final ppl" in res.output and "19.50" in res.output and "2 LR-tuning runs" in res.output and "39.00" in res.output
    # negative control: --no-tuning lists the training runs only
    res = CliRunner().invoke(app, ["status", "s", "--tracking-uri", store, "--no-tuning"])
    assert "LR-tuning" not in res.output and "39.00" not in res.output
    doc = json.loads(CliRunner().invoke(app, ["status", "s", "--tracking-uri", store, "--json"]).output)
    assert [r["run_id"] for r in doc["tuning"]] == ["t1", "t2"] and doc["runs"][0]["final_ppl"] == 19.5


def test_export_has_tokens_and_includes_tuning_runs_on_request(store, tmp_path):
    table = pd.read_parquet(export_study("s", store, tmp_path / "train.parquet"))
    assert set(table["kind"]) == {"train"} and set(table["run_id"]) == {"a"}
    ppl = table[table["key"] == "val/ppl"].sort_values("tokens")
    assert list(ppl["tokens"]) == [512, 1024] and list(ppl["value"]) == [30.0, 20.0]
    res = CliRunner().invoke(app, ["export", "s", "--tracking-uri", store, "--out", str(tmp_path / "all.parquet"), "--tuning"])
    assert res.exit_code == 0, res.output
    both = pd.read_parquet(tmp_path / "all.parquet")
    assert set(both["run_id"]) == {"a", "t1", "t2"} and set(both[both["run_id"] == "t2"]["kind"]) == {"tune"}
