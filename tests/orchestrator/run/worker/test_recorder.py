"""The worker's rank-0 recorder (real MLflow in SQLite)."""

import json
import time

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.worker.recorder import NodePlace, Recorder, log_data_inputs
from orchestrator.track.tracking import create_run, ensure_experiment, run_status
from tests.helpers import mlflow_store, one_run_spec

SPEC = one_run_spec("rec")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    (run,) = plan(parse_spec(SPEC))
    uri = mlflow_store(tmp_path_factory.mktemp("rec"))
    client = MlflowClient(uri)
    return run, uri, client, ensure_experiment(client, "rec")


@pytest.fixture
def store(db):
    """A fresh MLflow run per test, in one store per module (creating a store takes seconds)."""
    run, uri, client, exp_id = db
    return run, uri, client, create_run(client, exp_id, run)


def _history(client, mlflow_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(mlflow_id, key)]


def test_rank_0_writes_the_run(store):
    run, uri, client, mlflow_id = store
    tps = run.train.tokens_per_step
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=2)
    rec.start(0)
    assert client.get_run(mlflow_id).data.tags["qkstudy.status"] == "running"
    rec.train_point(1, 5.0, 0.5, 1e-3, 0.1)
    rec.train_point(2, 4.0, 0.4, 2e-3, 0.2, grad_norm_max=7.5)  # a spike between the points
    rec.eval_point(2, 3.0, {"attn/entropy": 1.5})
    rec.checkpoint_point(2, {"checkpoint/bytes": 123.0})
    rec.eval_point(3, 2.5, {})
    rec.final_point(3, 2.0)
    rec.finished(3)
    r = client.get_run(mlflow_id)
    assert r.data.tags["qkstudy.status"] == "finished" and r.data.tags["qkstudy.final_tokens"] == str(3 * tps)
    assert r.info.status == "FINISHED"
    assert _history(client, mlflow_id, "train/loss") == [(tps, 5.0), (2 * tps, 4.0)]
    assert _history(client, mlflow_id, "grad_norm") == [(tps, 0.5), (2 * tps, 0.4)]  # the step's own
    assert _history(client, mlflow_id, "grad_norm_max") == [(tps, 0.5), (2 * tps, 7.5)]  # the interval's largest
    assert _history(client, mlflow_id, "flops") == [(tps, tps * run.flops_per_token), (2 * tps, 2 * tps * run.flops_per_token)]
    assert _history(client, mlflow_id, "val/loss") == [(2 * tps, 3.0), (3 * tps, 2.5)]  # the curve windows
    assert _history(client, mlflow_id, "val/ppl")[0][1] == pytest.approx(20.0855, rel=1e-4)  # e^3
    assert _history(client, mlflow_id, "final/val_loss") == [(3 * tps, 2.0)]  # the final pass
    assert _history(client, mlflow_id, "final/val_ppl") == [(3 * tps, pytest.approx(7.389056, rel=1e-6))]  # e^2
    assert "val/accuracy" not in r.data.metrics and "final/val_accuracy" not in r.data.metrics  # not labelled
    assert _history(client, mlflow_id, "checkpoint/bytes") == [(2 * tps, 123.0)]
    assert _history(client, mlflow_id, "attn/entropy") == [(2 * tps, 1.5)]
    # tokens per second of the steps' own time (wall_s 0.1 per step), whatever the clock did between
    assert _history(client, mlflow_id, "throughput/tokens_per_s") == [(tps, pytest.approx(tps / 0.1)), (2 * tps, pytest.approx(tps / 0.1))]
    assert "throughput/mfu" not in r.data.metrics  # CPU: no peak, no MFU
    assert "qkstudy.restarts" not in r.data.tags


def test_throughput_leaves_out_the_warm_up_step_and_what_ran_between_points(store):
    run, uri, client, mlflow_id = store
    tps = run.train.tokens_per_step
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    rec.start(4, wall_s=2.0)  # a resume: 4 steps and 2 s of training so far
    rec.warmed_up(5, 2.0)  # the attempt's first step: compiled and warmed up, not in wall_s
    rec.train_point(5, 3.0, 0.1, 1e-3, 2.0)  # no timed step since: no throughput at this point
    time.sleep(0.3)  # an eval, diagnostics, a checkpoint: not training
    rec.train_point(7, 2.9, 0.1, 1e-3, 2.5)
    rec.finished(7)
    assert _history(client, mlflow_id, "throughput/tokens_per_s") == [(7 * tps, pytest.approx(2 * tps / 0.5))]
    assert _history(client, mlflow_id, "time/wall_s") == [(5 * tps, 2.0), (7 * tps, 2.5)]


def test_restart_is_counted_and_failure_recorded(store):
    run, uri, client, mlflow_id = store
    tps = run.train.tokens_per_step
    Recorder(run, uri, mlflow_id, None, active=True, devices=1).start(4)
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    rec.start(6)
    tags = client.get_run(mlflow_id).data.tags
    assert tags["qkstudy.restarts"] == "2" and tags["qkstudy.resumed_from_tokens"] == str(6 * tps)
    rec.train_point(7, 9.0, float("nan"), 1e-3, 1.0)
    rec.failed(7, "non-finite gradient norm at step 7")
    r = client.get_run(mlflow_id)
    assert r.data.tags["qkstudy.status"] == "failed" and r.info.status == "FAILED"
    assert r.data.tags["qkstudy.failure_reason"] == "non-finite gradient norm at step 7"
    assert r.data.tags["qkstudy.failed_at_tokens"] == str(7 * tps)
    assert _history(client, mlflow_id, "train/loss") == [(7 * tps, 9.0)] and "grad_norm" not in r.data.metrics


def test_other_ranks_write_nothing(store):
    run, uri, client, mlflow_id = store
    # Not even a client: an unreachable store is never contacted from rank 1.
    rec = Recorder(run, "http://127.0.0.1:1", mlflow_id, None, active=False, devices=2)
    rec.start(3)
    rec.train_point(4, 1.0, 1.0, 1e-3, 1.0)
    rec.eval_point(4, 1.0, {}, accuracy=0.5)
    rec.final_point(4, 1.0, accuracy=0.5)
    rec.checkpoint_point(4, {"checkpoint/bytes": 1.0})
    rec.failed(4, "x")
    rec.finished(4)
    r = client.get_run(mlflow_id)
    assert r.data.metrics == {} and r.data.tags["qkstudy.status"] == "queued"


def test_labelled_corpora_log_accuracy(store):
    run, uri, client, mlflow_id = store
    tps = run.train.tokens_per_step
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    rec.start(0)
    rec.eval_point(2, 1.5, {}, accuracy=0.25)
    rec.eval_point(4, 1.0, {}, accuracy=0.75)
    rec.final_point(4, 0.9, accuracy=0.8)
    assert _history(client, mlflow_id, "val/accuracy") == [(2 * tps, 0.25), (4 * tps, 0.75)]
    assert _history(client, mlflow_id, "final/val_accuracy") == [(4 * tps, 0.8)]


def test_a_branch_start_is_tagged_as_such_not_counted_as_a_restart(store):
    run, uri, client, mlflow_id = store
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    rec.start(6, branched=True)
    rec.finished(10)
    tags = client.get_run(mlflow_id).data.tags
    assert tags["qkstudy.branched_at_tokens"] == str(6 * run.train.tokens_per_step)
    assert "qkstudy.restarts" not in tags and "qkstudy.resumed_from_tokens" not in tags


def test_time_split_is_written_once_even_when_a_retry_finds_its_step_logged(store):
    """An attempt that logged its last step's points and died before the split (in the final
    weights' save): the retry's points at that step are dropped as already logged, but its split
    is written; a later retry does not write it twice."""
    run, uri, client, mlflow_id = store
    tps = run.train.tokens_per_step
    first = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    first.start(0)
    first.train_point(3, 2.0, 0.1, 1e-3, 0.3)
    first.final_point(3, 2.0)  # flushed; then the attempt dies
    split = {"time/elapsed_s": 9.0, "time/step_s": 6.0}
    for _ in range(2):
        rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
        rec.start(3)
        rec.train_point(3, 2.0, 0.1, 1e-3, 0.3)  # MLflow has step 3: dropped
        rec.time_split(3, split)
        rec.finished(3)
    assert _history(client, mlflow_id, "train/loss") == [(3 * tps, 2.0)]
    assert _history(client, mlflow_id, "time/elapsed_s") == [(3 * tps, 9.0)]
    assert _history(client, mlflow_id, "time/step_s") == [(3 * tps, 6.0)]


def test_the_train_and_val_splits_are_the_runs_dataset_inputs_once(db):
    run, uri, client, exp = db
    mlflow_run = client.create_run(exp).info.run_id
    for _ in range(2):  # a resumed run logs them again: nothing is added
        log_data_inputs(client, mlflow_run, "stdlib", "/cache/data/abc", "f" * 64)
    inputs = client.get_run(mlflow_run).inputs.dataset_inputs
    got = sorted((i.tags[0].value, i.dataset.name, json.loads(i.dataset.profile)["split"]) for i in inputs)
    assert got == [("training", "stdlib", "train"), ("validation", "stdlib/val", "val")]
    assert {i.dataset.digest for i in inputs} == {"f" * 36} and {i.dataset.source_type for i in inputs} == {"local"}


# --------------------------------------------------------------------------- system metrics per node
# The local rank 0 of each node samples its machine into the run, under ``system/node<k>/...``
# when the run spans several nodes and the plain ``system/...`` names on one; any other local
# rank samples nothing. The "nodes" are Recorders in one process told different NodePlaces.
CPU = "cpu_utilization_percentage"


@pytest.fixture
def sampled_store(store, monkeypatch):
    """``store`` with MLflow's system-metrics monitor sampling every 0.2 s."""
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_NODE_ID", raising=False)
    return store


def _system(client, mlflow_id) -> set[str]:
    return {k for k in client.get_run(mlflow_id).data.metrics if k.startswith("system/")}


def test_each_nodes_local_rank_0_logs_its_own_system_metrics(sampled_store):
    run, uri, client, mlflow_id = sampled_store
    # a run of four workers on two nodes (two each), and a local rank 1 on a third "node"
    head = Recorder(run, uri, mlflow_id, None, active=True, devices=4, node=NodePlace(local_rank=0, node_rank=0, multi_node=True))
    other = Recorder(run, uri, mlflow_id, None, active=False, devices=4, node=NodePlace(local_rank=0, node_rank=1, multi_node=True))
    idle = Recorder(run, uri, mlflow_id, None, active=False, devices=4, node=NodePlace(local_rank=1, node_rank=2, multi_node=True))
    for rec in (head, other, idle):
        rec.start(0)
    assert idle.sysmon is None  # negative control: one process per node samples
    time.sleep(1.5)
    for rec in (idle, other, head):  # the run's workers end it together, rank 0 marks it
        rec.finished(3)
    keys = _system(client, mlflow_id)
    assert f"system/node0/{CPU}" in keys and f"system/node1/{CPU}" in keys, keys
    assert "system/node0/system_memory_usage_megabytes" in keys and "system/node1/system_memory_usage_megabytes" in keys
    assert {k.split("/")[1] for k in keys} == {"node0", "node1"}  # no plain names, nothing from node 2
    for node in ("node0", "node1"):
        assert len(client.get_metric_history(mlflow_id, f"system/{node}/{CPU}")) >= 2
    assert run_status(client.get_run(mlflow_id)) == "finished"  # rank 0 alone ended the run


def test_a_single_node_run_keeps_the_plain_names(sampled_store):
    run, uri, client, mlflow_id = sampled_store
    head = Recorder(run, uri, mlflow_id, None, active=True, devices=2, node=NodePlace(local_rank=0, node_rank=0, multi_node=False))
    second = Recorder(run, uri, mlflow_id, None, active=False, devices=2, node=NodePlace(local_rank=1, node_rank=0, multi_node=False))
    head.start(0)
    second.start(0)
    time.sleep(0.8)
    second.finished(3)
    head.finished(3)
    keys = _system(client, mlflow_id)
    assert f"system/{CPU}" in keys and "system/system_memory_usage_megabytes" in keys, keys
    assert not any(k.startswith("system/node") for k in keys)


def test_a_local_rank_other_than_0_logs_nothing(sampled_store):
    run, uri, client, mlflow_id = sampled_store
    rec = Recorder(run, uri, mlflow_id, None, active=False, devices=2, node=NodePlace(local_rank=1, node_rank=1, multi_node=True))
    rec.start(0)
    time.sleep(0.6)
    rec.finished(3)
    assert client.get_run(mlflow_id).data.metrics == {}
    # not even contacted: an unreachable store is fine off local rank 0
    far = Recorder(
        run, "http://127.0.0.1:1", mlflow_id, None, active=False, devices=2, node=NodePlace(local_rank=1, node_rank=1, multi_node=True)
    )
    far.start(0)
    far.finished(3)
