"""The study protocol (``orchestrator.run.driver.study``) above the run executor: the executor
never imports the protocol, and ``run_runs(lease=...)`` takes only the held study lease. The
one lease across a tuned study's two stages is tested on a real tuned study in
test_tuned_study.py."""

from __future__ import annotations

import ast

import pytest
from rich.console import Console

from orchestrator.run.driver.runner import run_runs
from orchestrator.track.lease import STUDY_LEASE, Lease
from tests.helpers import REPO


def test_runner_never_imports_the_study_protocol():
    tree = ast.parse((REPO / "orchestrator" / "run" / "driver" / "runner.py").read_text())
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
