"""Branch points of ``protocol: branches``: the trunk's retained checkpoints and a branch's start.

Why: a branch (``RunSpec.trunk``, ``branch_step`` = b) is the trunk's run up to step b, then
its own cooldown (``orchestrator.plan.branch_runs``). Ray Train's checkpoint manager keeps
only a pack's latest checkpoints (``num_to_keep``), so the trunk saves, after each of its
``branch_points``, a copy of its engine checkpoint to ``<storage>/branch_points/<trunk
run_id>/step-<b>`` that Ray never prunes (every rank writes its shard into a ``.partial``
folder, rank 0 renames it once all have: a reader never sees half a checkpoint). A branch
without a checkpoint of its own restores that folder weights-only (``run.worker.safe_load``), takes
the LR of step b from its own schedule (the trunk's scheduler state holds the trunk's), and
copies the trunk's MLflow history up to b x tokens_per_step into its own run, so every
branch's curve starts at token 0. The folders of a trunk are deleted once every run of its
family finished (``release_branch_points``, called when the family's pack ends).

Branch points live on a filesystem path (the study's ``storage_path``, shared by the
workers of a multi-node cluster); a URI storage (``s3://``) is refused with a clear error.

Verification: a branch point is a checkpoint like any other (``run.checkpoint``): every rank
saves its share into a folder of its own with its manifest, then moves it into the
``.partial`` folder. A branch verifies it (every rank its own share, agreed by an all-reduce)
before it loads anything, and when it is torn (a file truncated, changed or missing, a rank's
manifest missing) or does not load, the branch falls back, because a WSD cooldown branch must
start its decay exactly at its branch step b and no checkpoint after b is of any use:

1. to the trunk's newest whole branch point at a step b' < b (another branch's): up to b the
   branch's own schedule is the trunk's (the same warmup, then the constant peak LR:
   ``plan.branches``), and its data order and initial weights are the trunk's (same seed,
   same data), so training steps b'..b again from there is the trunk's segment, then the
   branch's cooldown starts at b as planned; its copied MLflow history stops at b';
2. else to step 0: the branch's RunSpec is the independent WSD run of its budget, so
   training it from scratch gives the same run (at its full cost, no trunk savings).

Either way the branch says so in the worker log and in its MLflow tag ``branch_point``
(``BRANCH_POINT_KEY``): ``verified``, ``unverified (...)`` for a folder saved before
manifests, or ``torn: <folder>: <reason>; restarted from ...``. A missing folder (the trunk
never reached b) is not torn but an error (``BranchPointError``), as before.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.plan.contract import RunSpec
from orchestrator.run.checkpoint import has_manifest, merge_share, read_state, save_share, verify_share

BRANCH_DIR = "branch_points"
BRANCH_POINT_KEY = "branch_point"  # key in restore_branch_point's state, and the MLflow tag's bare name (tracking.tag)


class BranchPointError(RuntimeError):
    """A branch's start checkpoint is missing (its trunk failed or never reached the step)."""


def trunk_dir(storage_path: str, trunk_run_id: str) -> Path:
    """Folder of one trunk's branch points. Raises BranchPointError for a URI storage path."""
    if "://" in storage_path:
        raise BranchPointError(
            f"protocol: branches keeps branch points on a filesystem path; storage_path {storage_path!r} is a URI (use a shared folder)"
        )
    return Path(storage_path) / BRANCH_DIR / trunk_run_id


def branch_point_dir(storage_path: str, trunk_run_id: str, step: int) -> Path:
    """Folder of the trunk's checkpoint after ``step`` optimizer steps."""
    return trunk_dir(storage_path, trunk_run_id) / f"step-{step:08d}"


def save_branch_point(engine: Any, final: Path, state: dict[str, Any], rank: int, world: int, barrier: Callable[[], object]) -> None:
    """Every rank saves its DeepSpeed shard of ``engine`` with its manifest into a folder of
    its own inside ``final``'s ``.partial`` sibling and moves it into that folder
    (``run.checkpoint.save_share`` / ``merge_share``); rank 0 also writes the loop ``state`` and,
    once every rank's share is in, renames the folder to ``final``. Collective (``barrier``
    syncs the ``world`` ranks). An existing ``final`` (a trunk resumed past the step) is kept
    as it is. Raises what DeepSpeed's save raises, FileExistsError when two ranks wrote the
    same file name."""
    if final.is_dir():
        return
    partial = final.with_name(final.name + ".partial")
    if rank == 0 and partial.exists():
        shutil.rmtree(partial)  # left by a trunk killed mid-save
    barrier()
    share = partial / f".share-rank{rank}"
    save_share(engine, share, state, rank, world)
    merge_share(share, partial)
    barrier()
    if rank == 0:
        partial.rename(final)
    barrier()


def _branch_points_from(storage_path: str, run: RunSpec) -> list[Path]:
    """The branch's own point first, then the trunk's published points at earlier steps,
    newest first. Raises BranchPointError when the branch's own folder does not exist."""
    assert run.trunk is not None and run.branch_step is not None
    d = branch_point_dir(storage_path, run.trunk, run.branch_step)
    if not d.is_dir():
        raise BranchPointError(
            f"branch {run.run_name} ({run.run_id}) needs its trunk {run.trunk}'s checkpoint at step "
            f"{run.branch_step} ({d}), which does not exist: did the trunk fail?"
        )
    earlier = [p for p in d.parent.glob("step-*") if p.is_dir() and p.name[5:].isdigit() and int(p.name[5:]) < run.branch_step]
    return [d, *sorted(earlier, reverse=True)]


def _unusable(d: Path, state: dict[str, Any] | None, run: RunSpec, data_hash: str | None, rank: int) -> str | None:
    """Why this rank cannot start ``run`` from the branch point ``d`` (its loop ``state``), or None."""
    if state is None:
        return None
    if state.get("run_id", run.trunk) != run.trunk:
        return f"saved by run {state.get('run_id')}, not the trunk {run.trunk}"
    if data_hash is not None and state.get("data_hash", data_hash) != data_hash:
        return f"saved on other data ({state.get('data_hash')}, this run's is {data_hash})"
    return verify_share(d, rank)


def restore_branch_point(
    load: Callable[[str], Any],
    scheduler: Any,
    run: RunSpec,
    storage_path: str,
    *,
    data_hash: str | None,
    rank: int,
    any_rank: Callable[[bool], bool],
    log: Callable[[str], None],
    rebuild: Callable[[], None],
) -> dict[str, Any]:
    """Start the branch ``run`` from its trunk's checkpoint at ``run.branch_step`` (b), or,
    when that is torn, from the newest whole earlier one, or from step 0 (module docstring).

    ``load(dir)`` loads a checkpoint folder into the engine (raises on a bad file);
    ``any_rank(flag)``: True when any rank passes True (every rank calls it in the same
    order); ``rebuild()`` is called before a step-0 start when a failed load may have left
    part of a checkpoint in the engine. The LR of the start step is set from ``run``'s own
    schedule (``set_lr_at``). Returns the loop state to continue from: step (b, b' < b or 0),
    wall_s (the trunk's at that step, seconds), evals, and ``BRANCH_POINT_KEY`` (the tag's
    text; on rank 0 also logged when not "verified"); from a trunk checkpoint also
    ``branched`` and ``trunk_mlflow_run_id``. Raises BranchPointError when the folder of b
    does not exist (the trunk never reached it)."""
    b = run.branch_step
    skipped: list[str] = []
    dirty = False
    for d in _branch_points_from(storage_path, run):
        state, why = read_state(d)
        why = why or _unusable(d, state, run, data_hash, rank)
        if not any_rank(why is not None):
            try:
                load(str(d))
            except Exception as e:  # noqa: BLE001 - a bad file DeepSpeed found: try an earlier one
                why = f"load failed: {type(e).__name__}: {str(e)[:300]}"
            failed = any_rank(why is not None)
            dirty = dirty or failed  # some rank's engine may hold part of it
            if not failed:
                assert state is not None
                step = int(state["step"])
                set_lr_at(scheduler, step)
                if skipped:
                    note = _torn(
                        skipped, f"restarted from {d.name} (step {step}), training the trunk's steps {step}-{b} again before the cooldown"
                    )
                    if rank == 0:
                        log(note)
                else:
                    note = "verified" if has_manifest(d) else "unverified (saved before manifests)"
                return {
                    "step": step,
                    "wall_s": state["wall_s"],
                    "evals": step // run.eval_every_steps,
                    "branched": True,
                    "trunk_mlflow_run_id": state["mlflow_run_id"],
                    BRANCH_POINT_KEY: note,
                }
        if why:
            log(f"rank {rank}: branch point {d} cannot be used: {why}")
        skipped.append(f"{d.name}: {why or 'refused by another rank'}")
    if dirty:
        rebuild()
    note = _torn(skipped, f"no whole branch point of trunk {run.trunk} at or before step {b}: restarted from step 0")
    if rank == 0:
        log(note)
    return {"step": 0, "wall_s": 0.0, "evals": 0, BRANCH_POINT_KEY: note}


def _torn(skipped: list[str], outcome: str) -> str:
    return f"torn: {'; '.join(skipped)}; {outcome}"


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
        points += [
            Metric(key, m.value, m.timestamp, m.step)
            for m in client.get_metric_history(trunk_mlflow_id, key)
            if m.step <= max_step and m.step not in have
        ]
    for i in range(0, len(points), 1000):
        client.log_batch(branch_mlflow_id, metrics=points[i : i + 1000])
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
