"""A tracking server that goes away and comes back loses no point and writes none twice: a
real `mlflow server` on loopback (SQLite backend), stopped and restarted on the same port and
store. Fast: the ``MetricBuffer`` alone against the stopped server. Slow: a whole study
(`qkstudy run`, Ray, DeepSpeed) whose server is down for longer than one flush interval
mid-run. Prints what it measured with `-s`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.track.http_env import apply_http_env
from orchestrator.track.metric_buffer import MetricBuffer, OutagePolicy, TrackingOutage
from orchestrator.track.tracking import last_logged_step
from tests.helpers import TINY_SPEC, TPS, driver_env, finish_driver, free_port, reap_driver, start_driver


class Server:
    """`mlflow server` over one SQLite file on a fixed loopback port, restartable."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.root, self.url = root, f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it; seconds until it answers /health."""
        t0 = time.time()
        self.proc = proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("mlflow")),
                "server",
                "--backend-store-uri",
                f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ],
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        while time.time() < t0 + 180:  # a loaded 2-core machine has taken over 100 s to start one
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return time.time() - t0
            except OSError:
                assert proc.poll() is None, "mlflow server exited during start-up"
                time.sleep(0.25)
        raise AssertionError("mlflow server did not answer /health within 180 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # as a crashed server: no goodbye
            self.proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path):
    apply_http_env()  # the settings every run uses (track.http_env): each failed write is quick
    srv = Server(tmp_path)
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.slow  # a real `mlflow server`, stopped and restarted
def test_points_are_kept_while_the_server_is_down_and_written_once_when_it_is_back(server):
    client = MlflowClient(server.url)
    run_id = client.create_run(client.create_experiment("outage")).info.run_id
    notes: list[str] = []
    buf = MetricBuffer(client, run_id, policy=OutagePolicy(max_outage_s=120, first_backoff_s=0.5, max_backoff_s=2), log=notes.append)
    buf.add({"loss": 1.0}, 1)
    assert buf.flush() and buf.pending == 0
    server.stop()
    for step in range(2, 12):
        buf.add({"loss": float(step), "lr": 0.1}, step)
    t0 = time.monotonic()
    assert buf.flush() is False and buf.pending == 20  # nothing dropped on the failed write
    assert "keeping 20 point(s)" in notes[0]
    assert buf.flush() is False and buf.pending == 20
    server.start()
    assert buf.flush(wait=True) and buf.pending == 0
    recovered = time.monotonic() - t0
    assert notes[-1].startswith("MLflow answers again after")
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == list(range(1, 12))  # each once, in order
    assert [m.value for m in client.get_metric_history(run_id, "loss")] == [float(s) for s in range(1, 12)]
    assert len(client.get_metric_history(run_id, "lr")) == 10
    print(f"\n[buffer outage] 20 points kept through the outage, written once {recovered:.1f} s after the first failed write")


@pytest.mark.slow  # a real `mlflow server`, stopped and restarted
def test_past_its_bound_the_outage_raises_with_a_reason_and_the_next_attempt_writes_what_it_kept(server):
    client = MlflowClient(server.url)
    run_id = client.create_run(client.create_experiment("outage")).info.run_id
    notes: list[str] = []
    buf = MetricBuffer(
        client, run_id, policy=OutagePolicy(max_outage_s=3, first_backoff_s=0.5, max_backoff_s=1, max_points=8), log=notes.append
    )
    server.stop()
    for step in range(1, 7):
        buf.add({"loss": float(step), "lr": 0.1}, step)
    assert buf.pending == 8 and buf.dropped == 4
    assert any("dropped the 2 oldest unwritten point(s) beyond the buffer's 8 (4 dropped in all)" in n for n in notes)
    with pytest.raises(TrackingOutage) as e:
        buf.flush(wait=True)
    reason = str(e.value)
    assert reason.startswith(f"MLflow at {server.url} took no write for") and "(bound 3 s, QKSTUDY_MLFLOW_OUTAGE_S" in reason
    assert "8 point(s) unwritten, 4 oldest dropped beyond the buffer's 8" in reason and "resumes from its last checkpoint" in reason
    # the attempt ends here; its checkpoint (at step 6) kept what was unwritten, and the attempt that
    # resumes from it, once MLflow answers, writes those before the steps it trains again
    carried = json.loads(json.dumps(buf.unwritten()))  # through the checkpoint's state file
    del buf
    server.start()
    again = MetricBuffer(client, run_id, resume_after=last_logged_step(client, run_id), carried=carried)
    assert again.pending == 8
    for step in (7, 8):
        again.add({"loss": float(step), "lr": 0.1}, step)
    assert again.flush() and again.pending == 0
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [3, 4, 5, 6, 7, 8]  # 1, 2: over the cap
    assert [m.value for m in client.get_metric_history(run_id, "loss")] == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def _study_spec(tmp_path: Path, name: str, url: str, steps: int, num_evals: int) -> Path:
    """A tiny one-run study (``tests.helpers.TINY_SPEC``'s sizes) tracked by the server at ``url``; no Ray Train retry."""
    spec = tmp_path / "study" / f"{name}.yaml"
    spec.parent.mkdir()
    spec.write_text(
        yaml.safe_dump(
            {
                **TINY_SPEC,
                "name": name,
                "tracking_uri": url,
                "budget": {"mode": "tokens", "tokens": steps * TPS},
                "eval": {**TINY_SPEC["eval"], "num_evals": num_evals},
                "resources": {"workers": 1, "cpus_per_worker": 1, "zero_stage": 2, "max_retries": 0},
            }
        )
    )
    return spec


@pytest.mark.slow
@pytest.mark.stack
def test_a_study_rides_out_a_server_outage_mid_run_with_every_point_once(server, tmp_path):
    steps = 600  # ~40-90 s of training here: the outage starts at the first flush and ends well before the last step
    spec = _study_spec(tmp_path, "outage", server.url, steps, num_evals=30)
    client = MlflowClient(server.url)
    p = start_driver(spec, driver_env(), "-v")
    try:
        mlflow_id, deadline = None, time.time() + 600
        while time.time() < deadline and p.poll() is None:  # the first flush (step 20) is in MLflow
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`qkstudy.kind` = 'train'")
            if runs and client.get_metric_history(runs[0].info.run_id, "train/loss"):
                mlflow_id = runs[0].info.run_id
                break
            time.sleep(0.3)
        assert mlflow_id, "no point reached MLflow"
        before = len(client.get_metric_history(mlflow_id, "train/loss"))
        server.stop()
        t_down = time.time()
        time.sleep(20)  # at ~10 steps/s: several flush intervals (one per 20 steps)
        restart_s = server.start()
        down_s = time.time() - t_down
        err = finish_driver(p)
    finally:
        reap_driver(p)
    assert p.returncode == 0, err[-3000:]
    flat = " ".join(err.split())
    assert "MLflow write failed" in flat and "keeping" in flat and "MLflow answers again after" in flat, flat[-3000:]
    r = client.get_run(mlflow_id)
    assert r.data.tags["qkstudy.status"] == "finished" and r.info.status == "FINISHED" and "qkstudy.restarts" not in r.data.tags
    hist = [m.step for m in client.get_metric_history(mlflow_id, "train/loss")]
    assert hist == [TPS * i for i in range(1, steps + 1)], hist  # every point once: none lost, none twice
    assert [m.step for m in client.get_metric_history(mlflow_id, "val/loss")] == [TPS * i for i in range(20, steps + 1, 20)]
    assert len(client.get_metric_history(mlflow_id, "final/val_loss")) == 1
    print(
        f"\n[MLflow outage] server down {down_s:.0f} s (restart {restart_s:.0f} s) after {before} of {steps} points; "
        f"run finished with all {len(hist)} train/loss points, 0 lost, 0 twice, no restart"
    )


@pytest.mark.slow
@pytest.mark.stack
def test_an_outage_past_its_bound_fails_the_run_with_a_reason_and_a_resubmit_resumes_with_every_point_once(server, tmp_path):
    steps = 400
    spec = _study_spec(tmp_path, "bound", server.url, steps, num_evals=20)
    client = MlflowClient(server.url)

    def start(**env: str) -> subprocess.Popen:
        return start_driver(spec, driver_env(**env), "-v")

    p = start(QKSTUDY_MLFLOW_OUTAGE_S="8")
    try:
        mlflow_id, deadline = None, time.time() + 600
        while time.time() < deadline and p.poll() is None:
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`qkstudy.kind` = 'train'")
            if runs and client.get_metric_history(runs[0].info.run_id, "train/loss"):
                mlflow_id = runs[0].info.run_id
                break
            time.sleep(0.3)
        assert mlflow_id, "no point reached MLflow"
        server.stop()  # and it stays down until the driver has given up
        t_down = time.time()
        err = finish_driver(p)
        gave_up_s = time.time() - t_down
    finally:
        reap_driver(p)
    assert p.returncode == 1, err[-3000:]
    flat = " ".join(err.split())
    assert "took no write for" in flat and "(bound 8 s, QKSTUDY_MLFLOW_OUTAGE_S" in flat, flat[-3000:]
    assert "resubmit the study once MLflow answers and the run resumes from its last checkpoint" in flat
    server.start()
    before = [m.step for m in client.get_metric_history(mlflow_id, "train/loss")]
    assert before and before[-1] < steps * TPS
    q = start()
    try:
        err2 = finish_driver(q)
    finally:
        reap_driver(q)
    assert q.returncode == 0, err2[-3000:]
    r = client.get_run(mlflow_id)
    assert r.data.tags["qkstudy.status"] == "finished" and r.data.tags["qkstudy.restarts"] == "1"
    hist = [m.step for m in client.get_metric_history(mlflow_id, "train/loss")]
    assert hist == [TPS * i for i in range(1, steps + 1)], hist  # the kept points written by the resume: none lost, none twice
    resumed = int(r.data.tags["qkstudy.resumed_from_tokens"]) // TPS
    print(
        f"\n[outage past bound] driver gave up {gave_up_s:.0f} s into the outage (bound 8 s) with {len(before)} points in "
        f"MLflow; resubmit resumed from step {resumed} and wrote the {resumed - len(before)} points the checkpoint kept: "
        f"{len(hist)} points, 0 lost, 0 twice"
    )


def test_a_pack_that_ends_while_mlflow_is_down_reports_the_runs_failure_reason_not_a_crash():
    from orchestrator.run.driver.packing import _outcomes

    apply_http_env()
    down = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on: the server is down
    crash = "TrainingFailedError: ... TrackingOutage: MLflow took no write for 301 s ... resubmit the study"
    out = _outcomes([{"run": {"run_id": "r1"}, "mlflow_run_id": "m1"}], down, crash)
    assert out["r1"]["status"] == "failed" and out["r1"]["reason"].startswith(crash)
    assert "MLflow could not record it" in out["r1"]["reason"]
