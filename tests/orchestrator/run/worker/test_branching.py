"""Branch points and a branch's start (real MLflow in SQLite, a real LambdaLR): the history copy,
the LR at the branch step, the retained folders' lifetime, the per-rank manifests of a branch
point (two ranks as threads) and a branch's fallback from a torn one (``run.worker.branching``)."""

import threading
from pathlib import Path

import pytest
import torch
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.checkpoint import STATE_FILE, manifest_name
from orchestrator.run.worker.branching import (
    BRANCH_POINT_KEY,
    BranchPointError,
    branch_point_dir,
    copy_trunk_history,
    release_branch_points,
    restore_branch_point,
    save_branch_point,
    set_lr_at,
)
from orchestrator.run.worker.optim import lr_multiplier
from orchestrator.track.tracking import create_run, ensure_experiment
from tests.helpers import mlflow_store

TPS = 8 * 64
SPEC = {
    "name": "br",
    "scales": ["cpu-xs"],
    "variants": ["standard"],
    "tokenizer": {"vocab_size": 512},
    "budget": {"mode": "tokens", "tokens": 20 * TPS},
    "extend": [2],
    "protocol": "branches",
    "train": {"global_batch": 8, "seq_len": 64, "schedule": "wsd"},
}


@pytest.fixture(scope="module")
def family():
    return plan(parse_spec(SPEC))  # [trunk x2 (40 steps), branch x1 (20 steps, from 16)]


def test_history_copy_takes_the_trunk_up_to_the_branch_point_once_and_finishes_a_partial_copy(tmp_path, family):
    trunk, branch = family
    client = MlflowClient(mlflow_store(tmp_path))
    exp = ensure_experiment(client, "br")
    t_id, b_id = create_run(client, exp, trunk), create_run(client, exp, branch)
    points = [Metric(k, float(s * 10 + i), 1000 + s, s * TPS) for s in range(1, 41) for i, k in enumerate(("train/loss", "lr"))]
    points.append(Metric("system/cpu_utilization_percentage", 50.0, 1000, 3))  # step = a sample count
    client.log_batch(t_id, metrics=points)
    client.log_batch(b_id, metrics=[Metric("train/loss", 10.0 * 3, 1003, 3 * TPS)])  # a copy cut short
    assert copy_trunk_history(client, t_id, b_id, 16 * TPS) == 2 * 16 - 1
    assert copy_trunk_history(client, t_id, b_id, 16 * TPS) == 0  # nothing twice
    for i, key in enumerate(("train/loss", "lr")):
        got = [(m.step, m.value) for m in client.get_metric_history(b_id, key)]
        assert sorted(got) == [(s * TPS, float(s * 10 + i)) for s in range(1, 17)]
    assert not client.get_metric_history(b_id, "system/cpu_utilization_percentage")


def test_a_restored_scheduler_applies_the_branchs_own_lr_at_the_branch_step(family):
    trunk, branch = family
    p = torch.nn.Parameter(torch.zeros(1))

    def sched(run):
        opt = torch.optim.AdamW([p], lr=run.train.lr)
        t = run.train
        return torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_multiplier(s, run.steps, t.warmup_steps, "wsd", t.min_lr_ratio, t.decay_fraction)
        )

    t_sched = sched(trunk)
    for _ in range(16):
        t_sched.optimizer.step()
        t_sched.step()
    b_sched = sched(branch)
    b_sched.load_state_dict(t_sched.state_dict())
    b_sched.optimizer.load_state_dict(t_sched.optimizer.state_dict())
    assert b_sched.get_last_lr()[0] == trunk.train.lr  # the trunk's constant LR: wrong for the branch
    set_lr_at(b_sched, 16)
    want = [branch.train.lr * lr_multiplier(s, 20, branch.train.warmup_steps, "wsd", 0.1, 0.2) for s in range(16, 20)]
    got = []
    for _ in range(4):
        got.append(b_sched.optimizer.param_groups[0]["lr"])
        assert b_sched.get_last_lr()[0] == got[-1]
        b_sched.optimizer.step()
        b_sched.step()
    assert got == pytest.approx(want, rel=1e-12) and got[-1] == pytest.approx(0.1 * branch.train.lr)


class _Engine:
    """Writes one file per save, like DeepSpeed's save_checkpoint into its folder."""

    def save_checkpoint(self, d, tag):
        Path(d).mkdir(parents=True, exist_ok=True)
        torch.save(torch.ones(2), Path(d) / f"{tag}.pt")


def test_branch_points_are_whole_or_absent_and_go_when_the_family_finished(tmp_path, family):
    trunk, branch = family
    final = branch_point_dir(str(tmp_path), trunk.run_id, 16)
    final.parent.mkdir(parents=True)
    final.with_name(final.name + ".partial").mkdir()  # left by a trunk killed mid-save
    save_branch_point(_Engine(), final, {"step": 16}, 0, 1, lambda: None)
    assert (final / "qkstudy_state.json").is_file() and (final / "ckpt.pt").is_file()
    assert not final.with_name(final.name + ".partial").exists()
    done, failed = {"status": "finished"}, {"status": "failed"}
    assert release_branch_points([trunk, branch], {trunk.run_id: done, branch.run_id: failed}, str(tmp_path)) == []
    assert final.is_dir()  # a branch still needs it
    assert release_branch_points([branch], {branch.run_id: done}, str(tmp_path)) == [trunk.run_id]
    assert not final.parent.exists()
    with pytest.raises(BranchPointError, match="filesystem path"):
        branch_point_dir("s3://bucket/study", trunk.run_id, 16)


class _RankEngine:
    """What DeepSpeed's save writes per rank (rank 0: model states and ``latest``; each rank its
    optimizer partition, holding ``step``); ``load`` reads them back as the weights-only loader."""

    def __init__(self, rank: int = 0, step: int = 0) -> None:
        self.rank, self.step, self.loaded, self.rebuilt = rank, step, None, 0

    def save_checkpoint(self, d, tag):
        (Path(d) / tag).mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            torch.save(torch.full((64,), float(self.step)), Path(d) / tag / "mp_rank_00_model_states.pt")
            (Path(d) / "latest").write_text(tag)
        torch.save(torch.full((64,), float(self.rank)), Path(d) / tag / f"zero_pp_rank_{self.rank}_optim_states.pt")

    def load(self, d):
        self.loaded = float(torch.load(Path(d) / "ckpt" / "mp_rank_00_model_states.pt", weights_only=True)[0])

    def rebuild(self):
        self.loaded, self.rebuilt = None, self.rebuilt + 1


def _save_point(storage: Path, trunk, step: int, world: int = 1) -> Path:
    """The trunk's branch point at ``step``, saved by ``world`` ranks (threads) as the worker does."""
    final = branch_point_dir(str(storage), trunk.run_id, step)
    state = {"step": step, "wall_s": 1.5 * step, "evals": 1, "mlflow_run_id": "trunk-mlflow", "run_id": trunk.run_id, "data_hash": "h"}
    barrier = threading.Barrier(world)
    threads = [
        threading.Thread(target=save_branch_point, args=(_RankEngine(r, step), final, state, r, world, barrier.wait)) for r in range(world)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return final


def _sched(run):
    p = torch.nn.Parameter(torch.zeros(1))
    t = run.train
    return torch.optim.lr_scheduler.LambdaLR(
        torch.optim.AdamW([p], lr=t.lr), lambda s: lr_multiplier(s, run.steps, t.warmup_steps, "wsd", t.min_lr_ratio, t.decay_fraction)
    )


def _start(storage: Path, branch, eng: _RankEngine, log: list[str], **kw):
    sched = _sched(branch)
    state = restore_branch_point(
        eng.load, sched, branch, str(storage), data_hash="h", rank=0, any_rank=lambda f: f, log=log.append, rebuild=eng.rebuild, **kw
    )
    return state, sched


def test_a_branch_point_holds_every_ranks_share_and_manifest_and_a_branch_starts_from_it_verified(tmp_path, family):
    trunk, branch = family
    final = _save_point(tmp_path, trunk, 16, world=2)
    names = sorted(str(p.relative_to(final)) for p in final.rglob("*") if p.is_file())
    assert names == sorted(
        [
            "ckpt/mp_rank_00_model_states.pt",
            "ckpt/zero_pp_rank_0_optim_states.pt",
            "ckpt/zero_pp_rank_1_optim_states.pt",
            "latest",
            STATE_FILE,
            manifest_name(0),
            manifest_name(1),
        ]
    )
    assert not final.with_name(final.name + ".partial").exists()
    eng, log = _RankEngine(), []
    state, sched = _start(tmp_path, branch, eng, log)
    assert eng.loaded == 16.0 and log == []
    assert state == {
        "step": 16,
        "wall_s": 24.0,
        "evals": 16 // branch.eval_every_steps,
        "branched": True,
        "trunk_mlflow_run_id": "trunk-mlflow",
        BRANCH_POINT_KEY: "verified",
    }
    assert sched.last_epoch == 16 and sched.get_last_lr()[0] == pytest.approx(
        branch.train.lr * lr_multiplier(16, 20, branch.train.warmup_steps, "wsd", 0.1, 0.2)
    )


def test_a_torn_branch_point_falls_back_to_an_earlier_whole_one_and_says_so(tmp_path, family):
    trunk, branch = family
    _save_point(tmp_path, trunk, 8, world=2)
    torn = _save_point(tmp_path, trunk, 16, world=2)
    f = torn / "ckpt" / "mp_rank_00_model_states.pt"
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[: size // 2])
    eng, log = _RankEngine(), []
    state, sched = _start(tmp_path, branch, eng, log)
    assert eng.loaded == 8.0 and state["step"] == 8 and state["branched"] and state["wall_s"] == 12.0
    note = (
        f"torn: step-00000016: ckpt/mp_rank_00_model_states.pt has {size // 2} bytes, {size} were saved (truncated "
        f"or torn); restarted from step-00000008 (step 8), training the trunk's steps 8-16 again before the cooldown"
    )
    assert state[BRANCH_POINT_KEY] == note and log[-1] == note
    assert any(line.startswith("rank 0: branch point ") and "step-00000016 cannot be used" in line for line in log)
    assert sched.last_epoch == 8 and sched.get_last_lr()[0] == pytest.approx(branch.train.lr)  # constant, as the trunk's


def test_with_no_whole_branch_point_at_or_before_the_step_the_branch_restarts_from_step_0(tmp_path, family):
    trunk, branch = family
    torn = _save_point(tmp_path, trunk, 16, world=2)
    later = _save_point(tmp_path, trunk, 24)  # after the branch step: never a start for it
    (torn / manifest_name(1)).unlink()  # rank 1's share never finished
    eng, log = _RankEngine(), []
    state, _ = _start(tmp_path, branch, eng, log)
    assert state == {
        "step": 0,
        "wall_s": 0.0,
        "evals": 0,
        BRANCH_POINT_KEY: (
            f"torn: step-00000016: rank(s) [1] of 2 never finished their share (no manifest); no whole branch point of trunk "
            f"{trunk.run_id} at or before step 16: restarted from step 0"
        ),
    }
    assert eng.loaded is None and eng.rebuilt == 0 and log[-1] == state[BRANCH_POINT_KEY] and later.is_dir()


def test_a_whole_point_that_fails_to_load_falls_back_with_a_clean_engine(tmp_path, family):
    trunk, branch = family
    _save_point(tmp_path, trunk, 16)
    eng, log = _RankEngine(), []

    def load(d):
        eng.loaded = -1.0  # part of it got in
        raise RuntimeError("bad zero partition")

    eng.load = load
    state, _ = _start(tmp_path, branch, eng, log)
    assert state["step"] == 0 and "step-00000016: load failed: RuntimeError: bad zero partition" in state[BRANCH_POINT_KEY]
    assert eng.rebuilt == 1 and eng.loaded is None


def test_a_point_of_other_data_a_legacy_point_and_a_missing_point(tmp_path, family):
    trunk, branch = family
    legacy = _save_point(tmp_path, trunk, 16)
    for m in legacy.glob("qkstudy_manifest.rank*.json"):
        m.unlink()  # saved before manifests existed
    eng, log = _RankEngine(), []
    state, _ = _start(tmp_path, branch, eng, log)
    assert state["step"] == 16 and state[BRANCH_POINT_KEY] == "unverified (saved before manifests)"
    sched = _sched(branch)
    state = restore_branch_point(
        eng.load, sched, branch, str(tmp_path), data_hash="other", rank=0, any_rank=lambda f: f, log=log.append, rebuild=eng.rebuild
    )
    assert state["step"] == 0 and "saved on other data (h, this run's is other)" in state[BRANCH_POINT_KEY]
    with pytest.raises(BranchPointError, match="which does not exist: did the trunk fail"):
        _start(tmp_path / "elsewhere", branch, eng, log)
