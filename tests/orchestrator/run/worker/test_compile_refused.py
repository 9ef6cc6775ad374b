"""A run that asks for ``resources.compile`` where torch.compile cannot build (no C++ compiler
here) fails once at start-up with the reason in MLflow, before any model or engine is built: a
retry could not change it. The control: with the compiler on PATH the same loop goes past the
check (and into the build, which this test stops at)."""

import pytest
from mlflow.tracking import MlflowClient

from model import toolchain
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.worker import loop as loop_module
from orchestrator.run.worker.loop import RunLoop
from orchestrator.track.tracking import STATUS_FAILED, create_run, ensure_experiment, run_status
from tests.helpers import mlflow_store, one_run_spec


class Built(Exception):
    """Raised where the loop would build its model: the check was passed."""


@pytest.fixture
def compiled_run(tmp_path):
    spec = one_run_spec("compiled")
    (run,) = plan(parse_spec({**spec, "resources": {"compile": True}}))
    uri = mlflow_store(tmp_path)
    client = MlflowClient(uri)
    mlflow_id = create_run(client, ensure_experiment(client, "compiled"), run)
    toolchain._unavailable.cache_clear()
    yield run, uri, client, mlflow_id
    toolchain._unavailable.cache_clear()


def test_compile_without_a_compiler_fails_the_run_once_with_the_reason(compiled_run, monkeypatch, tmp_path):
    run, uri, client, mlflow_id = compiled_run
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ / c++ / clang++
    monkeypatch.setattr(RunLoop, "_build", lambda self: (_ for _ in ()).throw(Built()))
    assert RunLoop(run, "unused", uri, mlflow_id, 0, 1).run_loop() == STATUS_FAILED
    r = client.get_run(mlflow_id)
    assert run_status(r) == STATUS_FAILED and r.info.status == "FAILED"
    assert r.data.tags["qkstudy.failure_reason"] == (
        "resources.compile is set, but torch.compile on cpu needs a C++ compiler (g++ / c++ / clang++ on PATH: not found)"
    ), r.data.tags


def test_with_a_compiler_the_loop_goes_on_to_build(compiled_run, monkeypatch):
    run, uri, _, mlflow_id = compiled_run
    monkeypatch.setattr(RunLoop, "_build", lambda self: (_ for _ in ()).throw(Built()))
    with pytest.raises(Built):
        RunLoop(run, "unused", uri, mlflow_id, 0, 1).run_loop()
    assert loop_module.compile_unavailable("cpu") is None
