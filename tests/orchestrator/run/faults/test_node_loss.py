"""A worker node lost mid-run, on a real loopback Ray cluster: the head has
no CPUs, so the run's Ray Train workers can only land on the worker node; that node is
SIGKILLed (every one of its processes at once, as a lost machine) while the run is held two
steps past its first registered checkpoint (``FaultPoint.HOLD_AT_STEP``, armed on that node
only), and a fresh node joins as an autoscaler would bring one. The study's
driver, the pack's trainer task and Ray Train's controller live on the head
(``progress.on_driver_node``), so they survive; Ray Train restarts the worker group on the new
node from the checkpoint on shared storage, and the study completes with every step logged
exactly once."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.run.faults import HOLD_FILE_ENV, FaultPoint
from tests.fixtures.cluster import process_alive
from tests.helpers import qk

pytestmark = [pytest.mark.slow, pytest.mark.stack]

TPS = 8 * 64  # tokens per optimizer step
STEPS = 40
CKPT_EVERY = STEPS // 10  # a checkpoint per eval: the spec's num_evals
HOLD_AT = CKPT_EVERY + 2  # the kill lands here: two steps past the first checkpoint, trained again after the resume
SPEC = """\
name: nodeloss
corpus: {{source: stdlib, max_documents: 60}}
tokenizer: {{vocab_size: 512}}
scales: [cpu-xs]
variants: [standard]
budget: {{mode: tokens, tokens: {tokens}}}
train: {{global_batch: 8, seq_len: 64, log_every_steps: 1}}
eval: {{num_evals: 10, max_windows: 4, final_max_windows: 8, diagnostics: false}}
resources: {{workers: 2, cpus_per_worker: 1, zero_stage: 2, max_retries: 3}}
workdir: {workdir}
"""


_qk = partial(qk, timeout=600)


def _job_status(url: str, job_id: str, env: dict[str, str]) -> str:
    # In a subprocess: Ray reads its auth settings once per process.
    code = f"from orchestrator.run.driver.submit import job_status; print(job_status({url!r}, {job_id!r}))"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


def _registered(storage: Path) -> bool:
    """A checkpoint Ray Train registered (in its snapshot): what a restarted worker group loads."""
    for snap in storage.rglob("checkpoint_manager_snapshot.json"):
        try:
            if json.loads(snap.read_text()).get("latest_checkpoint_result") is not None:
                return True
        except (OSError, ValueError):  # caught mid-write
            pass
    return False


def test_losing_the_worker_node_mid_run_resumes_on_a_new_node_and_the_study_completes(loopback_cluster):
    cluster = loopback_cluster(head_cpus=0)
    tmp = cluster.tmp
    held = tmp / "held"
    cluster.add_worker("nodea", cpus=2, env={FaultPoint.HOLD_AT_STEP.env: str(HOLD_AT), HOLD_FILE_ENV: str(held)})
    study_dir = tmp / "study"
    study_dir.mkdir()
    (study_dir / "nodeloss.yaml").write_text(SPEC.format(workdir=tmp / "work", tokens=STEPS * TPS))
    env = {**cluster.env, "QKSTUDY_CACHE": str(tmp / "cache")}

    res = _qk("submit", "nodeloss.yaml", "--address", cluster.url, "--no-wait", cwd=study_dir, env=env)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    deadline = time.time() + 600
    while not (held.exists() and _registered(tmp / "work" / "ray")):
        assert time.time() < deadline and _job_status(cluster.url, job_id, env) in ("PENDING", "RUNNING"), _qk(
            "logs", job_id, "--address", cluster.url, "--no-follow", cwd=study_dir, env=env
        ).stdout[-4000:]
        time.sleep(0.5)
    cluster.kill_node("nodea")
    t_kill = time.time()

    store = f"sqlite:///{tmp / 'work' / 'mlflow.db'}"
    c = MlflowClient(store)
    exp = c.get_experiment_by_name("nodeloss")
    (r,) = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    before = [m.step for m in c.get_metric_history(r.info.run_id, "train/loss")]
    assert before and CKPT_EVERY * TPS <= before[-1] <= HOLD_AT * TPS, before  # flushed up to its checkpoint at least

    cluster.add_worker("nodeb", cpus=2)
    deadline = time.time() + 600
    while (status := _job_status(cluster.url, job_id, env)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.time() < deadline, "the study did not end after the node loss"
        time.sleep(2)
    logs = _qk("logs", job_id, "--address", cluster.url, "--no-follow", cwd=study_dir, env=env).stdout
    assert status == "SUCCEEDED", logs[-4000:]

    (r,) = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    hist = c.get_metric_history(r.info.run_id, "train/loss")
    steps = [m.step for m in hist]
    assert steps == [TPS * i for i in range(1, STEPS + 1)], steps  # none twice, none lost
    assert r.data.tags["qkstudy.status"] == "finished" and int(r.data.tags.get("qkstudy.restarts", "0")) >= 1, r.data.tags
    resumed = int(r.data.tags["qkstudy.resumed_from_tokens"])
    # From the registered checkpoint, not from scratch, and none newer: the run was held before
    # its next one, and the node's workers died with it (``kill_node``: Ray workers outlive a
    # process-group kill, as they did before, step 60).
    assert resumed == CKPT_EVERY * TPS, (resumed, before[-1])
    first_new = min(m.timestamp for m in hist if m.step > before[-1]) / 1000
    print(
        f"\n[node loss] {len(before)} steps in MLflow when the node was killed, resumed from step {resumed // TPS} "
        f"on the new node: 0 logged twice, 0 lost; "
        f"training again {first_new - t_kill:.1f} s after the kill (new node start-up included)"
    )
    cluster.stop()  # now, not at the module's end: the next test starts a cluster of its own


def test_kill_node_leaves_none_of_its_workers(loopback_cluster):
    """The lost-machine model itself: a Ray worker on the node (in a session of its own, out of
    the node's process group) dies with the node; a process-group kill alone leaves it running."""
    cluster = loopback_cluster(head_cpus=0)
    cluster.add_worker("nodec", cpus=1)
    code = (
        f"import os, time, ray; ray.init(address='127.0.0.1:{cluster.gcs}', logging_level='ERROR')\n"
        "@ray.remote(num_cpus=1)\nclass A:\n    def pid(self): return os.getpid()\n"
        "a = A.remote(); print(ray.get(a.pid.remote()), flush=True); time.sleep(600)\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", code], env=cluster.env, stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([driver.stdout], [], [], 300)[0], "the actor was not placed on the node"
        pid = int(driver.stdout.readline())
        node, _ = cluster.nodes["nodec"]
        assert os.getpgid(pid) != os.getpgid(node.pid)  # why a process-group kill is not enough
        cluster.kill_node("nodec")
        assert not process_alive(pid)
    finally:
        driver.kill()
        driver.wait()
        cluster.stop()
