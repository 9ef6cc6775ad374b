"""A damaged latest checkpoint is skipped for the one before it, end to end: a real study
(`qkstudy run`, real Ray Train, two DeepSpeed ZeRO-2 workers, MLflow on SQLite) checkpoints
at steps 10, 20 and 30, its workers die at step 35 (no retries: the run fails), the latest
checkpoint's model-state file is cut in half, and a re-run resumes from step 20, saying so in
its log and in the run's ``resume_fallback`` tag, with every step in MLflow exactly once.

Prints what it measured (steps trained again, points lost or repeated, seconds to recover)
with `-s`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.helpers import (
    TINY_SPEC,
    TPS,
    assert_every_step_once,
    driver_env,
    finish_driver,
    plan_json,
    reap_driver,
    start_driver,
    steps,
    study_runs,
    write_spec,
)

pytestmark = [pytest.mark.slow, pytest.mark.stack]

STEPS, KILL_AT = 60, 35


def _checkpoints(storage: Path) -> dict[int, Path]:
    """{step: directory} of the checkpoints Ray Train kept for a run."""
    out = {}
    for d in storage.glob("checkpoint_*"):
        state = d / "qkstudy_state.json"
        if state.is_file():
            out[json.loads(state.read_text())["step"]] = d
    return out


def _latest_registered(storage: Path, kept: dict[int, Path]) -> int:
    """Step of the checkpoint Ray Train's controller registered last (its snapshot's
    ``latest_checkpoint_result``): the one a restarted run loads first."""
    (snap,) = storage.rglob("checkpoint_manager_snapshot.json")
    name = json.loads(snap.read_text())["latest_checkpoint_result"]["checkpoint_dir_name"]
    (step,) = [s for s, d in kept.items() if d.name == name]
    return step


def test_truncated_latest_checkpoint_resumes_from_the_previous_one_and_says_so(tmp_path):
    spec = write_spec(
        tmp_path,
        "torn",
        budget={"mode": "tokens", "tokens": STEPS * TPS},
        eval={**TINY_SPEC["eval"], "num_evals": STEPS // 10},
        resources={"workers": 2, "cpus_per_worker": 1, "zero_stage": 2, "max_retries": 0},
    )
    (run,) = plan_json(spec)
    first = start_driver(spec, driver_env(QKSTUDY_TEST_KILL_AT_STEP=str(KILL_AT)))
    try:
        err1 = finish_driver(first)
    finally:
        reap_driver(first)
    assert first.returncode == 1, err1[-3000:]  # the run failed: its workers died
    c, runs = study_runs(tmp_path, "torn")
    mlflow_id = runs[run["run_id"]].info.run_id
    logged_before = steps(c, mlflow_id)
    # points reach MLflow at each evaluation's flush: 31-35 died queued in the worker
    assert logged_before == [TPS * i for i in range(1, 31)], logged_before
    storage = tmp_path / "runs/torn/ray" / run["run_id"]
    kept = _checkpoints(storage)
    # num_to_keep=2 registers the latest and one to fall back to (an evicted one's files may
    # outlive a worker killed before Ray deleted them; it is no longer a candidate). Ray Train
    # registers a reported checkpoint at its controller's next poll: the step-30 one may not be
    # registered yet when the workers die at step 35 (on a loaded machine), so the latest is
    # what the controller's snapshot says, 30 or 20, and the fallback is the one before it.
    latest = _latest_registered(storage, kept)
    before = latest - 10
    assert latest in (20, 30) and {before, latest} <= set(kept), (latest, kept)
    for d in kept.values():  # every rank left its manifest
        assert sorted(p.name for p in d.glob("qkstudy_manifest.rank*.json")) == [
            "qkstudy_manifest.rank0.json",
            "qkstudy_manifest.rank1.json",
        ]
    victim = kept[latest] / "ckpt" / "mp_rank_00_model_states.pt"
    size = victim.stat().st_size
    victim.write_bytes(victim.read_bytes()[: size // 2])

    t0 = time.time()
    second = start_driver(spec, driver_env(), "-v")  # -v: the workers' log lines
    try:
        err = finish_driver(second)
    finally:
        reap_driver(second)
    assert second.returncode == 0, err[-3000:]
    flat = " ".join(err.split())
    said = (
        f"skipped corrupt checkpoint(s): {kept[latest].name} (step {latest}): ckpt/mp_rank_00_model_states.pt has "
        f"{size // 2} bytes, {size} were saved (truncated or torn); resumed from {kept[before].name} (step {before})"
    )
    assert said in flat, flat[-3000:]
    c, runs = study_runs(tmp_path, "torn")
    r = runs[run["run_id"]]
    assert r.info.run_id == mlflow_id and r.data.tags["qkstudy.status"] == "finished" and r.info.status == "FINISHED"
    assert r.data.tags["qkstudy.resume_fallback"] == said
    assert r.data.tags["qkstudy.resumed_from_tokens"] == str(before * TPS) and r.data.tags["qkstudy.restarts"] == "1"
    assert_every_step_once(steps(c, mlflow_id), STEPS)
    assert len(c.get_metric_history(mlflow_id, "final/val_loss")) == 1
    assert steps(c, mlflow_id, "val/loss") == [TPS * i for i in range(10, STEPS + 1, 10)]
    first_new = min(m.timestamp for m in c.get_metric_history(mlflow_id, "train/loss") if m.step > 30 * TPS)
    print(
        f"\n[torn checkpoint] latest (step {latest}) cut to {size // 2} of {size} bytes; resumed from step {before}: "
        f"{KILL_AT - before} steps trained again ({30 - before} of them already in MLflow), 0 logged twice, 0 lost; first new "
        f"point {first_new / 1000 - t0:.1f} s after the re-run started"
    )
