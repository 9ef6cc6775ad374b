"""The fault machinery as the product wires it, without Ray: a held study lease refuses a second
driver (exit 2, holder named) and shows in `qkstudy status`; a stalled worker records the
section and stack in MLflow and ends its process; the recorder logs MLflow system metrics and
the training data as a dataset input; a SQLite store keeps artifacts in the study's folder;
`submit` names the job in the lease's environment; `qkstudy eval` of a run without final
weights exits 2. Real MLflow (SQLite), real leases, real watchdog threads."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.submit import build_job
from orchestrator.run.worker.recorder import Recorder
from orchestrator.run.worker.stall import WorkerGuard, stuck_reason
from orchestrator.run.worker.watchdog import STALL_EXIT_CODE, WatchdogLimits
from orchestrator.track import lease as lease_mod
from orchestrator.track.lease import JOB_ID_ENV, STUDY_LEASE, Lease, run_lease_name
from orchestrator.track.status import study_lease_line, study_status
from orchestrator.track.tracking import artifact_location, create_run, ensure_experiment
from tests.helpers import REPO, driver_env, finish_driver, mlflow_store, one_run_spec, start_driver

SPEC = one_run_spec("wiring")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store in a study folder, with one planned run's MLflow record."""
    d = tmp_path_factory.mktemp("wiring")
    (run,) = plan(parse_spec(SPEC))
    uri = mlflow_store(d)
    client = MlflowClient(uri)
    exp_id = ensure_experiment(client, "wiring")
    return d, run, uri, client, exp_id


def test_embedded_store_keeps_artifacts_in_the_study_folder(store, tmp_path):
    d, run, uri, client, exp_id = store
    assert client.get_experiment(exp_id).artifact_location == (d / "artifacts").as_uri()
    mlflow_id = create_run(client, exp_id, run)
    client.log_text(mlflow_id, "hello", "note.txt")
    assert (d / "artifacts" / mlflow_id / "artifacts" / "note.txt").read_text() == "hello"
    assert not (Path.cwd() / "mlruns").exists() or not any((Path.cwd() / "mlruns").rglob(mlflow_id))
    # a server decides its own artifact store; an in-memory SQLite has no folder
    assert artifact_location("http://mlflow:5000") is None and artifact_location("sqlite://") is None


def test_recorder_logs_system_metrics_and_the_training_and_validation_data(store, monkeypatch):
    d, run, uri, client, exp_id = store
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.5")
    mlflow_id = create_run(client, exp_id, run)
    content = "ab" * 32  # a 64-hex-digit content hash
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1, data=("stdlib", str(d / "data"), content))
    rec.start(0)
    time.sleep(2.5)  # a few samples
    rec.train_point(1, 5.0, 0.5, 1e-3, 0.1)
    rec.finished(1)
    r = client.get_run(mlflow_id)
    system = {k for k in r.data.metrics if k.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system, system
    assert len(client.get_metric_history(mlflow_id, "system/cpu_utilization_percentage")) >= 2
    inp, val = sorted(r.inputs.dataset_inputs, key=lambda i: i.dataset.name)
    assert (inp.dataset.name, inp.dataset.digest) == ("stdlib", content[:36])
    assert (val.dataset.name, [(t.key, t.value) for t in val.tags]) == ("stdlib/val", [("mlflow.data.context", "validation")])
    assert json.loads(inp.dataset.profile)["content_hash"] == content
    assert json.loads(inp.dataset.source) == {"uri": str(d / "data")} and inp.dataset.source_type == "local"
    assert [(t.key, t.value) for t in inp.tags] == [("mlflow.data.context", "training")]
    # a resumed run logs them again: still the two inputs
    rec2 = Recorder(run, uri, mlflow_id, None, active=True, devices=1, data=("stdlib", str(d / "data"), content))
    rec2.start(1)
    rec2.finished(1)
    assert len(client.get_run(mlflow_id).inputs.dataset_inputs) == 2


def test_a_stalled_step_is_recorded_with_section_and_stack_and_ends_the_process(store):
    d, run, uri, client, exp_id = store
    mlflow_id = create_run(client, exp_id, run)
    exits: list[int] = []
    done = threading.Event()
    guard = WorkerGuard(0, uri, WatchdogLimits(step=0.3), exit=lambda code: (exits.append(code), done.set()))
    rec = Recorder(run, uri, mlflow_id, None, active=True, devices=1)
    rec.start(0)
    rec.train_point(1, 5.0, 0.5, 1e-3, 0.1)  # queued, not yet written when the next step hangs
    guard.loop = SimpleNamespace(run=run, mlflow_run_id=mlflow_id, rec=rec)
    release = threading.Event()

    def stuck_in_allreduce() -> None:
        release.wait(60)

    def step() -> None:
        with guard.section("step"):
            stuck_in_allreduce()

    guard.start()
    t = threading.Thread(target=step)
    t.start()
    assert done.wait(60), "the watchdog never fired"
    release.set()
    t.join()
    guard.watchdog.stop()
    assert exits == [STALL_EXIT_CODE]
    r = client.get_run(mlflow_id)
    assert r.data.tags["qkstudy.status"] == "failed" and r.info.status == "FAILED"
    reason = r.data.tags["qkstudy.failure_reason"]
    assert reason.startswith("no progress: section 'step' ran") and "stuck_in_allreduce" in reason
    assert r.data.tags["qkstudy.stall.section"] == "step" and float(r.data.tags["qkstudy.stall.elapsed_s"]) >= 0.3
    stacks = (d / "artifacts" / mlflow_id / "artifacts" / "stall" / "stacks.txt").read_text()
    assert "<- stuck" in stacks and "stuck_in_allreduce" in stacks
    tps = run.train.tokens_per_step
    assert [(m.step, m.value) for m in client.get_metric_history(mlflow_id, "train/loss")] == [(tps, 5.0)]  # not lost


def test_stall_reason_keeps_the_innermost_frames_of_the_stuck_thread():
    frames = "".join(f'  File "m.py", line {i}, in outer_{i}\n    call()\n' for i in range(400))
    stacks = (
        "Thread 'MainThread' (ident 1) <- stuck:\n"
        + frames
        + '  File "c.py", line 9, in innermost\n    wait()\n'
        + "\nThread 'other' (ident 2):\n  File \"o.py\", line 1, in elsewhere\n"
    )
    reason = stuck_reason("eval", 75.0, 60.0, stacks)
    assert reason.startswith("no progress: section 'eval' ran 75 s, past its 60 s bound")
    assert len(reason) <= 4000 and reason.endswith("in innermost\n    wait()\n")
    assert "Thread 'MainThread' (ident 1) <- stuck:\n  ...\n" in reason and "elsewhere" not in reason
    assert "outer_0" not in reason and "outer_399" in reason


def test_submit_names_the_job_in_its_environment(tmp_path, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "tracking_uri": "http://mlflow:5000", "storage_path": "/shared/s"}))
    monkeypatch.setenv("QKSTUDY_WATCHDOG", "step=600")
    a, b = (build_job(spec, "http://127.0.0.1:8265", working_dir=tmp_path) for _ in range(2))
    env = a["runtime_env"]["env_vars"]
    assert env[JOB_ID_ENV] == a["submission_id"] != b["submission_id"]
    assert a["submission_id"].startswith("raysubmit_") and len(a["submission_id"]) == len("raysubmit_") + 16
    assert env["QKSTUDY_WATCHDOG"] == "step=600"


def _busy_spec(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, f in enumerate(sorted((REPO / "orchestrator" / "run").glob("*.py"))[:6]):
        (docs / f"d{i}.txt").write_text(f.read_text()[:4000])
    spec = {**SPEC, "name": "busy", "corpus": {"source": "text", "paths": ["docs"]}, "workdir": str(tmp_path / "w")}
    (tmp_path / "busy.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "busy.yaml"


def test_second_driver_exits_2_naming_the_holder_and_status_shows_it(tmp_path):
    spec = _busy_spec(tmp_path)
    storage = str(tmp_path / "w" / "ray")
    held = Lease(storage, STUDY_LEASE).acquire()  # this test process is the live driver
    run_lease = Lease(storage, run_lease_name("abc123")).acquire()
    try:
        p = start_driver(spec, driver_env())
        stderr = finish_driver(p, timeout=300)  # one that went on to train is killed with all it started
        assert p.returncode == 2, stderr[-3000:]
        flat = " ".join(stderr.split())
        assert f"study 'busy' is being run by pid {os.getpid()} on host" in flat, flat
        assert "watch it with `qkstudy status busy`" in flat and "qkstudy run --wait" in flat
        assert not (tmp_path / "w" / "mlflow.db").exists()  # refused before MLflow (and Ray)
        line = study_lease_line("busy", parse_spec(yaml.safe_load(spec.read_text())))
        assert line.startswith(f"study lease: held by pid {os.getpid()} on host") and "heartbeat" in line
        res = CliRunner().invoke(app, ["status", str(spec), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["study_lease"].startswith(f"study lease: held by pid {os.getpid()} on host")
    finally:
        held.release()
        run_lease.release()
    assert study_lease_line("busy", parse_spec(yaml.safe_load(spec.read_text()))) == "study lease: free"


def test_status_rows_name_each_runs_lease_holder_and_a_stale_one(store, tmp_path, monkeypatch):
    d, run, uri, client, exp_id = store
    monkeypatch.chdir(tmp_path)  # a study known by name keeps its leases in runs/<name>/ray
    storage = str(tmp_path / "runs" / "wiring" / "ray")
    create_run(client, exp_id, run)
    assert {r["lease"] for r in study_status("wiring", uri) if r["run_id"] == run.run_id} == {""}
    lease = Lease(storage, run_lease_name(run.run_id)).acquire()
    try:
        (row,) = [r for r in study_status("wiring", uri) if r["run_id"] == run.run_id]
        assert row["lease"].startswith(f"pid {os.getpid()} on host") and "presumed dead" not in row["lease"]
    finally:
        lease.release()
    # a holder whose heartbeat stopped 5 minutes ago (its file as a killed holder leaves it)
    gen = Path(storage, "leases", STUDY_LEASE)
    gen.mkdir(parents=True)
    old = time.time() - 300
    (gen / "000000000001.json").write_text(
        json.dumps({"host": "elsewhere", "pid": 4242, "job_id": "raysubmit_x", "started": old, "heartbeat": old, "token": "t"})
    )
    line = study_lease_line("wiring")
    assert line.startswith("study lease: held by pid 4242 on host elsewhere (Ray job raysubmit_x), heartbeat 30")
    assert "presumed dead" in line
    # a killed driver on this machine: its heartbeat is fresh, its process gone (the live holder
    # above, this process, is the control)
    gone = subprocess.Popen(["true"])
    gone.wait()
    now = time.time()
    holder = {"host": "here", "pid": gone.pid, "job_id": None, "started": now, "heartbeat": now, "token": "t", "node": lease_mod._node_id()}
    (gen / "000000000002.json").write_text(json.dumps(holder))
    line = study_lease_line("wiring")
    assert line.startswith(f"study lease: held by pid {gone.pid} on host here, heartbeat 0")
    assert line.endswith("(its process on this machine is gone: dead, the next driver takes over)"), line


def test_eval_of_a_run_without_final_weights_exits_2(store, monkeypatch):
    d, run, uri, client, exp_id = store
    create_run(client, exp_id, run)
    res = CliRunner().invoke(app, ["eval", "wiring", run.run_id[:8], "--tracking-uri", uri])
    assert res.exit_code == 2 and "has no final weights" in res.output, res.output
    res = CliRunner().invoke(app, ["sample", "wiring", "nope", "--prompt", "x", "--tracking-uri", uri])
    assert res.exit_code == 2 and "matches no run" in res.output, res.output


def test_a_pack_skips_the_runs_whose_lease_another_holder_has(tmp_path):
    from orchestrator.run.driver.leasing import STATUS_HELD, run_leases
    from orchestrator.run.driver.packing import fit_pack
    from orchestrator.track.lease import read_lease

    storage = str(tmp_path / "ray")
    items = [{"run": {"run_id": rid}, "mlflow_run_id": f"m-{rid}"} for rid in ("aaa", "bbb")]
    other = Lease(storage, run_lease_name("aaa")).acquire()  # a live pack (this process) trains aaa
    try:
        with run_leases(items, storage) as (mine, held):
            assert [i["run"]["run_id"] for i in mine] == ["bbb"]
            assert read_lease(storage, run_lease_name("bbb")).pid == os.getpid()
            assert set(held) == {"aaa"} and held["aaa"]["status"] == STATUS_HELD
            assert f"pid {os.getpid()} on host" in held["aaa"]["reason"] and "another driver trains it" in held["aaa"]["reason"]
        assert read_lease(storage, run_lease_name("bbb")) is None  # released with the block
        # a pack whose every run is held elsewhere starts no trainer and reports them (the task's body, no Ray)
        out = fit_pack._function("pack", items[:1], "sqlite:///unused.db", storage, None)
        assert set(out) == {"aaa"} and out["aaa"]["status"] == STATUS_HELD
        assert out["aaa"]["reason"].startswith(f"its run lease is held by pid {os.getpid()} on host")
    finally:
        other.release()
