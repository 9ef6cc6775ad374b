"""LR tuning end to end: real Ray, DeepSpeed and MLflow on a tiny custom shape, a 2-point grid,
standard and differential; the chosen LR is the grid argmin of tuning val loss and the main
runs train at it; the report shows the table; a resubmit trains nothing."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

GRID = (0.0003, 0.01)
SPEC = f"""\
name: tune
corpus: {{source: stdlib, max_documents: 60}}
tokenizer: {{vocab_size: 512}}
scales: [{{name: tiny, n_layer: 1, d_model: 32, n_head: 2, seq_len: 64, global_batch: 8}}]
variants: [standard, differential]
budget: {{mode: tokens, tokens: 4096}}
train: {{log_every_steps: 1}}           # step 1 logs the LR of step 0: the peak (no warmup at 8 steps)
tune: {{lr: [{GRID[0]}, {GRID[1]}], tokens: 2048}}
eval: {{num_evals: 2, max_windows: 4, final_max_windows: 8}}
resources: {{workers: 1, cpus_per_worker: 1, zero_stage: 2}}
"""


def _qk(*args, cwd, env):
    exe = Path(sys.executable).with_name("qkstudy")
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _runs(c, exp_id, kind):
    return c.search_runs([exp_id], f"tags.`qkstudy.kind` = '{kind}'")


def test_tuned_study_trains_main_runs_at_the_grid_argmin(tmp_path):
    (tmp_path / "tune.yaml").write_text(SPEC)
    env = {**os.environ, "QKSTUDY_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    res = _qk("run", "tune.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    c = MlflowClient(f"sqlite:///{tmp_path / 'runs/tune/mlflow.db'}")
    exp_id = c.get_experiment_by_name("tune").experiment_id
    tuning, main = _runs(c, exp_id, "tune"), _runs(c, exp_id, "train")
    assert len(tuning) == 2 * len(GRID) and len(main) == 2
    loss: dict[str, dict[float, float]] = {}
    for r in tuning:
        assert r.data.tags["status"] == "finished" and r.info.run_name.startswith("tune-")
        loss.setdefault(r.data.tags["variant"], {})[float(r.data.params["lr"])] = r.data.metrics["final/val_loss"]
    for r in main:
        best = min(GRID, key=lambda g: loss[r.data.tags["variant"]][g])  # the grid argmin, computed here
        assert math.isclose(float(r.data.params["lr"]), best, rel_tol=1e-9)
        peak = max(m.value for m in c.get_metric_history(r.info.run_id, "lr"))
        assert math.isclose(peak, best, rel_tol=1e-6), (r.info.run_name, peak, best)

    out = tmp_path / "report"
    rep = _qk("report", "tune.yaml", "--out", str(out), cwd=tmp_path, env=env)
    assert rep.returncode == 0, rep.stderr[-3000:]
    md = (out / "report.md").read_text()
    assert "Learning-rate tuning" in md and "chosen_lr" in md
    assert f"lr {GRID[0]:g}" in md and f"lr {GRID[1]:g}" in md

    n_before = len(c.search_runs([exp_id]))
    again = _qk("run", "tune.yaml", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished" in again.stderr
    assert len(c.search_runs([exp_id])) == n_before + 0  # no new training record
    assert len(_runs(c, exp_id, "tune")) == len(tuning) and len(_runs(c, exp_id, "train")) == len(main)
