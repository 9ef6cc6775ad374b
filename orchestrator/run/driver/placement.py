"""Placement: whether, and how many copies of, a run fit a Ray cluster's nodes.

Ray Train gangs a run's workers into one placement group (one bundle per worker, each bundle
on one node), so a run fits only when all its bundles fit at once. The driver models that
greedily over the alive nodes' resources, twice: to report a run that can never fit (rather
than queue it forever) and to size how many packs it hands Ray at once. Ray itself still
decides where each worker goes.
"""

from __future__ import annotations

import ray

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.spec import ResourcesSpec


def worker_resources(res: ResourcesSpec) -> dict[str, float]:
    """Ray resources one worker asks for: ``{"CPU": cpus_per_worker}``, plus
    ``{"GPU": gpus_per_worker}`` when it takes GPUs. The one place this dict is built: the
    placement checks, the TorchTrainer's ScalingConfig and the calibration task use it."""
    d = {"CPU": res.cpus_per_worker}
    if res.gpus_per_worker:
        d["GPU"] = res.gpus_per_worker
    return d


def run_demands(run: RunSpec) -> dict[str, float]:
    """Resources one worker of ``run`` asks Ray for (``worker_resources`` of its resources)."""
    return worker_resources(run.resources)


def alive_nodes() -> list[dict[str, float]]:
    """Total resources of each alive node of the connected Ray cluster."""
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def _place(demand: dict[str, float], workers: int, free: list[dict[str, float]]) -> bool:
    """Greedily place ``workers`` bundles of ``demand`` on ``free`` (mutated); True if all fit."""
    trial = [dict(n) for n in free]
    for _ in range(workers):
        node = next((n for n in trial if all(n.get(k, 0.0) + 1e-9 >= v for k, v in demand.items())), None)
        if node is None:
            return False
        for k, v in demand.items():
            node[k] = node.get(k, 0.0) - v
    free[:] = trial
    return True


def unschedulable_reason(run: RunSpec, nodes: list[dict[str, float]]) -> str | None:
    """Why ``run`` can never be placed on a cluster with these node resources (None: it can).

    Each worker is one bundle that must fit on one node; all workers must fit at once
    (Ray Train gangs them in a placement group), packed greedily over nodes.
    """
    demand = run_demands(run)
    if _place(demand, run.resources.workers, [dict(n) for n in nodes]):
        return None
    total = {k: sum(n.get(k, 0.0) for n in nodes) for k in demand}
    return f"needs {run.resources.workers} workers x {demand}, but the cluster has {len(nodes)} node(s) with {total} in all"


def capacity(run: RunSpec, nodes: list[dict[str, float]]) -> int:
    """How many copies of ``run`` the cluster holds at once (at least 1)."""
    free, n = [dict(x) for x in nodes], 0
    while n < 4096 and _place(run_demands(run), run.resources.workers, free):
        n += 1
    return max(1, n)
