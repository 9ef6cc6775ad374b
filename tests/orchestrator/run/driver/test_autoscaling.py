"""A study on a cluster that starts with only a head and grows on demand (Ray's fake multi-node
autoscaler on loopback, as a cloud or KubeRay autoscaler grows a real one): the driver requests
its runs' placement groups though no node can hold them yet, the autoscaler adds the nodes they
ask for and removes them when idle, every step is trained once; a run bigger than the largest
node type is refused, naming what the cluster can grow to."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers import assert_every_step_once, finish_driver, start_driver, steps, study_runs, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.stack]

# One CPU per node, at most two: the two runs (one worker x 1 CPU each) need both nodes at once.
NODE_TYPES = {"cpu-worker": {"resources": {"CPU": 1}, "min_workers": 0, "max_workers": 2}}
N_STEPS = 12


@pytest.fixture(scope="module")
def autoscaling(loopback_cluster):
    c = loopback_cluster(head_cpus=0, node_types=NODE_TYPES, idle_timeout_s=10)
    env = {**c.env, "RAY_ADDRESS": f"127.0.0.1:{c.gcs}", "QKSTUDY_CLUSTER_CONFIG": str(c.autoscaling_config)}
    return c, env


def _monitor_log(c) -> str:
    """The autoscaler's own log (the head's monitor), where it says each node it adds and removes."""
    return "\n".join(f.read_text(errors="replace") for f in Path(c.nodes["head"][1]).glob("session_*/logs/monitor.log"))


def test_a_study_trains_on_nodes_the_autoscaler_adds_and_they_go_when_idle(autoscaling, tmp_path, record_property):
    c, env = autoscaling
    t0 = time.time()
    assert len(c.alive_nodes()) == 1, "the cluster should start with its head only"
    spec = write_spec(
        tmp_path, "grow", variants=["standard", "coupled"], budget={"mode": "tokens", "tokens": N_STEPS * 512}, resources={"workers": 1}
    )
    p = start_driver(spec, env)
    err = finish_driver(p, timeout=900)
    assert p.returncode == 0, err[-3000:]
    assert "cluster can grow to 3 node(s)" in err, err[-3000:]
    client, runs = study_runs(tmp_path, "grow")
    assert len(runs) == 2 and {r.data.tags["qkstudy.status"] for r in runs.values()} == {"finished"}
    for r in runs.values():
        assert_every_step_once(steps(client, r.info.run_id), N_STEPS)
    log = _monitor_log(c)
    added = [line for line in log.splitlines() if "Adding" in line and "of type cpu-worker" in line]
    assert added, log[-3000:]
    deadline = time.time() + 120  # idle_timeout_s 10 plus the autoscaler's update period
    while len(c.alive_nodes()) > 1:
        assert time.time() < deadline, f"idle nodes not removed: {_monitor_log(c)[-3000:]}"
        time.sleep(5)
    log = _monitor_log(c)
    removed = [line for line in log.splitlines() if "Removing" in line and "of type cpu-worker (idle)" in line]
    assert removed, log[-3000:]
    # what it measured, in the tier's JUnit XML (build/test/stack.xml)
    record_property("study_and_scale_down_s", round(time.time() - t0, 1))
    record_property("nodes_added", " | ".join(line.split(" -- ")[-1] for line in added))
    record_property("nodes_removed", " | ".join(line.split(" -- ")[-1] for line in removed))


def test_a_run_bigger_than_the_largest_node_type_is_refused_with_the_reason(autoscaling, tmp_path):
    _, env = autoscaling
    spec = write_spec(tmp_path, "toobig", resources={"workers": 1, "cpus_per_worker": 2})
    p = start_driver(spec, env)
    err = finish_driver(p, timeout=600)
    assert p.returncode == 1, err[-3000:]
    assert "unschedulable" in err and "needs 1 workers x {'CPU': 2.0}" in err, err[-3000:]
    assert "can grow to 3 node(s)" in err and "the largest node {'CPU': 1.0}" in err, err[-3000:]
