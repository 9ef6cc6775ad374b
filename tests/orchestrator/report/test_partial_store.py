"""A report on a partial store: every missing input is a sentence, the rest is still reported.

The store is a real MLflow SQLite file written with MlflowClient, holding what an older
version, a crashed writer and another tool following the documented names leave behind:
runs without the final pass, without the n_params / flops_per_token params, a run still
RUNNING, a run without the variant tag. Such a store once killed `qkstudy report` with a
matplotlib traceback ("Data cannot be log-scaled because all values are <= 0").
"""

from __future__ import annotations

import json
import math

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.report import ReportError, build_report
from tests.helpers import mlflow_store

TS = 1_700_000_000_000


def _log_run(client, eid, name, tags, params, final=True, terminate="FINISHED", tokens=100_000, shift=0.0):
    """A run with val/ppl and val/loss every 10k tokens (a falling curve), and the final pass if final."""
    rid = client.create_run(eid, run_name=name, tags=tags).info.run_id
    if params:
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()])
    rows = []
    for step in range(10_000, tokens + 1, 10_000):
        loss = 6.0 - 0.4 * math.log(step / 1e4) + shift
        rows += [Metric("val/ppl", math.exp(loss), TS + step, step), Metric("val/loss", loss, TS + step, step)]
    if final:
        rows += [Metric("final/val_ppl", math.exp(loss), TS + tokens, tokens), Metric("final/val_loss", loss, TS + tokens, tokens)]
    client.log_batch(rid, metrics=rows)
    if terminate:
        client.set_terminated(rid, status=terminate)
    return rid


@pytest.fixture(scope="module")
def partial_store(tmp_path_factory):
    uri = mlflow_store(tmp_path_factory.mktemp("partial"))
    client = MlflowClient(uri)
    eid = client.create_experiment("partial")
    base = {"study": "partial", "scale": "xs", "corpus": "text"}
    for seed in (0, 1):
        # Another tool: the documented tags and metrics, no qkstudy params at all.
        for extend in (1, 2):
            _log_run(
                client,
                eid,
                f"standard-s{seed}-x{extend}",
                base | {"variant": "standard", "seed": str(seed), "extend": str(extend), "status": "finished"},
                {},
                tokens=100_000 * extend,
            )
        _log_run(
            client,
            eid,
            f"coupled-s{seed}-x1",
            base | {"variant": "coupled", "seed": str(seed), "extend": "1", "status": "finished"},
            {},
            shift=-0.1,
        )
        # An older version: no final pass, no status tag (MLflow's FINISHED is read instead).
        _log_run(
            client, eid, f"uncoupled-s{seed}-x1", base | {"variant": "uncoupled_mlp", "seed": str(seed), "extend": "1"}, {}, final=False
        )
    # A crashed writer: still RUNNING, half a curve.
    _log_run(
        client,
        eid,
        "differential-s0-x1",
        base | {"variant": "differential", "seed": "0", "extend": "1", "status": "running"},
        {"n_params": 1000, "flops_per_token": 6000},
        final=False,
        terminate=None,
        tokens=50_000,
    )
    # Not a run of this study's design: no variant tag.
    _log_run(client, eid, "someone-elses-run", {"study": "partial"}, {}, final=True)
    # A study in which nothing can be placed.
    eid2 = client.create_experiment("untagged")
    _log_run(client, eid2, "loose-run", {}, {}, final=True)
    return uri


def test_partial_store_reports_what_it_can_and_says_what_is_missing(partial_store, tmp_path):
    summary = build_report("partial", partial_store, tmp_path / "r", log_to_mlflow=False, n_boot=20)
    md = (tmp_path / "r" / "report.md").read_text()
    gaps = {g["missing"]: g for g in summary["gaps"]}
    # which runs, what is missing, what it removes
    no_final = gaps["final/val_ppl (the full validation pass at the planned tokens)"]
    assert sorted(no_final["runs"]) == ["uncoupled-s0-x1", "uncoupled-s1-x1"]
    assert "2 runs (uncoupled-s0-x1, uncoupled-s1-x1) lack final/val_ppl" in md
    no_n = gaps["the n_params param (N, non-embedding parameters)"]
    assert "differential-s0-x1" not in no_n["runs"] and "coupled-s0-x1" in no_n["runs"]
    assert "lack the flops_per_token param: no FLOP ratio and no FLOPs axis" in md
    assert "1 run (someone-elses-run) lacks the variant or scale tag" in md
    # what could not be drawn, and why
    assert "ppl_vs_flops.png is not drawn: it needs finished runs with val/ppl points and the flops_per_token param" in md
    assert "ppl_vs_wallclock.png is not drawn" in md
    assert "ppl_vs_tokens.png" in summary["figures"] and "scaling.png" in summary["figures"]
    # the rest is reported: finals of standard and coupled, coupled's token ratio from standard's x1/x2
    s = summary["scales"][0]
    assert set(s["final_ppl"]) == {"standard", "coupled"}
    assert s["token_ratio"] is not None and s["token_ratio_display"] != "n/a"
    assert s["ratios"]["coupled"]["flop_ratio"]["reason"] == "flops_per_token missing"
    assert [r["run_name"] for r in summary["runs"]["incomplete"]] == ["differential-s0-x1", "uncoupled-s0-x1", "uncoupled-s1-x1"]
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["gaps"] == summary["gaps"]
    assert "## Missing inputs" in md and "N is shown as —" in md


def test_cli_exits_0_on_a_partial_store_and_2_when_nothing_can_be_reported(partial_store, tmp_path):
    ok = CliRunner().invoke(app, ["report", "partial", "--tracking-uri", partial_store, "--out", str(tmp_path / "ok"), "--no-log"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "ok" / "report.html").exists()
    bad = CliRunner().invoke(app, ["report", "untagged", "--tracking-uri", partial_store, "--out", str(tmp_path / "bad"), "--no-log"])
    assert bad.exit_code == 2
    assert "nothing to report" in bad.output and "variant and scale tags" in bad.output
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ReportError, match="nothing to report"):
        build_report("untagged", partial_store, tmp_path / "bad", log_to_mlflow=False)
