"""protocol: branches end to end through `qkstudy run`: real Ray, DeepSpeed and MLflow (SQLite).

One study (cpu-xs, x1 = 20 steps, extend [1.5, 2]): the trunk (x2, 40 steps) is killed after
18 steps on its first attempt and resumes; each branch starts from the trunk's retained
checkpoint at its branch point. Checked: every branch's curve starts at the first step, each
branch's logged ``lr`` is its own WSD schedule, the x1 branch is the trunk up to its branch
point (copied history, and its first own step reproduces the trunk's loss: the checkpoint
restored exactly), branch points are gone at the end, the report reads the branches as the
reference's extend runs, and a re-run trains nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.run.worker.optim import lr_multiplier
from tests.helpers import TINY_SPEC, TPS, driver_env, finish_driver, plan_json, qk, reap_driver, start_driver, study_runs, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.stack]

SPEC = {
    "variants": ["standard", "coupled"],
    "extend": [1.5, 2],
    "protocol": "branches",
    "train": {**TINY_SPEC["train"], "schedule": "wsd"},
    "resources": {"workers": 1, "cpus_per_worker": 1, "zero_stage": 2},
}


def _hist(c, mlflow_id: str, key: str) -> dict[int, float]:
    points = c.get_metric_history(mlflow_id, key)
    assert len(points) == len({m.step for m in points}), f"{key}: a step logged twice"
    return {m.step: m.value for m in points}


def test_branched_study_trains_trunk_and_cooldowns_resumes_and_keeps_nothing(tmp_path):
    spec = write_spec(tmp_path, "branched", **SPEC)
    p = start_driver(spec, driver_env(QKSTUDY_TEST_KILL_AT_STEP="18"))
    try:
        err = finish_driver(p)
    finally:
        reap_driver(p)
    assert p.returncode == 0, err[-3000:]
    plan = {r["run_id"]: r for r in plan_json(spec)}
    c, runs = study_runs(tmp_path, "branched")
    assert sorted(runs) == sorted(plan)
    by_extend = {float(r.data.tags["qkstudy.extend"]): r for r in runs.values() if r.data.tags["qkstudy.variant"] == "standard"}
    trunk = by_extend[2.0]
    assert trunk.data.tags["qkstudy.restarts"] == "1"  # the kill landed in the trunk, which resumed
    for e, steps, b in ((1.0, 20, 16), (1.5, 30, 24), (2.0, 40, 32)):
        r = by_extend[e]
        assert r.data.tags["qkstudy.status"] == "finished" and r.data.tags["qkstudy.branch_step"] == str(b)
        assert r.data.tags["qkstudy.trunk"] == trunk.data.tags["qkstudy.run_id"]
        if r is not trunk:  # a branch's start at its branch point is no restart
            assert r.data.tags["qkstudy.branched_at_tokens"] == str(b * TPS) and "qkstudy.restarts" not in r.data.tags
        loss = _hist(c, r.info.run_id, "train/loss")
        assert sorted(loss) == [TPS * i for i in range(1, steps + 1)]  # from the first step, each once
        lr, peak = _hist(c, r.info.run_id, "lr"), float(r.data.params["lr"])
        for tokens, value in lr.items():  # the point at tokens k x TPS is 0-based step k - 1
            want = peak * lr_multiplier(tokens // TPS - 1, steps, 1, "wsd", 0.1, 0.2)
            assert value == pytest.approx(want, rel=1e-9), (e, tokens)
        assert len(_hist(c, r.info.run_id, "final/val_loss")) == 1
    x1, trunk_loss = by_extend[1.0], _hist(c, trunk.info.run_id, "train/loss")
    for key in ("train/loss", "lr", "val/loss", "tokens"):
        theirs, mine = _hist(c, trunk.info.run_id, key), _hist(c, x1.info.run_id, key)
        assert {s: v for s, v in mine.items() if s <= 16 * TPS} == {s: v for s, v in theirs.items() if s <= 16 * TPS}
    x1_loss = _hist(c, x1.info.run_id, "train/loss")
    # step 17's loss is the forward at the branch point's weights: the same as the trunk's
    assert x1_loss[17 * TPS] == pytest.approx(trunk_loss[17 * TPS], rel=1e-5)
    assert x1_loss[18 * TPS] != trunk_loss[18 * TPS]  # then the cooldown's own updates
    points = Path(tmp_path / "runs" / "branched" / "ray" / "branch_points")
    assert not points.exists() or not any(points.iterdir()), list(points.rglob("*"))[:5]
    rep = qk("report", spec.name, "--out", str(tmp_path / "report"), "--json", cwd=spec.parent, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    ratio = json.loads(rep.stdout)[0]["ratios"]["coupled"]
    assert ratio["ref_extends"] == [1.0, 1.5, 2.0], ratio  # the branches stand for the extend runs
    again = start_driver(spec, driver_env())
    try:
        err2 = finish_driver(again, 300)
    finally:
        reap_driver(again)
    assert again.returncode == 0 and "4 run(s) already finished in MLflow: skipped (Ray not started)" in err2, err2[-2000:]
    print(
        f"\n[branches] trunk 40 steps (killed at 18, restarts 1), branches x1 from 16, x1.5 from 24; "
        f"x1 final/val_loss {x1.data.metrics['final/val_loss']:.4f}, trunk {trunk.data.metrics['final/val_loss']:.4f}; "
        f"coupled token ratio {ratio['token_ratio']['display']}"
    )
