"""Packs: runs trained back to back by one Ray Train worker group, and the task that owns it.

Starting a worker group costs seconds per run (``resources.runs_per_trainer``, BENCHMARKS.md),
so runs share groups. ``runs_per_trainer: auto`` (the default) makes one pack per slot the
cluster has when the study starts (``placement.capacity``), the runs dealt to the packs longest
first, each to the pack with the least work so far (LPT): as many worker groups as can train at
once, none started twice on one slot. A number cuts the plan's launch order into fixed packs of
that many consecutive runs. Under ``protocol: branches`` a trunk and its branches are one pack
of their own, trunk first (a branch starts from the trunk's checkpoints,
``run.worker.branching``), whatever ``runs_per_trainer`` says.

A pack's name is its Ray Train run name, under which its checkpoints live, so a run keeps the
pack it was first launched in: the driver records the name on the run's MLflow record
(``qkstudy.pack``) and a resubmit puts every run with a recorded pack back in it, whatever the
cluster or ``runs_per_trainer`` is now; only runs never launched are packed afresh.
``fit_pack`` is the lightweight Ray task that owns one pack's TorchTrainer and reads each run's
outcome back from MLflow.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import ray

from orchestrator.plan.contract import RunSpec
from orchestrator.run.driver.leasing import run_leases
from orchestrator.run.driver.placement import worker_resources
from orchestrator.track.timeline import Timeline
from orchestrator.track.tracking import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_QUEUED,
    client_for,
    last_logged_step,
    run_status,
    run_tag,
    set_status,
)

PACK_TAG = "pack"  # the run's MLflow tag (namespaced): the pack it was launched in

# The controller checks its workers this often; a finished run is noticed at the next check.
# Ray's default (2 s) adds seconds to every short run; the check is one cheap actor call.
_HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
_HEALTH_CHECK_S = "0.5"


@dataclass(frozen=True)
class Pack:
    """Runs trained back to back by one Ray Train worker group (``resources.runs_per_trainer``).

    ``name`` is the Ray Train run name, under which the group's checkpoints live: the run id
    for a pack of one run (under ``runs_per_trainer: 1``, or dealt alone under ``auto``), else
    a hash of the ids of every run put in the pack (a resubmit finds it again through the runs'
    recorded ``PACK_TAG``)."""

    name: str
    runs: tuple[RunSpec, ...]


def launch_order(runs: list[RunSpec]) -> list[RunSpec]:
    """Longest first (by total FLOPs per worker): list scheduling in LPT order keeps the
    makespan near max(longest run, total work / capacity)."""
    return sorted(runs, key=lambda r: -r.total_flops / r.resources.workers)


def _named(chunk: list[RunSpec], named_by_run: bool = False) -> str:
    """``Pack.name`` of ``chunk``."""
    return chunk[0].run_id if named_by_run else "pack-" + hashlib.sha256(",".join(r.run_id for r in chunk).encode()).hexdigest()[:16]


def branch_families(order: list[RunSpec]) -> list[list[RunSpec]]:
    """Trunk-and-branches groups of ``order`` (``protocol: branches``): the trunk first, then
    its branches by branch step; in the order of their trunks."""
    families: dict[str, list[RunSpec]] = {}
    for r in order:
        if r.branch_points or r.trunk:
            families.setdefault(r.trunk or r.run_id, []).append(r)
    return [sorted(f, key=lambda r: (r.trunk is not None, r.branch_step or 0)) for f in families.values()]


def _dealt(order: list[RunSpec], packs: int) -> list[list[RunSpec]]:
    """``order`` (longest first) dealt into ``packs`` groups, each run to the group with the
    least work so far (LPT list scheduling: Graham 1969, makespan within 4/3 of optimal);
    empty groups dropped."""
    groups: list[list[RunSpec]] = [[] for _ in range(max(1, packs))]
    work = [0.0] * len(groups)
    for r in order:
        i = work.index(min(work))
        groups[i].append(r)
        work[i] += r.total_flops / r.resources.workers
    return [g for g in groups if g]


def make_packs(order: list[RunSpec], todo_ids: set[str], slots: int = 1, recorded: dict[str, str] | None = None) -> list[Pack]:
    """The packs that train ``todo_ids`` of the plan's launch ``order``, longest first.

    Branch families are one pack each (their trunk is the longest run), trunk first. The other
    runs, under ``runs_per_trainer: auto``: those still to do dealt into ``slots`` packs
    (``_dealt``); under a number: the whole order cut into consecutive groups of that many
    (similar lengths, as the order is longest first), so a group's name does not depend on
    which of its runs are done. A run in ``recorded`` ({run_id: pack name}, from its MLflow
    record) goes back to the pack it was launched in, whatever the above says."""
    families = branch_families(order)
    in_family = {r.run_id for f in families for r in f}
    rest = [r for r in order if r.run_id not in in_family]
    recorded = {k: v for k, v in (recorded or {}).items() if k in todo_ids}
    size = order[0].resources.runs_per_trainer if order else 1
    named = [(_named(f), f) for f in families]
    if size == "auto":
        named += [
            (_named(g, named_by_run=len(g) == 1), g)
            for g in _dealt([r for r in rest if r.run_id in todo_ids and r.run_id not in recorded], slots)
        ]
    else:
        named += [(_named(c, named_by_run=size == 1), c) for c in (rest[i : i + size] for i in range(0, len(rest), size))]
    where = {r.run_id: name for name, chunk in named for r in chunk} | recorded
    packs: dict[str, list[RunSpec]] = {}
    for r in [r for f in families for r in f] + rest:
        if r.run_id in todo_ids:
            packs.setdefault(where[r.run_id], []).append(r)
    return [Pack(name, tuple(runs)) for name, runs in packs.items()]


def requeue(pack: Pack, outcomes: dict[str, dict[str, Any]]) -> Pack | None:
    """The pack that trains ``pack``'s runs its worker group never started, when it started
    another (so each requeue is smaller: a pack whose group failed before any run is not
    retried), else None. ``outcomes``: ``fit_pack``'s. Why: runs share a worker group for its
    start-up only; a run that crashes the group past its retries must not fail the runs queued
    behind it. A branch family is never split: its branches start from the trunk's branch
    points, and a pack of branches alone would release them once it finished (a branch left
    unstarted waits for a resubmit of the whole family)."""
    if any(r.trunk or r.branch_points for r in pack.runs):
        return None
    left = [r for r in pack.runs if outcomes.get(r.run_id, {}).get("started") is False]
    return Pack(_named(left, named_by_run=len(left) == 1), tuple(left)) if left and len(left) < len(pack.runs) else None


def pack_items(pack: Pack, datasets: dict[str, dict[str, Any]], mlflow_ids: dict[str, str]) -> list[dict[str, Any]]:
    """What ``fit_pack`` hands the workers: [{run (as JSON), data_path, data_hash (the prepared
    data's content hash), mlflow_run_id}] per run."""
    return [
        {
            "run": r.model_dump(mode="json"),
            "data_path": datasets[r.corpus_name]["path"],
            "data_hash": datasets[r.corpus_name]["content_hash"],
            "mlflow_run_id": mlflow_ids[r.run_id],
        }
        for r in pack.runs
    ]


def _trainer(name: str, items: list[dict], tracking_uri: str, storage_path: str, board: str | None, timeline: Timeline):
    """The pack's TorchTrainer: workers sized from the runs' (shared) resources block, the
    pack's name and storage for its checkpoints, ``max_retries`` worker-group restarts; its
    workers continue ``timeline`` (its ``trainer`` section ends here)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from orchestrator.run.worker.entry import train_loop_per_worker

    res = RunSpec.model_validate(items[0]["run"]).resources
    use_gpu = res.gpus_per_worker > 0
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "runs": items,
            "tracking_uri": tracking_uri,
            "board": board,
            "storage_path": storage_path,
            "timeline": timeline.mark("trainer").to_json(),
        },
        scaling_config=ScalingConfig(num_workers=res.workers, use_gpu=use_gpu, resources_per_worker=worker_resources(res)),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=res.max_retries),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )


def _outcomes(items: list[dict], tracking_uri: str, crash: str) -> dict[str, dict[str, Any]]:
    """{run_id: {status, reason}} from MLflow; a run the group did not end (it crashed before
    the run finished) is marked failed there with the crash as its reason. One it never
    started (still queued there, with no ``tokens`` point logged) is left queued and comes back
    failed with ``"started": False``: the driver trains it in another pack or marks it failed
    (``requeue``)."""
    client = client_for(tracking_uri)
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        run_id, mlflow_id = item["run"]["run_id"], item["mlflow_run_id"]
        try:
            record = client.get_run(mlflow_id)
        except Exception as e:  # noqa: BLE001 - MLflow down (track.metric_buffer): say why the run stopped
            out[run_id] = {
                "status": STATUS_FAILED,
                "reason": f"{crash or 'the worker group ended'}; MLflow could not "
                f"record it ({type(e).__name__}): its run there still reads running until a resubmit",
            }
            continue
        status, reason = run_status(record), run_tag(record.data.tags, "failure_reason") or ""
        # never started (still queued, and no training point: a run whose status write was lost
        # while MLflow was down has points): the driver requeues it or fails it (``requeue``)
        if status == STATUS_QUEUED and last_logged_step(client, mlflow_id) < 0:
            out[run_id] = {"status": STATUS_FAILED, "reason": crash or "the worker group ended before this run started", "started": False}
            continue
        if status != STATUS_FINISHED and not (status == STATUS_FAILED and reason):
            reason = crash or "the worker group ended before this run did"
            status = STATUS_FAILED
            set_status(client, mlflow_id, STATUS_FAILED, reason=reason)
        out[run_id] = {"status": status, "reason": reason}
    return out


@ray.remote(num_cpus=0, max_retries=0)
def fit_pack(
    name: str, items: list[dict], tracking_uri: str, storage_path: str, board: str | None, timeline: list | None = None
) -> dict[str, dict[str, Any]]:
    """Owns one pack's TorchTrainer; ``items``: ``pack_items``. Returns {run_id: {status,
    reason}}. Any failure is recorded in MLflow, never raised. Each run's lease is held while
    the pack trains (``run.driver.leasing``); a run whose lease another live pack holds is not
    trained here and comes back ``held``, with the holder in its reason. ``timeline``: the
    driver's start-up marks (``Timeline.to_json``), continued here and handed to the workers."""
    tl = Timeline.from_json(timeline) or Timeline.since()
    tl.mark("queued")
    os.environ.setdefault(_HEALTH_CHECK_ENV, _HEALTH_CHECK_S)  # Ray Train hands it to its controller
    with run_leases(items, storage_path) as (mine, held):
        return {**(_fit(name, mine, tracking_uri, storage_path, board, tl) if mine else {}), **held}


def _fit(
    name: str, items: list[dict], tracking_uri: str, storage_path: str, board: str | None, timeline: Timeline
) -> dict[str, dict[str, Any]]:
    """Fit the pack's trainer on ``items`` and read each run's outcome back (``_outcomes``)."""
    trainer = _trainer(name, items, tracking_uri, storage_path, board, timeline)
    crash = ""
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001 - a failing run never takes the study down
        crash = f"{type(e).__name__}: {e}"
        cause = getattr(e, "__cause__", None) or getattr(e, "worker_failures", None)
        if cause:
            crash += f" (cause: {cause})"
    outcomes = _outcomes(items, tracking_uri, crash)
    from orchestrator.run.worker.branching import release_branch_points

    release_branch_points([RunSpec.model_validate(i["run"]) for i in items], outcomes, storage_path)
    return outcomes
