"""What a cluster can grow to (run.driver.placement): the autoscaler's node types, from the
cluster config autoscaler v2 reports to the GCS or from a declared launcher config, and the
refusals and in-flight counts judged against them. No Ray started: Ray's own protobuf and file
formats only."""

from __future__ import annotations

import json

import pytest
from ray.core.generated import autoscaler_pb2

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.placement import (
    UNBOUNDED,
    ClusterGrowth,
    capacity,
    growth_from_cluster_config,
    growth_from_file,
    unschedulable_reason,
)
from tests.helpers import driver_env, qk, tiny_spec, write_spec

HEAD = {"CPU": 0.0, "memory": 1e9}


def _run(workers: int = 1, cpus: float = 1, gpus: float = 0):
    res = {"workers": workers, "cpus_per_worker": cpus, "gpus_per_worker": gpus}
    return plan(parse_spec(tiny_spec("g", resources=res, train={"global_batch": 16, "seq_len": 64})))[0]


def _reported(*groups: tuple[str, dict[str, int], int]) -> autoscaler_pb2.ClusterConfig:
    cfg = autoscaler_pb2.ClusterConfig()
    for name, resources, max_count in groups:
        g = cfg.node_group_configs.add(name=name, max_count=max_count)
        g.resources.update(resources)
    return cfg


def test_the_reported_cluster_config_gives_each_group_at_its_max():
    growth = growth_from_cluster_config(_reported(("head", {"CPU": 0}, 1), ("gpu", {"CPU": 8, "GPU": 1}, 4)))
    assert growth.nodes == [{"CPU": 0.0}] + [{"CPU": 8.0, "GPU": 1.0}] * 4
    assert "GCS" in growth.source
    assert growth_from_cluster_config(None) is None
    assert growth_from_cluster_config(autoscaler_pb2.ClusterConfig()) is None  # no groups: nothing known


def test_an_unbounded_group_holds_any_run_that_fits_one_of_its_nodes():
    growth = growth_from_cluster_config(_reported(("cpu", {"CPU": 2}, -1)))
    assert unschedulable_reason(_run(workers=16, cpus=2), [HEAD], growth) is None
    assert "the largest node {'CPU': 2.0}" in unschedulable_reason(_run(workers=1, cpus=4), [HEAD], growth)
    # slots are counted only up to the packs there are: an unbounded type is not counted to
    # thousands each time the driver asks (it asks before every launch and every second)
    assert capacity(_run(workers=1, cpus=2), [HEAD], growth, most=3) == 3
    assert capacity(_run(workers=1, cpus=2), [HEAD], growth) == UNBOUNDED


def test_refusal_and_capacity_are_judged_on_what_the_cluster_can_become():
    growth = ClusterGrowth([dict(HEAD)] + [{"CPU": 4.0}] * 3, "a test")
    run = _run(workers=2, cpus=4)
    # against the head alone (what the old check saw) the run can never fit: the negative control
    assert "needs 2 workers x {'CPU': 4.0}" in unschedulable_reason(run, [HEAD])
    assert unschedulable_reason(run, [HEAD], growth) is None
    assert capacity(run, [HEAD], growth) == 1  # 3 nodes of 4 CPUs: one 2-worker run at a time
    assert capacity(_run(workers=1, cpus=4), [HEAD], growth) == 3
    # more nodes alive than the config says (a manual join): the alive count wins
    assert capacity(_run(workers=1, cpus=4), [HEAD] + [{"CPU": 4.0}] * 5, growth) == 5
    too_big = unschedulable_reason(_run(workers=4, cpus=4), [HEAD], growth)
    assert "can grow to 4 node(s) with {'CPU': 12.0}" in too_big and "from a test" in too_big


def test_a_launcher_config_with_an_unbounded_worker_type(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"head_node_type": "h", "available_node_types": {"h": {"resources": {}}, "w": {"resources": {"CPU": 2}}}}))
    growth = growth_from_file(f)
    assert growth.nodes[0] == {} and len(growth.nodes) == 1025 and growth.nodes[1] == {"CPU": 2.0}


@pytest.mark.parametrize("content", [None, "kind: Deployment\n"])
def test_run_with_a_bad_cluster_config_exits_2_before_ray_starts(tmp_path, content):
    spec = write_spec(tmp_path, "bad-cluster")
    cfg = tmp_path / "cluster.yaml"
    if content is not None:
        cfg.write_text(content)
    res = qk("run", spec.name, cwd=tmp_path, env=driver_env(QKSTUDY_CLUSTER_CONFIG=str(cfg)), timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert str(cfg) in res.stderr and "QKSTUDY_CLUSTER_CONFIG" in res.stderr
    assert not (tmp_path / "runs").exists(), "a refused study left a lease or a store behind"
