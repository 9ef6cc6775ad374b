"""Branch points of ``protocol: branches``: the trunk's retained checkpoints and a branch's start.

Why: a branch (``RunSpec.trunk``, ``branch_step`` = b) is the trunk's run up to step b, then
its own cooldown (``orchestrator.plan.branch_runs``). Ray Train's checkpoint manager keeps
only a pack's latest checkpoints (``num_to_keep``), so the trunk saves, after each of its
``branch_points``, a copy of its engine checkpoint to ``<storage>/branch_points/<trunk
run_id>/step-<b>`` that Ray never prunes (every rank writes its shard into a ``.partial``
folder, rank 0 renames it once all have: a reader never sees half a checkpoint). A branch
without a checkpoint of its own restores that folder weights-only (``run.checkpoint``), takes
the LR of step b from its own schedule (the trunk's scheduler state holds the trunk's), and
copies the trunk's MLflow history up to b x tokens_per_step into its own run, so every
branch's curve starts at token 0. The folders of a trunk are deleted once every run of its
family finished (``release_branch_points``, called when the family's pack ends).

Branch points live on a filesystem path (the study's ``storage_path``, shared by the
workers of a multi-node cluster); a URI storage (``s3://``) is refused with a clear error.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.plan.planner import RunSpec
from orchestrator.run.worker import CKPT_TAG, STATE_FILE

BRANCH_DIR = "branch_points"


class BranchPointError(RuntimeError):
    """A branch's start checkpoint is missing (its trunk failed or never reached the step)."""


def trunk_dir(storage_path: str, trunk_run_id: str) -> Path:
    """Folder of one trunk's branch points. Raises BranchPointError for a URI storage path."""
    if "://" in storage_path:
        raise BranchPointError(f"protocol: branches keeps branch points on a filesystem path; storage_path "
                               f"{storage_path!r} is a URI (use a shared folder)")
    return Path(storage_path) / BRANCH_DIR / trunk_run_id


def branch_point_dir(storage_path: str, trunk_run_id: str, step: int) -> Path:
    """Folder of the trunk's checkpoint after ``step`` optimizer steps."""
    return trunk_dir(storage_path, trunk_run_id) / f"step-{step:08d}"


def save_branch_point(engine: Any, final: Path, state: dict[str, Any], rank: int, barrier: Callable[[], object]) -> None:
    """Every rank saves its DeepSpeed shard of ``engine`` into ``final``'s ``.partial``
    sibling; rank 0 then writes the loop ``state`` and renames the folder to ``final``.
    Collective (``barrier`` syncs the ranks). An existing ``final`` (a trunk resumed past the
    step) is kept as it is."""
    if final.is_dir():
        return
    partial = final.with_name(final.name + ".partial")
    if rank == 0 and partial.exists():
        shutil.rmtree(partial)  # left by a trunk killed mid-save
    barrier()
    engine.save_checkpoint(str(partial), tag=CKPT_TAG)
    barrier()
    if rank == 0:
        (partial / STATE_FILE).write_text(json.dumps(state))
        partial.rename(final)
    barrier()


def restore_branch_point(engine: Any, scheduler: Any, run: RunSpec, storage_path: str) -> dict[str, Any]:
    """Load the trunk's checkpoint at ``run.branch_step`` into ``engine`` and set the LR of
    that step from ``run``'s own schedule; returns the loop state to continue from (step = b,
    the trunk's wall time and evals at b, ``trunk_mlflow_run_id``).

    Raises BranchPointError when the folder is missing."""
    from orchestrator.run.checkpoint import load_engine_checkpoint

    assert run.trunk is not None and run.branch_step is not None
    d = branch_point_dir(storage_path, run.trunk, run.branch_step)
    if not (d / STATE_FILE).is_file():
        raise BranchPointError(f"branch {run.run_name} ({run.run_id}) needs its trunk {run.trunk}'s checkpoint at step "
                               f"{run.branch_step} ({d}), which does not exist: did the trunk fail?")
    trunk_state = json.loads((d / STATE_FILE).read_text())
    load_engine_checkpoint(engine, str(d), CKPT_TAG)
    set_lr_at(scheduler, run.branch_step)
    b = run.branch_step
    return {"step": b, "wall_s": trunk_state["wall_s"], "evals": b // run.eval_every_steps, "branched": True,
            "trunk_mlflow_run_id": trunk_state["mlflow_run_id"]}


def set_lr_at(scheduler: Any, step: int) -> None:
    """Make a LambdaLR restored from another run's state apply its own lambda at ``step``:
    torch restores ``last_epoch`` and the last LRs but never a function lambda, so the
    loaded LRs are the trunk's (constant) while this run's step ``step`` decays."""
    scheduler.last_epoch = step
    lrs = [base * lam(step) for base, lam in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs


def copy_trunk_history(client: Any, trunk_mlflow_id: str, branch_mlflow_id: str, max_step: int) -> int:
    """Copy every metric point of the trunk's MLflow run at step (tokens) <= ``max_step`` into
    the branch's run, except points the branch already has (a restarted copy adds the rest)
    and MLflow's ``system/*`` samples (their step is a sample count, not tokens). Returns the
    number of points written."""
    from mlflow.entities import Metric

    keys = [k for k in client.get_run(trunk_mlflow_id).data.metrics if not k.startswith("system/")]
    points: list[Metric] = []
    for key in keys:
        have = {m.step for m in client.get_metric_history(branch_mlflow_id, key)}
        points += [Metric(key, m.value, m.timestamp, m.step) for m in client.get_metric_history(trunk_mlflow_id, key)
                   if m.step <= max_step and m.step not in have]
    for i in range(0, len(points), 1000):
        client.log_batch(branch_mlflow_id, metrics=points[i:i + 1000])
    return len(points)


def family_trunks(runs: list[RunSpec]) -> set[str]:
    """run_ids of the trunks the ``runs`` belong to (a trunk is its own)."""
    return {r.trunk or r.run_id for r in runs if r.trunk or r.branch_points}


def release_branch_points(runs: list[RunSpec], outcomes: dict[str, dict[str, str]], storage_path: str) -> list[str]:
    """Delete the branch points of every trunk whose family ``runs`` (the runs a pack was
    handed: a family's runs not in it finished earlier) all finished; returns the trunk
    run_ids whose folders were deleted."""
    if any(outcomes.get(r.run_id, {}).get("status") != "finished" for r in runs):
        return []
    gone = []
    for trunk in sorted(family_trunks(runs)):
        d = trunk_dir(storage_path, trunk)
        if d.exists():
            shutil.rmtree(d)
            gone.append(trunk)
    return gone
