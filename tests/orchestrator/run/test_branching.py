"""Branch points and a branch's start (real MLflow in SQLite, a real LambdaLR): the history copy,
the LR at the branch step, the retained folders' lifetime."""

from pathlib import Path

import pytest
import torch
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.branching import (
    BranchPointError,
    branch_point_dir,
    copy_trunk_history,
    release_branch_points,
    save_branch_point,
    set_lr_at,
)
from orchestrator.run.optim import lr_multiplier
from orchestrator.track.tracking import create_run, ensure_experiment

TPS = 8 * 64
SPEC = {"name": "br", "scales": ["cpu-xs"], "variants": ["standard"], "tokenizer": {"vocab_size": 512},
        "budget": {"mode": "tokens", "tokens": 20 * TPS}, "extend": [2], "protocol": "branches",
        "train": {"global_batch": 8, "seq_len": 64, "schedule": "wsd"}}


@pytest.fixture(scope="module")
def family():
    return plan(parse_spec(SPEC))  # [trunk x2 (40 steps), branch x1 (20 steps, from 16)]


def test_history_copy_takes_the_trunk_up_to_the_branch_point_once_and_finishes_a_partial_copy(tmp_path, family):
    trunk, branch = family
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
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
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, run.steps, t.warmup_steps, "wsd",
                                                                                t.min_lr_ratio, t.decay_fraction))

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
    save_branch_point(_Engine(), final, {"step": 16}, 0, lambda: None)
    assert (final / "qkstudy_state.json").is_file() and (final / "ckpt.pt").is_file()
    assert not final.with_name(final.name + ".partial").exists()
    done, failed = {"status": "finished"}, {"status": "failed"}
    assert release_branch_points([trunk, branch], {trunk.run_id: done, branch.run_id: failed}, str(tmp_path)) == []
    assert final.is_dir()  # a branch still needs it
    assert release_branch_points([branch], {branch.run_id: done}, str(tmp_path)) == [trunk.run_id]
    assert not final.parent.exists()
    with pytest.raises(BranchPointError, match="filesystem path"):
        branch_point_dir("s3://bucket/study", trunk.run_id, 16)
