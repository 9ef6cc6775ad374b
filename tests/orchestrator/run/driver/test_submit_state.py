"""`qkstudy submit` refuses a study whose MLflow history or checkpoints would live in the job's
temporary working-dir copy (exit 2, naming the file and fields, before any network call), and
has no `--image` flag (Ray's image_uri needs podman inside the nodes, which the stack's
containers do not have: the nodes run the qkstudy image instead)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.plan.spec import SpecError
from orchestrator.run.driver.submit import build_job, ephemeral_fields
from tests.helpers import qk

SPEC = """\
name: ephemeral
corpus: {source: stdlib, max_documents: 20}
tokenizer: {vocab_size: 512}
scales: [cpu-xs]
variants: [standard]
budget: {mode: tokens, tokens: 4096}
"""
# Nothing listens on port 9 (discard): a submit that gets past the checks fails to connect.
NOWHERE = "http://127.0.0.1:9"


def submit(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return qk("submit", "study.yaml", "--address", NOWHERE, *args, cwd=cwd, timeout=300)


def write(tmp_path: Path, extra: str = "") -> Path:
    spec = tmp_path / "study.yaml"
    spec.write_text(SPEC + extra)
    return spec


def test_spec_without_tracking_uri_and_storage_path_is_refused(tmp_path):
    res = submit(write(tmp_path).parent)
    assert res.returncode == 2, res.stdout + res.stderr
    err = " ".join(res.stderr.split())
    assert "study.yaml: tracking_uri: not set" in err and "study.yaml: storage_path: not set" in err
    assert "--allow-ephemeral" in err
    assert "127.0.0.1:9" not in err  # refused before any connection attempt


def test_allow_ephemeral_gets_past_the_check(tmp_path):
    write(tmp_path)
    res = submit(tmp_path, "--allow-ephemeral")
    assert "not set" not in res.stderr
    assert res.returncode not in (0, 2), res.stdout + res.stderr  # it tried the (absent) cluster


@pytest.mark.parametrize(
    "extra,missing",
    [
        ("tracking_uri: http://mlflow:5000\n", ["storage_path"]),
        ("storage_path: /shared/qkstudy/ephemeral\n", ["tracking_uri"]),
        ("tracking_uri: http://mlflow:5000\nstorage_path: /shared/qkstudy/ephemeral\n", []),
        ("workdir: /shared/qkstudy/ephemeral\n", []),  # absolute: both defaults live there
        ("workdir: runs/ephemeral\n", ["tracking_uri", "storage_path"]),  # relative: in the copy
    ],
)
def test_which_fields_would_be_lost(tmp_path, extra, missing):
    from orchestrator.plan.spec import load_spec

    assert [f for f, _ in ephemeral_fields(load_spec(write(tmp_path, extra)))] == missing


def test_build_job_raises_spec_error_naming_the_file(tmp_path):
    spec = write(tmp_path, "tracking_uri: http://mlflow:5000\n")
    with pytest.raises(SpecError, match=r"study\.yaml: storage_path: not set"):
        build_job(spec, "http://127.0.0.1:8265", working_dir=tmp_path)
    job = build_job(spec, "http://127.0.0.1:8265", working_dir=tmp_path, allow_ephemeral=True)
    assert "image_uri" not in job["runtime_env"]


def test_there_is_no_image_flag(tmp_path):
    write(tmp_path, "tracking_uri: http://mlflow:5000\nstorage_path: /shared/qkstudy/ephemeral\n")
    res = submit(tmp_path, "--image", "qkstudy:latest")
    assert res.returncode == 2 and "No such option" in res.stderr + res.stdout
    helptext = qk("submit", "--help", timeout=120).stdout
    assert "--image" not in helptext and "--allow-ephemeral" in helptext
