"""The study protocol (``orchestrator.run.driver.study``) above the run executor: one study lease
across a tuned study's two stages, proven with a real second driver started between them
(real Ray, DeepSpeed and MLflow on the tiniest tuned study); ``run_runs(lease=...)`` takes
only the held study lease; the executor never imports the protocol."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient
from rich.console import Console

import orchestrator.run.driver.study as study_mod
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.runner import run_runs
from orchestrator.track.lease import STUDY_LEASE, Lease, LeaseHeld, read_lease
from orchestrator.track.tracking import study_tracking_uri

ROOT = Path(__file__).resolve().parents[3]
QKSTUDY = Path(sys.executable).with_name("qkstudy")


def test_runner_never_imports_the_study_protocol():
    tree = ast.parse((ROOT / "orchestrator" / "run" / "driver" / "runner.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    names |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not {m for m in names if m == "orchestrator.run.driver.study" or m.startswith("orchestrator.run.driver.study.")}, names


def test_run_runs_under_a_lease_takes_only_the_held_study_lease(tmp_path):
    storage = str(tmp_path / "ray")
    with pytest.raises(ValueError, match="held study lease"):  # never acquired
        run_runs([], "s", "sqlite:///unused.db", storage, console=Console(quiet=True), lease=Lease(storage, STUDY_LEASE))
    with Lease(storage, "run-abc") as other, pytest.raises(ValueError, match="held study lease"):  # not the study's
        run_runs([], "s", "sqlite:///unused.db", storage, console=Console(quiet=True), lease=other)
    with Lease(str(tmp_path / "elsewhere"), STUDY_LEASE) as theirs, pytest.raises(ValueError, match="held study lease"):
        run_runs([], "s", "sqlite:///unused.db", storage, console=Console(quiet=True), lease=theirs)
    lease = Lease(storage, STUDY_LEASE).acquire()
    lease.release()
    with pytest.raises(ValueError, match="held study lease"):  # released
        run_runs([], "s", "sqlite:///unused.db", storage, console=Console(quiet=True), lease=lease)
    assert not (tmp_path / "unused.db").exists()


# The tiniest tuned study (test_tuning_stage.py's shape, one variant): 2 tuning runs, 1 main run.
SPEC = """\
name: onelease
corpus: {source: stdlib, max_documents: 60}
tokenizer: {vocab_size: 512}
scales: [{name: tiny, n_layer: 1, d_model: 32, n_head: 2, seq_len: 64, global_batch: 8}]
variants: [standard]
budget: {mode: tokens, tokens: 4096}
tune: {lr: [0.0003, 0.01], tokens: 2048}
eval: {num_evals: 1, max_windows: 4, final_max_windows: 8, diagnostics: false}
resources: {workers: 1, cpus_per_worker: 1, zero_stage: 2}
"""


def _records(uri: str, name: str) -> list:
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(name)
    return [] if exp is None else c.search_runs([exp.experiment_id])


@pytest.mark.slow
def test_second_driver_between_tuning_and_main_stages_is_refused(tmp_path, monkeypatch):
    text = SPEC + f"workdir: {tmp_path / 'w'}\n"
    (tmp_path / "onelease.yaml").write_text(text)
    study = parse_spec(yaml.safe_load(text))
    storage, uri = study.resolved_storage_path, study_tracking_uri(study)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    seen: dict = {}
    real_outcomes = study_mod.tuning_outcomes

    def between_stages(tracking_uri, study_name, runs):
        """Called right after the tuning stage returned, before the main runs are planned."""
        out = real_outcomes(tracking_uri, study_name, runs)
        seen["tuning_ids"] = {r.run_id for r in runs}
        seen["holder"] = read_lease(storage, STUDY_LEASE)  # the old per-stage lease: None (released) here
        try:  # a second driver's acquisition, judged by heartbeat alone as one on another machine would
            Lease(storage, STUDY_LEASE, local_liveness=False).acquire().release()
            seen["acquired"] = True
        except LeaseHeld as e:
            seen["refused_by"] = e.holder.pid
        t0 = time.time()
        seen["second"] = subprocess.run([str(QKSTUDY), "run", str(tmp_path / "onelease.yaml")], cwd=tmp_path, env=env,
                                        capture_output=True, text=True, timeout=600)
        seen["second_s"] = time.time() - t0
        seen["records_after_second"] = sorted(r.data.tags["run_id"] for r in _records(uri, study_name))
        return out

    monkeypatch.setattr(study_mod, "tuning_outcomes", between_stages)
    ray.init(address="local", num_cpus=2, namespace="qkstudy", log_to_driver=False, configure_logging=False)
    try:
        res = study_mod.run_study(study, console=Console(quiet=True))
    finally:
        ray.shutdown()

    # negative control: before one lease spanned both stages, the lease was free at this point
    holder = seen["holder"]
    assert holder is not None and holder.pid == os.getpid(), holder
    assert "acquired" not in seen and seen["refused_by"] == os.getpid()
    second = seen["second"]
    assert second.returncode == 2, (second.stdout[-3000:], second.stderr[-3000:])
    flat = " ".join(second.stderr.split())
    assert f"study 'onelease' is being run by pid {os.getpid()} on host" in flat, flat
    assert seen["records_after_second"] == sorted(seen["tuning_ids"])  # it registered and trained nothing

    # both stages ran, each run id trained exactly once (one MLflow record each, finished)
    records = _records(uri, "onelease")
    ids = [r.data.tags["run_id"] for r in records]
    assert len(ids) == len(set(ids)) == 3, ids
    assert sorted(r.data.tags["qkstudy.kind"] for r in records) == ["train", "tune", "tune"]
    assert all(r.data.tags["status"] == "finished" for r in records)
    assert res.ok and res.status == {i: "finished" for i in ids}, res.status
    assert read_lease(storage, STUDY_LEASE) is None  # released when the study returned
    print(f"second driver refused in {seen['second_s']:.1f} s")
