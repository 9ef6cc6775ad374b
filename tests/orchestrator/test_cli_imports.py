"""The light commands answer without importing the heavy stack: which modules a fresh
``qkstudy`` process loads (no timing here: `python -m benchmarks.cli_latency` measures it)."""

import importlib
import os

import pytest

from benchmarks.cli_latency import HEAVY, cli_heavy_modules
from orchestrator.cli_errors import INPUT_ERRORS
from tests.helpers import REPO

DEMO = str(REPO / "jobs" / "cpu-demo.yaml")
NEVER = {"mlflow", "ray", "pandas", "matplotlib", "deepspeed", "scipy"}


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
@pytest.mark.parametrize(
    "args, code",
    [(["validate", DEMO], 0), (["plan", DEMO], 0), (["schema"], 0), (["validate", "bad.yaml"], 2), (["status", "no-such-study"], 2)],
)
def test_light_commands_do_not_import_mlflow_ray_or_pandas(args, code, tmp_path):
    (tmp_path / "bad.yaml").write_text(
        "name: b\nscales: [cpu-xs, {name: w, n_layer: 2, d_model: 100, n_head: 3}]\nvariants: [standard]\nbudget: {tokens: 40960}\n"
    )
    rc, heavy = cli_heavy_modules(args, cwd=tmp_path)
    assert rc == code
    assert not NEVER & set(heavy), heavy
    assert not (tmp_path / "runs").exists()  # and nothing was written


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_the_probe_sees_what_a_command_imports(tmp_path):
    # negative control: `model info` builds a model, so torch must show up
    rc, heavy = cli_heavy_modules(["model", "info", "--preset", "cpu-xs", "--json"], cwd=tmp_path)
    assert rc == 0 and "torch" in heavy and set(heavy) <= set(HEAVY)


def test_every_input_error_is_named_by_the_module_that_defines_it():
    for module, name in INPUT_ERRORS:
        cls = getattr(importlib.import_module(module), name)
        assert cls.__module__ == module and issubclass(cls, Exception), (module, name)


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_load_no_torch(command):
    # the planner counts parameters and FLOPs by arithmetic (model.counts), not on a torch model
    rc, heavy = cli_heavy_modules([command, DEMO])
    assert rc == 0
    assert "torch" not in heavy and "deepspeed" not in heavy, heavy


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_status_of_a_sqlite_store_reads_it_without_mlflow(tmp_path):
    """`status` of the embedded store answers from sqlite3 (``track.sqlite_runs``); an http
    store still goes through MLflow's client (the negative control: a server URI that does not
    answer loads mlflow)."""
    from mlflow.tracking import MlflowClient

    from orchestrator.track.tracking import KIND_TAG, sqlite_uri

    store = sqlite_uri(tmp_path / "mlflow.db")
    c = MlflowClient(store)
    c.create_run(c.create_experiment("st"), tags={KIND_TAG: "train", "run_id": "r1", "status": "finished"})
    rc, heavy = cli_heavy_modules(["status", "st", "--tracking-uri", store, "--json"], cwd=tmp_path)
    assert rc == 0 and not NEVER & set(heavy), heavy
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}
    rc, heavy = cli_heavy_modules(["status", "st", "--tracking-uri", "http://127.0.0.1:9"], cwd=tmp_path, env=env)
    assert rc == 1 and "mlflow" in heavy  # a server that does not answer: exit 1, said in one line
