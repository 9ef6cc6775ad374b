"""The attention diagnostics a run logs, through real Ray Train workers and
real DeepSpeed engines on CPU: a fixed probe of 16 validation windows, and under ZeRO-3 (every
parameter partitioned over 2 workers, the differential lambdas gathered) the same numbers as
ZeRO-0 at the same seed and step. Before the fix the probe held 2 windows (this test fails
there) and the lambdas were read without a gather: in these runs DeepSpeed keeps parameters
under its persistence threshold (1e5 elements) gathered after the first forward, so they
happened to be whole, but a partitioned one raised (tests/model/test_diagnostics_zero3.py).
The runs ask for diagnostics at every 2nd evaluation of 2: only the last one measures them
(the cadence, ``eval.diagnostics_every_evals``), timed on their own (``time/diag_s``)."""

import math

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from model.diagnostics import NAMES, PROBE_WINDOWS
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.runner import run_runs
from tests.helpers import mlflow_store

pytestmark = pytest.mark.slow

TPS = 8 * 64  # tokens per optimizer step
BASE = {
    "corpus": {"source": "stdlib", "max_documents": 60},
    "tokenizer": {"vocab_size": 512},
    "scales": ["cpu-xs"],
    "variants": ["coupled_differential"],
    "reference": "coupled_differential",
    "budget": {"mode": "tokens", "tokens": 10 * TPS},
    "train": {"global_batch": 8, "seq_len": 64, "log_every_steps": 5},
    "eval": {"num_evals": 2, "max_windows": 4, "final_max_windows": 4, "diagnostics": True, "diagnostics_every_evals": 2},
}


def _diagnostics(tmp_path, stage: int) -> dict[str, list[tuple[int, float]]]:
    """Every attn/* metric history of one 2-worker run at ZeRO `stage`: {key: [(step, value)]},
    and its ``time/diag_s`` (under that key)."""
    name = f"diag-z{stage}"
    study = parse_spec({**BASE, "name": name, "resources": {"workers": 2, "zero_stage": stage}})
    uri = mlflow_store(tmp_path / name)
    res = run_runs(plan(study), name, uri, str(tmp_path / name / "ray"), console=Console(quiet=True))
    assert res.ok, res.reasons
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(name)
    assert exp is not None
    (run,) = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    diag_s = run.data.metrics.get("time/diag_s")
    return {k: [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, k)] for k in run.data.metrics if k.startswith("attn/")} | {
        "time/diag_s": [(0, diag_s)]
    }


def test_zero3_diagnostics_equal_zero0_on_a_16_window_probe(local_ray, tmp_path):
    z0, z3 = _diagnostics(tmp_path, 0), _diagnostics(tmp_path, 3)
    assert sorted(z3) == sorted(z0)
    for seconds in (z0.pop("time/diag_s")[0][1], z3.pop("time/diag_s")[0][1]):
        assert seconds is not None and seconds > 0
    for name in NAMES:
        assert {f"attn/{name}", f"attn/{name}/std", *(f"attn/{name}/layer_{i}" for i in range(3))} <= set(z0)
    assert [v for _, v in z0["attn/probe_windows"]] == [float(PROBE_WINDOWS)]
    assert [s for s, _ in z0["attn/entropy"]] == [10 * TPS]  # the 2nd (and last) of evaluations at 5 and 10 steps
    for key, points in z0.items():
        assert [s for s, _ in z3[key]] == [s for s, _ in points], key
        for (_, want), (_, got) in zip(points, z3[key]):
            assert math.isfinite(got), key
            # ZeRO-3 reduces gradients in another order than ZeRO-0: equal up to float rounding
            assert got == pytest.approx(want, rel=1e-3, abs=1e-5), (key, got, want)
    # not degenerate: 16 different windows give a spread, and the maps are neither uniform nor rank one
    (_, rank), (_, spread) = z0["attn/effective_rank"][-1], z0["attn/entropy/std"][-1]
    assert 1.5 < rank < 64 and spread > 0
