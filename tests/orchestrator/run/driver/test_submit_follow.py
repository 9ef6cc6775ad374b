"""`qkstudy submit` follows its job as `ray job submit` does, against a real Ray head with its
dashboard (`ray start --head` on loopback, token auth): the job id first on stdout, the job's
logs, exit 1 when the job fails; Ctrl-C ends the following, not the job; `--no-wait` returns
while the job runs; `qkstudy stop` stops a job, says when one had already ended, and refuses an
unknown id. A study that succeeds is followed to exit 0 in test_cluster.py."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest

from tests.helpers import QKSTUDY, qk

pytestmark = [pytest.mark.slow, pytest.mark.stack]

# A study that trains for a minute or more: still running when the test stops it.
SPEC = """\
name: {name}
corpus: {corpus}
tokenizer: {{vocab_size: 512}}
scales: [cpu-xs]
variants: [standard]
budget: {{mode: tokens, tokens: 40960}}
train: {{global_batch: 8, seq_len: 64}}
resources: {{workers: 1, cpus_per_worker: 1}}
tracking_uri: sqlite:///{work}/mlflow.db
storage_path: {work}/ray
"""
STDLIB = "{source: stdlib, max_documents: 20}"


@pytest.fixture(scope="module")
def head(loopback_cluster):
    c = loopback_cluster(head_cpus=2)
    return c.url, {**c.env, "QKSTUDY_CACHE": str(c.tmp / "cache")}, c.tmp


def _spec(folder: Path, name: str, corpus: str = STDLIB) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(SPEC.format(name=name, corpus=corpus, work=folder / "work"))
    return folder / f"{name}.yaml"


_qk = partial(qk, timeout=300)


def test_a_failing_job_is_followed_to_its_end_and_exits_1(head):
    url, env, tmp = head
    # valid to submit; the job's `qkstudy run` then finds no corpus file and exits 2
    spec = _spec(tmp / "fails", "fails", corpus="{source: text, paths: [/nonexistent/corpus.txt]}")
    (spec.parent / ".env").write_text("TOKEN=x\n")  # beside the spec, never uploaded
    res = _qk("submit", spec.name, "--address", url, "--verbose", cwd=spec.parent, env=env)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    job_id, *logs = res.stdout.splitlines()
    assert job_id.startswith("raysubmit_")
    assert "no file or folder matches '/nonexistent/corpus.txt'" in "\n".join(logs)  # the job's own output, followed
    err = " ".join(res.stderr.split())
    # listed before it was sent: the code packages the job ran with and the spec, nothing else
    listed = {m[1] for m in re.finditer(r"^ +[\d,]+  (\S+)$", res.stderr, re.M)}  # `upload_lines`' rows (Ray logs too)
    assert "fails.yaml" in listed and "orchestrator/cli.py" in listed and ".env" not in listed
    assert {p.split("/")[0] for p in listed} == {"fails.yaml", "orchestrator", "model", "data_pipeline"}
    assert f"uploading {len(listed)} files, " in err
    assert f"following job {job_id} until it ends" in err and f"job {job_id}: FAILED" in err


def test_ctrl_c_leaves_the_job_running_no_wait_returns_at_once_and_stop_stops_it(head):
    url, env, tmp = head
    spec = _spec(tmp / "long", "long")
    follow = subprocess.Popen(
        [str(QKSTUDY), "submit", str(spec), "--address", url, "--no-upload"],
        cwd=spec.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    job_id = follow.stdout.readline().strip()  # the job id comes first, before any log line
    assert job_id.startswith("raysubmit_"), follow.communicate(timeout=60)
    time.sleep(3)  # following now
    follow.send_signal(signal.SIGINT)
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 130, out[-2000:] + err[-2000:]
    assert f"job {job_id} keeps running" in " ".join(err.split()) and f"qkstudy stop {job_id}" in err

    # the address from Ray's variable; the job was still running: Ctrl-C did not stop it
    by_env = {**env, "RAY_API_SERVER_ADDRESS": url}
    res = _qk("stop", job_id, cwd=tmp, env=by_env)
    assert (res.returncode, res.stdout.strip()) == (0, f"job {job_id}: STOPPED"), res.stderr
    res = _qk("stop", job_id, cwd=tmp, env=by_env)
    assert (res.returncode, res.stdout.strip()) == (0, f"job {job_id} had already ended: STOPPED"), res.stderr
    res = _qk("stop", "raysubmit_nosuchjob00000", cwd=tmp, env=by_env)
    assert res.returncode == 2 and res.stderr.count("error:") == 1 and "no job 'raysubmit_nosuchjob00000'" in res.stderr

    t0 = time.monotonic()
    res = _qk("submit", str(_spec(tmp / "nowait", "nowait")), "--address", url, "--no-upload", "--no-wait", cwd=tmp, env=env)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    (job_id,) = res.stdout.splitlines()  # the job id alone, as scripts parse it
    assert "following" not in res.stderr and took < 60
    res = _qk("stop", job_id, "--address", url, cwd=tmp, env=env)
    assert res.stdout.strip() == f"job {job_id}: STOPPED", res.stdout + res.stderr  # it had not ended
