"""A real two-node Ray cluster on loopback (`ray start --head`, then `ray start --address`):
`qkstudy submit` sends a tiny study through the Job Submission API, every run finishes in
MLflow, and resubmitting trains nothing new."""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = f"{BIN}:{env['PATH']}"  # the job's `python` is this environment's
    # Ray token authentication, as the compose stack runs it: every node and client holds the token.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    gcs, dash = _free_port(), _free_port()
    common = ["--num-cpus", "2", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]

    # Two nodes on one machine must not share what separate machines never share: Ray's
    # default agent ports, and a temp dir (the job's unpacked working_dir would be one folder,
    # deleted under one node by the other's runtime-env cleanup). Short paths: Unix sockets.
    temp_dirs = [tempfile.mkdtemp(prefix="rh", dir="/tmp"), tempfile.mkdtemp(prefix="rw", dir="/tmp")]

    def own_ports():
        return ["--dashboard-agent-listen-port", str(_free_port()), "--dashboard-agent-grpc-port", str(_free_port()),
                "--runtime-env-agent-port", str(_free_port()), "--metrics-export-port", str(_free_port()),
                "--ray-client-server-port", str(_free_port())]

    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--port", str(gcs), "--dashboard-host", "127.0.0.1",
                             "--dashboard-port", str(dash), "--include-dashboard", "true", "--temp-dir", temp_dirs[0], *own_ports(),
                             *common],
                            env=env, start_new_session=True, stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT)
    procs = [head]
    try:
        url = f"http://127.0.0.1:{dash}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/api/version", timeout=2)
                break
            except urllib.error.HTTPError:  # up, and asking for Ray's auth token
                break
            except OSError:
                assert time.time() < deadline and head.poll() is None, (tmp / "head.log").read_text()[-3000:]
                time.sleep(1)
        procs.append(subprocess.Popen([str(BIN / "ray"), "start", "--address", f"127.0.0.1:{gcs}", "--temp-dir", temp_dirs[1],
                                       *own_ports(), *common],
                                      env=env, start_new_session=True, stdout=open(tmp / "worker.log", "w"),
                                      stderr=subprocess.STDOUT))
        probe = f"import ray; ray.init(address='127.0.0.1:{gcs}', logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
        while True:
            n = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout.strip()
            if n == "2":
                break
            assert time.time() < deadline, (tmp / "worker.log").read_text()[-3000:]
            time.sleep(1)
        yield url, env, tmp
    finally:
        for p in reversed(procs):
            _stop(p)
        # `ray start` leaves the cluster's address behind for `ray.init()` to find; it is gone now.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{gcs}"):
            current.unlink()
        for d in temp_dirs:
            shutil.rmtree(d, ignore_errors=True)


SPEC = """\
name: cluster
corpus: {{source: stdlib, max_documents: 60}}
tokenizer: {{vocab_size: 512}}
scales: [cpu-xs]
variants: [standard, coupled]
budget: {{mode: tokens, tokens: 10240}}
train: {{global_batch: 8, seq_len: 64}}
eval: {{num_evals: 2, max_windows: 8, diagnostics: false}}
resources: {{workers: 2, cpus_per_worker: 1, zero_stage: 2}}
workdir: {workdir}
"""


def _qk(*args, cwd, env):
    return subprocess.run([str(BIN / "qkstudy"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _job_status(url, job_id, env):
    # In a subprocess: Ray reads its auth settings once per process, and this one imported Ray
    # (test collection) before the cluster's token existed.
    code = f"from orchestrator.run.submit import job_status; print(job_status({url!r}, {job_id!r}))"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


def _wait(url, job_id, env, cwd):
    deadline = time.time() + 600
    while (st := _job_status(url, job_id, env)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.time() < deadline
        time.sleep(2)
    logs = _qk("logs", job_id, "--address", url, "--no-follow", cwd=cwd, env=env).stdout
    return st, logs


def test_submit_to_two_node_cluster_then_resubmit(cluster):
    url, env, tmp = cluster
    study_dir = tmp / "study"
    study_dir.mkdir()
    (study_dir / "cluster.yaml").write_text(SPEC.format(workdir=tmp / "work"))
    env = {**env, "QKSTUDY_CACHE": str(tmp / "cache")}

    # First submission uploads the working dir (the spec's folder) as a Ray package.
    res = _qk("submit", "cluster.yaml", "--address", url, cwd=study_dir, env=env)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    status, logs = _wait(url, job_id, env, study_dir)
    assert status == "SUCCEEDED", logs[-4000:]

    c = MlflowClient(f"sqlite:///{tmp / 'work' / 'mlflow.db'}")
    exp = c.get_experiment_by_name("cluster")
    runs = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    assert sorted(r.data.tags["variant"] for r in runs) == ["coupled", "standard"]
    assert all(r.data.tags["status"] == "finished" and r.data.metrics["tokens"] == 10240 for r in runs)

    st = json.loads(_qk("status", "cluster", "--tracking-uri", f"sqlite:///{tmp / 'work' / 'mlflow.db'}", "--address", url,
                        "--json", cwd=study_dir, env=env).stdout)
    assert [r["status"] for r in st["runs"]] == ["finished", "finished"]
    assert [j["job_id"] for j in st["jobs"]] == [job_id]

    # The resubmission reads the spec in place (shared storage, code in the image): --no-upload.
    res = _qk("submit", "cluster.yaml", "--address", url, "--no-upload", cwd=study_dir, env=env)
    status, logs = _wait(url, res.stdout.strip(), env, study_dir)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "2 run(s) already finished in MLflow: skipped" in logs
    again = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    assert {r.info.run_id for r in again} == {r.info.run_id for r in runs}
    assert all(c.get_metric_history(r.info.run_id, "tokens")[-1].step == 10240 for r in again)


def test_submit_refuses_plain_http_to_remote_host(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC.format(workdir=tmp_path / "w"))
    res = _qk("submit", "s.yaml", "--address", "http://203.0.113.7:8265", cwd=tmp_path, env=dict(os.environ))
    assert res.returncode == 2 and "refusing to submit" in res.stderr
