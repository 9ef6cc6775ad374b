"""Placement: whether, and how many copies of, a run fit a Ray cluster's nodes.

Ray Train gangs a run's workers into one placement group (one bundle per worker, each bundle
on one node), so a run fits only when all its bundles fit at once. The driver models that
greedily over node resources, twice: to report a run that can never fit (rather than queue it
forever) and to size how many packs it hands Ray at once. Ray itself still decides where each
worker goes, and an autoscaler adds the nodes a pending placement group asks for.

A worker group also costs the driver's node (the head, on a cluster) about 1 GiB besides its
workers: the pack's task and Ray Train's controller and helper actors live there
(``GROUP_DRIVER_NODE_BYTES``). So the packs in flight are also bounded by how many groups that
node's memory holds (``packs_at_once``): on a head of 32 GiB, 64 GPU slots are trained by fewer,
longer packs instead of 64 groups the head cannot hold.

"Can never fit" is judged against what the cluster can become, not the nodes alive at start:
the autoscaler's node types at their max workers (``ClusterGrowth``), read from the cluster
config the autoscaler reports to the GCS (autoscaler v2; Ray Train checks the same one), else
from a Ray cluster-launcher config or KubeRay RayCluster / RayJob manifest named by
``QKSTUDY_CLUSTER_CONFIG`` (the v1 autoscaler reports nothing). Without either, the alive
nodes are all the cluster can be.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import yaml
from ray._private.state import state  # the GCS's cluster config: Ray Train's own source for the cluster's maximum
from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

from orchestrator.plan.contract import ResourcesSpec, RunSpec


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


CLUSTER_CONFIG_ENV = "QKSTUDY_CLUSTER_CONFIG"
UNBOUNDED = 1024  # copies of a node type whose max workers is unlimited (-1): more than any run needs


def alive_nodes() -> list[dict[str, float]]:
    """Total resources of each alive node of the connected Ray cluster."""
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


class ClusterConfigError(ValueError):
    """The cluster config ``QKSTUDY_CLUSTER_CONFIG`` names cannot be read as node types."""


@dataclass(frozen=True)
class ClusterGrowth:
    """The nodes a cluster can become: one resources dict per node at every node type's max
    workers (the head type counts once), and where that came from (said in refusals)."""

    nodes: list[dict[str, float]]
    source: str


def growth_from_node_types(node_types: dict[str, dict], head_type: str | None, source: str) -> ClusterGrowth:
    """``ClusterGrowth`` of an autoscaler's ``available_node_types`` (Ray's cluster-config
    format: each type's ``resources`` and ``max_workers``, -1 or absent: unbounded).

    Raises:
        ClusterConfigError: a worker type that can grow declares no resources (name them in
            the file: the driver cannot ask a cloud what an instance type holds).
    """
    nodes: list[dict[str, float]] = []
    for name, t in node_types.items():
        count = 1 if name == head_type else t.get("max_workers", -1)
        count = UNBOUNDED if count is None or count < 0 else int(count)
        res = {k: float(v) for k, v in (t.get("resources") or {}).items()}
        if count and not res and name != head_type:
            raise ClusterConfigError(f"{source}: available_node_types.{name}.resources: a node type that can grow declares no resources")
        nodes += [dict(res) for _ in range(min(count, UNBOUNDED))]
    return ClusterGrowth(nodes, source)


def growth_from_file(path: Path) -> ClusterGrowth:
    """``ClusterGrowth`` of a Ray cluster-launcher config (``available_node_types``), or of a
    KubeRay RayCluster or RayJob manifest, read with Ray's own KubeRay autoscaler translation
    (``_derive_autoscaling_config_from_ray_cr``: group resources from rayStartParams, else the
    Ray container's limits; max workers = maxReplicas x numOfHosts).

    Raises:
        ClusterConfigError: the file is unreadable, or none of those three.
    """
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as e:
        raise ClusterConfigError(f"{path} ({CLUSTER_CONFIG_ENV}): cannot read the cluster config ({e})") from e
    for doc in docs:
        if "available_node_types" in doc:
            return growth_from_node_types(doc["available_node_types"], doc.get("head_node_type"), str(path))
        if doc.get("kind") in ("RayCluster", "RayJob"):
            spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
            cr = {"metadata": {"namespace": "default", **doc.get("metadata", {})}, "spec": copy.deepcopy(spec)}
            try:
                cfg = _derive_autoscaling_config_from_ray_cr(cr)
            except (KeyError, ValueError, TypeError) as e:
                raise ClusterConfigError(f"{path}: not a RayCluster KubeRay's autoscaler can read ({type(e).__name__}: {e})") from e
            return growth_from_node_types(cfg["available_node_types"], cfg["head_node_type"], str(path))
    raise ClusterConfigError(
        f"{path} ({CLUSTER_CONFIG_ENV}): neither a Ray cluster config (available_node_types) nor a KubeRay RayCluster / RayJob"
    )


def growth_from_cluster_config(cfg: Any) -> ClusterGrowth | None:
    """``ClusterGrowth`` of the cluster config an autoscaler (v2) reports to the GCS (an
    ``autoscaler_pb2.ClusterConfig``, Ray's generated protobuf, or None): each node
    group's resources at its ``max_count`` (-1: unbounded); None for no config or no groups."""
    if cfg is None or not cfg.node_group_configs:
        return None
    nodes: list[dict[str, float]] = []
    for g in cfg.node_group_configs:
        count = UNBOUNDED if g.max_count < 0 else min(g.max_count, UNBOUNDED)
        nodes += [{k: float(v) for k, v in g.resources.items()} for _ in range(count)]
    return ClusterGrowth(nodes, "the autoscaler's node types (reported to the GCS)")


def declared_growth() -> ClusterGrowth | None:
    """``growth_from_file`` of the file ``QKSTUDY_CLUSTER_CONFIG`` names (None: unset). Read
    before Ray starts, so a bad file is an input error (``ClusterConfigError``) that ran nothing."""
    path = os.environ.get(CLUSTER_CONFIG_ENV)
    return growth_from_file(Path(path).expanduser()) if path else None


def cluster_growth(declared: ClusterGrowth | None) -> ClusterGrowth | None:
    """What the connected cluster can become: the config its autoscaler reported, else
    ``declared`` (``declared_growth``), else None (the alive nodes are all there is)."""
    try:
        reported = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - a GCS without the key (an older Ray): nothing reported
        reported = None
    return growth_from_cluster_config(reported) or declared


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


def _fits(run: RunSpec, nodes: list[dict[str, float]]) -> bool:
    return _place(run_demands(run), run.resources.workers, [dict(n) for n in nodes])


def unschedulable_reason(run: RunSpec, nodes: list[dict[str, float]], growth: ClusterGrowth | None = None) -> str | None:
    """Why ``run`` can never be placed on a cluster with these alive node resources that can
    grow to ``growth`` (None: it can, now or once the autoscaler adds nodes).

    Each worker is one bundle that must fit on one node; all workers must fit at once
    (Ray Train gangs them in a placement group), packed greedily over nodes.
    """
    if _fits(run, nodes) or (growth is not None and _fits(run, growth.nodes)):
        return None
    demand = run_demands(run)
    total = {k: sum(n.get(k, 0.0) for n in nodes) for k in demand}
    why = f"needs {run.resources.workers} workers x {demand}, but the cluster has {len(nodes)} node(s) with {total} in all"
    if growth is None:
        return why
    largest = {k: max((n.get(k, 0.0) for n in growth.nodes), default=0.0) for k in demand}
    grown = {k: sum(n.get(k, 0.0) for n in growth.nodes) for k in demand}
    return f"{why}, and can grow to {len(growth.nodes)} node(s) with {grown} (the largest node {largest}; from {growth.source})"


def _copies(run: RunSpec, nodes: list[dict[str, float]], most: int) -> int:
    free, n = [dict(x) for x in nodes], 0
    while n < most and _place(run_demands(run), run.resources.workers, free):
        n += 1
    return n


# Unique memory (USS) one worker group's control processes take on the driver's node: the pack's
# task (243 MiB), TrainController (238), PlacementGroupCleaner (113), DatasetManager (110),
# SynchronizationActor (107) and PreemptionWatcher (107), with Ray 2.60 (BENCHMARKS.md,
# `python -m benchmarks.head_memory`): 917 MiB per further group, rounded up.
GROUP_DRIVER_NODE_BYTES = 2**30


def packs_at_once(slots: int, driver_node_memory: float | None) -> int:
    """Packs to keep in flight: the cluster's ``slots``, at most as many worker groups as the
    driver's node holds (its Ray ``memory`` resource in bytes over ``GROUP_DRIVER_NODE_BYTES``;
    None: not known, no bound), and at least 1."""
    if driver_node_memory is None:
        return max(1, slots)
    return max(1, min(slots, int(driver_node_memory // GROUP_DRIVER_NODE_BYTES)))


def driver_node_memory() -> float | None:
    """The Ray ``memory`` resource (bytes tasks and actors may use) of the node this driver runs
    on, where every pack's task and Ray Train controller live; None when Ray does not say."""
    me = ray.get_runtime_context().get_node_id()
    return next((n["Resources"].get("memory") for n in ray.nodes() if n.get("NodeID") == me and n.get("Alive")), None)


def capacity(run: RunSpec, nodes: list[dict[str, float]], growth: ClusterGrowth | None = None, most: int = 4096) -> int:
    """How many copies of ``run`` the cluster holds at once, counted up to ``most`` (the packs
    there are to place: more slots are never used, and an unbounded node type would otherwise
    be counted to thousands), at least 1: on the alive ``nodes``, or on what it can grow to,
    whichever holds more (an autoscaler scales up for the placement groups that pend)."""
    return max(1, _copies(run, nodes, most), _copies(run, growth.nodes, most) if growth else 0)
