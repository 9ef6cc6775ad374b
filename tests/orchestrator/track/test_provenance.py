"""Provenance on a driver: the code's commit and dirty flag from a real git repository (clean,
modified, untracked, outside any repository, no git at all), the commit a submitted job
carries from where it was submitted, the resolved spec (its ``extends`` chain, a hash that
follows the study and not the files, no password), and the tags a resumed run keeps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.spec import load_spec
from orchestrator.run.driver import submit, upload
from orchestrator.track import provenance as P
from orchestrator.track.tracking import client_for, create_run, ensure_experiment
from tests.helpers import mlflow_store

SPEC = "name: prov\nscales: [cpu-xs]\nvariants: [standard, coupled]\nbudget: {tokens: 40960}\n"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x", "HOME": str(repo)}
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=30, env={**os.environ, **env})
    return out.stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A committed git repository holding a spec that extends a base; nothing above it is one."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    r = tmp_path / "repo"
    (r / "jobs" / "base").mkdir(parents=True)
    (r / "jobs" / "base" / "b.yaml").write_text("scales: [cpu-xs]\nbudget: {tokens: 40960}\n")
    (r / "jobs" / "s.yaml").write_text(
        "extends: base/b.yaml\nname: prov\ndescription: does coupling help? (was on postgresql://u:s3cr3t@db/mlflow)\n"
        "variants: [standard, coupled]\n"
    )
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "commit", "-q", "-m", "x")
    return r


def test_clean_checkout_is_not_dirty_a_change_or_a_new_file_is(repo):
    head = _git(repo, "rev-parse", "HEAD")
    assert P.git_state(repo) == {"source": P.CHECKOUT, "commit": head, "dirty": False}
    assert P.git_state(repo / "jobs")["commit"] == head  # any folder inside the checkout
    (repo / "jobs" / "s.yaml").write_text((repo / "jobs" / "s.yaml").read_text() + "seeds: [0, 1]\n")
    assert P.git_state(repo) == {"source": P.CHECKOUT, "commit": head, "dirty": True}
    _git(repo, "checkout", "-q", "--", ".")
    assert P.git_state(repo)["dirty"] is False
    (repo / "new.py").write_text("x = 1\n")  # untracked code is uploaded and run too
    assert P.git_state(repo)["dirty"] is True


def test_outside_a_checkout_or_without_git_there_is_no_commit(tmp_path, repo, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    none = {"source": P.NOT_A_CHECKOUT, "commit": None, "dirty": None}
    assert P.git_state(plain) == none
    assert P.git_state(tmp_path / "missing") == none  # a folder that is not there: no crash
    monkeypatch.setenv("PATH", str(plain))  # no git on PATH
    assert P.git_state(repo) == none


def test_gather_tags_code_user_version_spec_and_note(repo, monkeypatch):
    monkeypatch.delenv(P.SOURCE_ENV, raising=False)
    spec = repo / "jobs" / "s.yaml"
    study = load_spec(spec)
    prov = P.gather(study, spec, env={}, code_root=repo)
    t = prov.tags
    assert t[P.COMMIT_TAG] == _git(repo, "rev-parse", "HEAD") and t[P.DIRTY_TAG] == "false"
    assert t[P.SOURCE_TAG] == P.CHECKOUT and t["mlflow.source.type"] == "LOCAL"
    assert t["mlflow.user"] and t[P.VERSION_TAG] == P.qkstudy_version() != "unknown"
    assert t[P.NOTE_TAG] == prov.note == "does coupling help? (was on postgresql://u:***@db/mlflow)"
    assert "torch==" in t["qkstudy.packages"] and "mlflow==" in t["qkstudy.packages"]
    assert "qkstudy.ray_job" not in t
    doc = yaml.safe_load(prov.artifacts[P.RESOLVED_ARTIFACT])
    assert [c["file"] for c in doc["extends_chain"]] == [str(spec), str(repo / "jobs" / "base" / "b.yaml")]
    assert doc["resolved"]["budget"]["tokens"] == 40960 and doc["resolved"]["description"] == prov.note
    assert "s3cr3t" not in prov.artifacts[P.RESOLVED_ARTIFACT]  # a URI's password in free text never reaches a store
    assert any(line.startswith("torch==") for line in prov.artifacts[P.PACKAGES_ARTIFACT].splitlines())
    assert prov.code == t[P.COMMIT_TAG]


def test_spec_hash_follows_the_resolved_study_not_its_files(repo, tmp_path):
    spec = repo / "jobs" / "s.yaml"
    flat = tmp_path / "flat.yaml"  # the same study written in one file
    merged = yaml.safe_load((repo / "jobs" / "base" / "b.yaml").read_text()) | yaml.safe_load(spec.read_text())
    flat.write_text(yaml.safe_dump({k: v for k, v in merged.items() if k != "extends"}))
    h = P.resolved_spec(load_spec(spec), spec)[1]
    assert P.resolved_spec(load_spec(flat), flat)[1] == h
    flat.write_text(flat.read_text().replace("40960", "81920"))
    assert P.resolved_spec(load_spec(flat), flat)[1] != h


def test_no_checkout_no_commit_tag_and_no_spec_no_spec_tags(tmp_path):
    prov = P.gather(None, env={}, code_root=tmp_path)
    assert P.COMMIT_TAG not in prov.tags and P.DIRTY_TAG not in prov.tags
    assert prov.tags[P.SOURCE_TAG] == P.NOT_A_CHECKOUT and prov.code == P.NOT_A_CHECKOUT
    assert P.SPEC_HASH_TAG not in prov.tags and P.NOTE_TAG not in prov.tags
    assert set(prov.artifacts) == {P.PACKAGES_ARTIFACT}


def _code(folder: Path) -> Path:
    """The code packages ``submit`` uploads, copied into ``folder`` (a checkout's or an install's)."""
    for pkg in upload.CODE_PACKAGES:
        shutil.copytree(P.CODE_ROOT / pkg, folder / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


def test_submit_passes_the_uploaded_checkouts_commit_and_dirty_flag(repo):
    spec = repo / "jobs" / "s.yaml"
    _code(repo)  # uploaded, never committed: the code is dirty
    job = submit.build_job(spec, "http://127.0.0.1:8265", working_dir=repo, allow_ephemeral=True, code_root=repo)
    state = json.loads(job["runtime_env"]["env_vars"][P.SOURCE_ENV])
    assert state["commit"] == _git(repo, "rev-parse", "HEAD") and state["dirty"] is True
    assert state["source"] == P.UPLOAD and state["user"]
    # the job's driver (no .git in its upload) records what was submitted
    env = job["runtime_env"]["env_vars"]
    prov = P.gather(load_spec(spec), spec, env=env, code_root=spec.parent.parent / "nowhere")
    assert prov.tags[P.COMMIT_TAG] == state["commit"] and prov.tags[P.DIRTY_TAG] == "true"
    assert prov.tags[P.SOURCE_TAG] == P.UPLOAD and prov.tags["mlflow.source.type"] == "JOB"
    assert prov.tags["qkstudy.ray_job"] == job["submission_id"]
    # with --no-upload the cluster runs its own image: no commit from here
    no_upload = submit.build_job(spec, "http://127.0.0.1:8265", working_dir=repo, allow_ephemeral=True, upload=False)
    assert P.SOURCE_ENV not in no_upload["runtime_env"]["env_vars"]


def test_submit_outside_a_checkout_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / "s.yaml").write_text(SPEC)
    code = _code(tmp_path / "site")
    job = submit.build_job(tmp_path / "s.yaml", "http://127.0.0.1:8265", working_dir=tmp_path, allow_ephemeral=True, code_root=code)
    assert json.loads(job["runtime_env"]["env_vars"][P.SOURCE_ENV])["source"] == P.NOT_A_CHECKOUT


@pytest.mark.parametrize("value", ["{not json", "[1, 2]"])
def test_a_malformed_source_variable_is_an_error(tmp_path, value):
    with pytest.raises(ValueError, match=P.SOURCE_ENV):
        P.gather(None, env={P.SOURCE_ENV: value}, code_root=tmp_path)


def test_a_resumed_run_keeps_the_code_it_trained_with_before():
    now = P.Provenance(tags={P.COMMIT_TAG: "b" * 40, P.DIRTY_TAG: "false"}, artifacts={})
    same = P.resume_tags({P.COMMIT_TAG: "b" * 40, P.DIRTY_TAG: "false"}, now)
    assert P.EARLIER_TAG not in same
    moved = P.resume_tags({P.COMMIT_TAG: "a" * 40, P.DIRTY_TAG: "true"}, now)
    assert moved[P.COMMIT_TAG] == "b" * 40 and moved[P.EARLIER_TAG] == "a" * 40 + " (dirty)"
    again = P.resume_tags({**moved, P.COMMIT_TAG: "c" * 40, P.DIRTY_TAG: "false"}, now)
    assert again[P.EARLIER_TAG] == f"{'a' * 40} (dirty), {'c' * 40}"
    assert P.EARLIER_TAG not in P.resume_tags({}, now)  # a run from before provenance: nothing to keep


def test_tags_are_set_at_creation_and_artifacts_logged(repo, tmp_path):
    from orchestrator.plan.planner import plan

    spec = repo / "jobs" / "s.yaml"
    study = load_spec(spec)
    run = plan(study)[0]
    prov = P.gather(study, spec, env={}, code_root=repo)
    client = client_for(mlflow_store(tmp_path))
    exp = ensure_experiment(client, study.name)
    P.set_experiment_note(client, exp, prov)
    mid = create_run(client, exp, run, {}, prov.tags)
    assert P.log_artifacts(client, mid, prov) is None
    rec = client.get_run(mid)
    assert rec.data.tags["qkstudy.run_id"] == run.run_id  # provenance is beside the run's identity, not in it
    assert {k: rec.data.tags[k] for k in prov.tags} == prov.tags
    assert client.get_experiment(exp).tags[P.NOTE_TAG] == "does coupling help? (was on postgresql://u:***@db/mlflow)"
    got = client.download_artifacts(mid, P.RESOLVED_ARTIFACT, str(tmp_path / "got"))
    assert yaml.safe_load(Path(got).read_text())["resolved"]["name"] == "prov"
