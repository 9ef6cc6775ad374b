"""A torn branch point is never a branch's start, end to end: a real branched study (`qkstudy
run`, real Ray Train, two DeepSpeed ZeRO-2 workers, MLflow on SQLite; x1 = 10 steps, extend
[1.5, 2]: the trunk (x2, 20 steps) keeps branch points at steps 8 and 12). Its workers die
after 13 trunk steps (no retries: the study fails), both branch points are whole with both
ranks' manifests, the step-12 one (the x1.5 branch's) gets its model-state file cut in half,
and a re-run finishes every run: the x1 branch starts verified at step 8; the x1.5 branch
finds step 12 torn, falls back to the whole step-8 point, trains the trunk's steps 8-12 again
(its own LR is the trunk's there) and then its cooldown, saying so in the worker log and its
``branch_point`` tag, with every step in MLflow exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.run.worker.optim import lr_multiplier
from tests.helpers import (
    TINY_SPEC,
    TPS,
    assert_every_step_once,
    driver_env,
    finish_driver,
    history,
    reap_driver,
    sqlite_client,
    start_driver,
    steps,
    tiny_spec,
    train_runs,
)

pytestmark = [pytest.mark.slow, pytest.mark.stack]

KILL_AT = 13  # trunk steps done when its workers die: both branch points saved, the run unfinished


def _drive(spec: Path, env: dict[str, str], *args: str):
    p = start_driver(spec, env, *args)
    try:
        return p, finish_driver(p)
    finally:
        reap_driver(p)


def test_a_torn_branch_point_falls_back_to_the_trunks_earlier_one_and_says_so(tmp_path):
    spec = tmp_path / "tornbp.yaml"
    spec.write_text(
        yaml.safe_dump(
            tiny_spec(
                "tornbp",
                budget={"mode": "tokens", "tokens": 10 * TPS},
                extend=[1.5, 2],
                protocol="branches",
                train={**TINY_SPEC["train"], "schedule": "wsd"},
                resources={"workers": 2, "cpus_per_worker": 1, "zero_stage": 2, "max_retries": 0},
            )
        )
    )
    first, err1 = _drive(spec, driver_env(QKSTUDY_TEST_KILL_AT_STEP=str(KILL_AT)))
    assert first.returncode == 1, err1[-3000:]  # the trunk's workers died
    c = sqlite_client(tmp_path, "tornbp")
    (trunk_id,) = [k for k, r in train_runs(c, "tornbp").items() if r.data.tags.get("qkstudy.branch_step") == "16"]
    points = tmp_path / "runs/tornbp/ray/branch_points" / trunk_id
    assert sorted(p.name for p in points.iterdir()) == ["step-00000008", "step-00000012"]
    for d in points.iterdir():  # every rank's share has its manifest
        assert sorted(p.name for p in d.glob("qkstudy_manifest.rank*.json")) == [
            "qkstudy_manifest.rank0.json",
            "qkstudy_manifest.rank1.json",
        ]
    victim = points / "step-00000012" / "ckpt" / "mp_rank_00_model_states.pt"
    size = victim.stat().st_size
    victim.write_bytes(victim.read_bytes()[: size // 2])

    second, err = _drive(spec, driver_env(), "-v")  # -v: the workers' log lines
    assert second.returncode == 0, err[-3000:]
    said = (
        f"torn: step-00000012: ckpt/mp_rank_00_model_states.pt has {size // 2} bytes, {size} were saved (truncated "
        f"or torn); restarted from step-00000008 (step 8), training the trunk's steps 8-12 again before the cooldown"
    )
    flat = " ".join(err.split())
    assert said in flat, flat[-3000:]
    runs = {float(r.data.tags["qkstudy.extend"]): r for r in train_runs(c, "tornbp").values()}
    trunk, x1, x15 = runs[2.0], runs[1.0], runs[1.5]
    assert x1.data.tags["qkstudy.branch_point"] == "verified" and x1.data.tags["qkstudy.branched_at_tokens"] == str(8 * TPS)
    assert x15.data.tags["qkstudy.branch_point"] == said and x15.data.tags["qkstudy.branched_at_tokens"] == str(8 * TPS)
    for r, n in ((trunk, 20), (x1, 10), (x15, 15)):
        assert r.data.tags["qkstudy.status"] == "finished" and r.data.tags.get("qkstudy.restarts") == ("1" if r is trunk else None)
        assert_every_step_once(steps(c, r.info.run_id), n)  # copied from the trunk, then its own: none twice
        for tokens, value in history(c, r.info.run_id, "lr"):  # its own WSD schedule at every step
            want = float(r.data.params["lr"]) * lr_multiplier(tokens // TPS - 1, n, 0, "wsd", 0.1, 0.2)
            assert value == pytest.approx(want, rel=1e-9), (n, tokens)
    trunk_loss, x15_loss = (dict(history(c, r.info.run_id, "train/loss")) for r in (trunk, x15))
    assert {s: v for s, v in x15_loss.items() if s <= 8 * TPS} == {s: v for s, v in trunk_loss.items() if s <= 8 * TPS}
    # step 9 is the forward at the step-8 point's weights on the trunk's batch: restored exactly
    assert x15_loss[9 * TPS] == pytest.approx(trunk_loss[9 * TPS], rel=1e-5)
    assert not points.exists() or not any(points.iterdir())  # released once the family finished
    print(
        f"\n[torn branch point] step 12 cut to {size // 2} of {size} bytes: x1.5 restarted from step 8 "
        f"(4 trunk steps trained again); x1 verified at step 8; x1.5 final/val_loss "
        f"{x15.data.metrics['final/val_loss']:.4f}"
    )
