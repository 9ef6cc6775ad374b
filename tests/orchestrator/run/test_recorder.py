"""The worker's rank-0 recorder (real MLflow in SQLite) and the fault-injection step hook."""

import json
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.worker.recorder import Recorder, log_data_inputs
from orchestrator.run.worker.stall import KILL_AT_STEP_ENV, kill_hook_from_env
from orchestrator.track.tracking import create_run, ensure_experiment

SPEC = {
    "name": "rec",
    "scales": ["cpu-xs"],
    "variants": ["standard"],
    "tokenizer": {"vocab_size": 512},
    "budget": {"mode": "tokens", "tokens": 10 * 8 * 64},
    "train": {"global_batch": 8, "seq_len": 64},
}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    (run,) = plan(parse_spec(SPEC))
    uri = f"sqlite:///{tmp_path_factory.mktemp('rec') / 'mlflow.db'}"
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
    assert client.get_run(mlflow_id).data.tags["status"] == "running"
    rec.train_point(1, 5.0, 0.5, 1e-3, 0.1)
    rec.train_point(2, 4.0, 0.4, 2e-3, 0.2, grad_norm_max=7.5)  # a spike between the points
    rec.eval_point(2, 3.0, {"attn/entropy": 1.5})
    rec.checkpoint_point(2, {"checkpoint/bytes": 123.0})
    rec.eval_point(3, 2.5, {})
    rec.final_point(3, 2.0)
    rec.finished(3)
    r = client.get_run(mlflow_id)
    assert r.data.tags["status"] == "finished" and r.data.tags["final_tokens"] == str(3 * tps)
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
    assert all(v > 0 for _, v in _history(client, mlflow_id, "throughput/tokens_per_s"))
    assert "throughput/mfu" not in r.data.metrics  # CPU: no peak, no MFU
    assert "restarts" not in r.data.tags


def test_restart_is_counted_and_failure_recorded(store):
    run, uri, client, mlflow_id = store
    tps = run.train.tokens_per_step
    Recorder(run, uri, mlflow_id, None, active=True, devices=1).start(4)
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    rec.start(6)
    tags = client.get_run(mlflow_id).data.tags
    assert tags["restarts"] == "2" and tags["resumed_from_tokens"] == str(6 * tps)
    rec.train_point(7, 9.0, float("nan"), 1e-3, 1.0)
    rec.failed(7, "non-finite gradient norm at step 7")
    r = client.get_run(mlflow_id)
    assert r.data.tags["status"] == "failed" and r.info.status == "FAILED"
    assert r.data.tags["failure_reason"] == "non-finite gradient norm at step 7"
    assert r.data.tags["failed_at_tokens"] == str(7 * tps)
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
    assert r.data.metrics == {} and r.data.tags["status"] == "queued"


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


def test_kill_hook_only_when_asked(monkeypatch):
    monkeypatch.delenv(KILL_AT_STEP_ENV, raising=False)
    assert kill_hook_from_env() is None
    monkeypatch.setenv(KILL_AT_STEP_ENV, "0")
    assert kill_hook_from_env() is None
    code = (
        "import os\n"
        f"os.environ[{KILL_AT_STEP_ENV!r}] = '3'\n"
        "from orchestrator.run.worker.stall import kill_hook_from_env\n"
        "hook = kill_hook_from_env()\n"
        "hook(1); hook(2); print('alive at 2', flush=True)\n"
        "hook(3); print('alive at 3', flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 17 and out.stdout == "alive at 2\n", out.stderr[-2000:]


def test_a_branch_start_is_tagged_as_such_not_counted_as_a_restart(store):
    run, uri, client, mlflow_id = store
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    rec.start(6, branched=True)
    rec.finished(10)
    tags = client.get_run(mlflow_id).data.tags
    assert tags["branched_at_tokens"] == str(6 * run.train.tokens_per_step)
    assert "restarts" not in tags and "resumed_from_tokens" not in tags


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
