"""Faults a real study meets, end to end through `qkstudy` subprocesses, real Ray, DeepSpeed and
MLflow (SQLite): two drivers of one study, a driver killed with SIGKILL, a step that never
returns, a torch-extension build lock left by a killed build; and what a finished run keeps
(final weights that `qkstudy eval` / `qkstudy sample` use, system metrics, its dataset input).

Each test prints what it measured (points lost, steps repeated, seconds to recover): run with
`-s` to see them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    REPO,
    SHM_OP,
    TINY_SPEC,
    TPS,
    assert_every_step_once,
    built_shm_op,
    driver_env,
    finish_driver,
    plan_json,
    qk,
    reap_driver,
    start_driver,
    steps,
    study_runs,
    write_spec,
)

pytestmark = [pytest.mark.slow, pytest.mark.stack]


def test_two_drivers_at_once_train_each_run_exactly_once_and_a_waiter_finds_it_done(tmp_path):
    spec = write_spec(tmp_path, "twice", variants=["standard", "coupled"], resources={"workers": 1, "cpus_per_worker": 1, "zero_stage": 2})
    env = driver_env()
    a, b = start_driver(spec, env), start_driver(spec, env)
    try:
        deadline = time.time() + 300
        while a.poll() is None and b.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        loser, winner = (a, b) if a.poll() is not None else (b, a)
        lose_err = finish_driver(loser, 60)
        assert loser.returncode == 2, lose_err[-3000:]
        flat = " ".join(lose_err.split())
        assert f"study 'twice' is being run by pid {winner.pid} on host" in flat, flat
        assert "watch it with `qkstudy status twice`" in flat and "Traceback" not in lose_err
        t_wait = time.time()
        waiter = start_driver(spec, env, "--wait")
        win_err = finish_driver(winner)
        t_winner_done = time.time()
        wait_err = finish_driver(waiter)
        t_waiter_done = time.time()
    finally:
        for p in (a, b):
            reap_driver(p)
    assert winner.returncode == 0, win_err[-3000:]
    assert waiter.returncode == 0, wait_err[-3000:]
    assert f"waiting for the driver that runs twice: pid {winner.pid}" in " ".join(wait_err.split())
    assert "2 run(s) already finished in MLflow: skipped (Ray not started)" in wait_err
    plan = plan_json(spec)
    c, runs = study_runs(tmp_path, "twice")
    assert sorted(runs) == sorted(p["run_id"] for p in plan)  # one MLflow run per planned run
    repeated = 0
    for p in plan:
        r = runs[p["run_id"]]
        logged = steps(c, r.info.run_id)
        repeated += len(logged) - len(set(logged))
        assert_every_step_once(logged, 20)
        assert len(c.get_metric_history(r.info.run_id, "final/val_loss")) == 1
        assert r.data.tags["qkstudy.status"] == "finished" and "qkstudy.restarts" not in r.data.tags
    print(
        f"\n[two drivers] loser exit 2 naming pid {winner.pid}; steps repeated: {repeated}; "
        f"waiter (--wait, started {t_wait:.0f}) took the lease {t_waiter_done - t_winner_done:.1f} s after the holder ended"
    )


def _registered(snapshot: Path) -> bool:
    try:
        return json.loads(snapshot.read_text()).get("latest_checkpoint_result") is not None
    except (OSError, ValueError):  # not written yet, or caught mid-write
        return False


def test_killed_driver_is_taken_over_at_once_and_resumes_with_no_repeated_step(tmp_path):
    # 40 steps, a checkpoint every 4; the run is held two steps past its first (a fault point),
    # so the kill lands mid-run at a known step whatever the machine's speed
    steps_total, ckpt_every = 40, 4
    hold_at, held = ckpt_every + 2, tmp_path / "held"
    spec = write_spec(
        tmp_path,
        "killed",
        budget={"mode": "tokens", "tokens": steps_total * TPS},
        eval={**TINY_SPEC["eval"], "num_evals": steps_total // ckpt_every},
        resources={"workers": 2, "cpus_per_worker": 1, "zero_stage": 2},
    )
    (run,) = plan_json(spec)
    env = driver_env(QKSTUDY_TEST_HOLD_AT_STEP=str(hold_at), QKSTUDY_TEST_HOLD_FILE=str(held))
    first = start_driver(spec, env)
    try:
        # a checkpoint Ray Train registered (in its snapshot), not only written: that is what a new trainer resumes
        snapshot = tmp_path / "runs/killed/ray" / run["run_id"] / "checkpoint_manager_snapshot.json"
        deadline = time.time() + 600
        while time.time() < deadline and first.poll() is None and not (held.exists() and _registered(snapshot)):
            time.sleep(0.2)
        assert held.exists() and _registered(snapshot), "the run was not held past a registered checkpoint"
        os.kill(first.pid, signal.SIGKILL)  # the driver only, as a user's kill -9 would
        t_kill = time.time()
        first.wait()
        c, runs = study_runs(tmp_path, "killed")
        logged_before = steps(c, runs[run["run_id"]].info.run_id)
        assert logged_before and ckpt_every * TPS <= logged_before[-1] <= hold_at * TPS, logged_before
        second = start_driver(spec, env)
        err = finish_driver(second)
    finally:
        reap_driver(first)
    assert second.returncode == 0, err[-3000:]
    flat = " ".join(err.split())
    assert f"study lease: took over from pid {first.pid} on host" in flat, flat
    assert f"its process (pid {first.pid}) is gone from this machine" in flat
    lease_file = next((tmp_path / "runs/killed/ray/leases/study").glob("*.json"))
    took_over_s = json.loads(lease_file.read_text())["started"] - t_kill
    c, runs = study_runs(tmp_path, "killed")
    r = runs[run["run_id"]]
    assert_every_step_once(steps(c, r.info.run_id), steps_total)
    assert r.data.tags["qkstudy.status"] == "finished" and r.data.tags.get("qkstudy.restarts") == "1", (r.data.tags, err[-3000:])
    # From the checkpoint the run was held past, not from scratch: its Ray workers, held until
    # the driver's reaper ended them, registered none newer.
    resumed = int(r.data.tags["qkstudy.resumed_from_tokens"])
    assert resumed == ckpt_every * TPS, resumed
    print(
        f"\n[kill -9] {len(logged_before)} steps in MLflow at the kill, resumed from step {resumed // TPS}: "
        f"0 logged twice, 0 lost; lease taken over {took_over_s:.1f} s after the kill (driver start-up included)"
    )


def _extensions_dir(tmp: Path) -> Path:
    """A private TORCH_EXTENSIONS_DIR holding the built shm op (copied from the user's cache
    when built there, else built by the install-time prebuild), so a planted lock blocks only
    this test's runs."""
    ext = tmp / "torch_extensions"
    built = built_shm_op()
    if built is not None:
        shutil.copytree(built, ext / SHM_OP, ignore=shutil.ignore_patterns("lock"))
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.run.ext_lock", "--prebuild"],
        cwd=REPO,
        env=driver_env(TORCH_EXTENSIONS_DIR=str(ext), PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0 and "deepspeed_shm_comm" in out.stdout and "ready" in out.stdout, out.stderr[-2000:]
    return ext


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """A two-run study (the standard run and its 2x extend, two ZeRO-3 workers each): a stale
    build lock is planted before it starts, and the extend run's 25th step never returns
    (the base run has 20 steps) under a 20 s step bound."""
    d = tmp_path_factory.mktemp("faulty")
    spec = write_spec(d, "faulty", extend=[2], resources={"workers": 2, "cpus_per_worker": 1, "zero_stage": 3})
    ext = _extensions_dir(d)
    lock = ext / "deepspeed_shm_comm" / "lock"
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))  # as a build killed while holding it leaves it
    os.utime(lock, (time.time() - 3600, time.time() - 3600))
    env = driver_env(
        TORCH_EXTENSIONS_DIR=str(ext),
        QKSTUDY_WATCHDOG="step=20",
        QKSTUDY_TEST_BLOCK_AT_STEP="25",
        MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="1",
    )
    t0 = time.time()
    p = start_driver(spec, env, "-v")
    err = finish_driver(p)
    reap_driver(p)
    (d / "driver.err").write_text(err)  # for a failing test's reader
    plan = {("extend" if r["extend"] == 2 else "base"): r for r in plan_json(spec)}
    return d, spec, plan, p.returncode, err, lock, time.time() - t0


def test_blocked_step_fails_its_run_with_section_and_stack_and_the_study_goes_on(faulty):
    d, _, plan, code, err, _, wall = faulty
    assert code == 1, err[-3000:]  # one run failed
    c, runs = study_runs(d, "faulty")
    stuck, ok = runs[plan["extend"]["run_id"]], runs[plan["base"]["run_id"]]
    assert ok.data.tags["qkstudy.status"] == "finished"
    assert_every_step_once(steps(c, ok.info.run_id), 20)
    assert stuck.data.tags["qkstudy.status"] == "failed" and stuck.info.status == "FAILED"
    reason = stuck.data.tags["qkstudy.failure_reason"]
    assert reason.startswith("no progress: section 'step' ran") and "past its 20 s bound" in reason, reason
    assert "in block" in reason and "<- stuck" in reason  # the stuck thread's stack, the hook on top
    assert stuck.data.tags["qkstudy.stall.section"] == "step"
    elapsed = float(stuck.data.tags["qkstudy.stall.elapsed_s"])
    assert 20 <= elapsed < 40
    stacks = Path(c.download_artifacts(stuck.info.run_id, "stall/stacks.txt", str(d)))
    assert "threading.Event().wait()" in stacks.read_text()
    # every step trained before the hang is in MLflow (the queued ones written by the stall), none after
    assert_every_step_once(steps(c, stuck.info.run_id), 25)
    assert "section 'step'" in err and "watchdog: rank 0" in err and "watchdog: rank 1" in err  # the log
    assert "final_weights.sha256" not in stuck.data.tags
    print(f"\n[blocked step] stall reported {elapsed:.1f} s into the step (bound 20 s); study of 2 runs in {wall:.0f} s")


def test_stale_extension_lock_is_cleared_and_said_in_the_log(faulty):
    d, _, plan, _, err, lock, _ = faulty
    assert not lock.exists()
    assert f"removed stale torch-extension build lock {lock}" in " ".join(err.split())
    c, runs = study_runs(d, "faulty")
    assert runs[plan["base"]["run_id"]].data.tags["qkstudy.status"] == "finished"


def test_eval_of_the_final_weights_gives_the_runs_final_val_loss_and_sample_prints_text(faulty):
    d, spec, plan, *_ = faulty
    c, runs = study_runs(d, "faulty")
    r = runs[plan["base"]["run_id"]]
    out = qk("eval", spec.name, plan["base"]["run_id"][:10], "--max-windows", "8", "--json", cwd=d, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    final = r.data.metrics["final/val_loss"]
    assert res["windows"] == 8 and res["recorded_final_val_loss"] == final
    assert abs(res["val_loss"] - final) < 1e-4, (res["val_loss"], final)
    # all windows is another sample of the same split: near, not equal
    alls = json.loads(qk("eval", spec.name, r.info.run_name, "--json", cwd=d, timeout=600).stdout)
    assert alls["windows"] > 8 and abs(alls["val_loss"] - final) < 0.5 and alls["val_loss"] != res["val_loss"]
    out = qk("sample", spec.name, r.info.run_name, "--prompt", "def ", "-n", "24", "--seed", "1", cwd=d, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("def") and len(out.stdout.strip()) > len("def ") + 10, out.stdout
    # the failed run kept no weights: exit 2 with the reason
    out = qk("eval", spec.name, plan["extend"]["run_id"], cwd=d, timeout=600)
    assert out.returncode == 2 and "has no final weights" in out.stderr, out.stderr[-2000:]
    print(
        f"\n[final weights] eval {res['val_loss']:.6f} vs final/val_loss {final:.6f} "
        f"(|diff| {abs(res['val_loss'] - final):.1e}) over the final pass's 8 windows"
    )


def test_a_run_keeps_its_artifacts_system_metrics_and_dataset_input_in_the_study(faulty):
    d, _, plan, *_ = faulty
    c, runs = study_runs(d, "faulty")
    r = runs[plan["base"]["run_id"]]
    assert r.info.artifact_uri.startswith((d / "runs" / "faulty" / "artifacts").as_uri())
    model = c.get_logged_model(r.data.tags["qkstudy.final_model_id"])  # the final weights, beside the run's artifacts
    assert model.source_run_id == r.info.run_id and model.artifact_location.startswith((d / "runs" / "faulty" / "artifacts").as_uri())
    assert (Path(model.artifact_location.removeprefix("file://")) / "model.safetensors").is_file()
    assert not (d / "mlruns").exists()
    assert "system/cpu_utilization_percentage" in r.data.metrics and "system/system_memory_usage_megabytes" in r.data.metrics
    inputs = {i.tags[0].value: i.dataset for i in r.inputs.dataset_inputs}  # context -> dataset
    digest = r.data.params["data_hash"]
    assert {c: (d.name, d.digest) for c, d in inputs.items()} == {
        "training": ("stdlib", digest[:36]),
        "validation": ("stdlib/val", digest[:36]),
    }
    assert {c: json.loads(d.profile)["split"] for c, d in inputs.items()} == {"training": "train", "validation": "val"}
    assert all(json.loads(d.profile)["content_hash"] == digest for d in inputs.values())
    assert json.loads(inputs["training"].source)["uri"] == r.data.params["data_path"]
