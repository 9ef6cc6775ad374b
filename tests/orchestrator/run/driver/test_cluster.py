"""A real two-node Ray cluster on loopback (`ray start --head`, then `ray start --address`):
`qkstudy submit` sends a tiny study with a plug-in variant through the Job Submission API (the
plug-in travels with its job), every run finishes in MLflow, and resubmitting trains nothing new."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from functools import partial

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import REPO, qk

pytestmark = [pytest.mark.slow, pytest.mark.stack]


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
    c = loopback_cluster(head_cpus=2)
    c.add_worker("worker", cpus=2)
    yield c.url, c.env, c.tmp


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


_qk = partial(qk, timeout=600)


def _job_status(url, job_id, env):
    # In a subprocess: Ray reads its auth settings once per process, and this one imported Ray
    # (test collection) before the cluster's token existed.
    code = f"from orchestrator.run.driver.submit import job_status; print(job_status({url!r}, {job_id!r}))"
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


def test_submit_a_plug_in_study_to_two_node_cluster_then_resubmit(cluster):
    """The spec and its plug-in one folder below the uploaded working dir: neither the job's
    working dir nor the nodes' environment has the module, only the job's ``py_modules``."""
    url, env, tmp = cluster
    study_dir = tmp / "study"
    (study_dir / "exp").mkdir(parents=True)
    shutil.copytree(REPO / "examples" / "gated_qk" / "qkstudy_gated_qk", study_dir / "exp" / "qkstudy_gated_qk")
    spec = yaml.safe_load(SPEC.format(workdir=tmp / "work"))
    spec.update(plugins=["qkstudy_gated_qk"], variants=["standard", "coupled", "gated_qk"])
    (study_dir / "exp" / "cluster.yaml").write_text(yaml.safe_dump(spec))
    env = {**env, "QKSTUDY_CACHE": str(tmp / "cache")}

    # First submission uploads the spec and the code packages (an allow-list) as a Ray package, and follows
    # the job to its end: exit 0 when it succeeded, the job id on stdout's first line, its logs after.
    res = _qk("submit", "exp/cluster.yaml", "--address", url, cwd=study_dir, env=env)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    job_id, *logs = res.stdout.splitlines()
    assert f"job {job_id}: SUCCEEDED" in res.stderr and re.search(r"uploading \d+ files", res.stderr)
    assert _job_status(url, job_id, env) == "SUCCEEDED"
    assert any("planned runs" in line for line in logs)

    c = MlflowClient(f"sqlite:///{tmp / 'work' / 'mlflow.db'}")
    exp = c.get_experiment_by_name("cluster")
    runs = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    by_variant = {r.data.tags["qkstudy.variant"]: r for r in runs}
    assert sorted(by_variant) == ["coupled", "gated_qk", "standard"]
    assert all(r.data.tags["qkstudy.status"] == "finished" and r.data.metrics["tokens"] == 10240 for r in runs)
    assert by_variant["gated_qk"].data.params["plugin.module"] == "qkstudy_gated_qk"

    st = json.loads(
        _qk(
            "status",
            "cluster",
            "--tracking-uri",
            f"sqlite:///{tmp / 'work' / 'mlflow.db'}",
            "--address",
            url,
            "--json",
            cwd=study_dir,
            env=env,
        ).stdout
    )
    assert [r["status"] for r in st["runs"]] == ["finished"] * 3
    assert [j["job_id"] for j in st["jobs"]] == [job_id]

    # The resubmission reads the spec and its plug-in in place (shared storage, code in the image): --no-upload.
    res = _qk("submit", "exp/cluster.yaml", "--address", url, "--no-upload", "--no-wait", cwd=study_dir, env=env)
    status, logs = _wait(url, res.stdout.strip(), env, study_dir)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "3 run(s) already finished in MLflow: skipped" in logs
    again = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    assert {r.info.run_id for r in again} == {r.info.run_id for r in runs}
    assert all(c.get_metric_history(r.info.run_id, "tokens")[-1].step == 10240 for r in again)


def test_submit_refuses_plain_http_to_remote_host(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC.format(workdir=tmp_path / "w"))
    res = _qk("submit", "s.yaml", "--address", "http://203.0.113.7:8265", cwd=tmp_path, env=dict(os.environ))
    assert res.returncode == 2 and "refusing to submit" in res.stderr
