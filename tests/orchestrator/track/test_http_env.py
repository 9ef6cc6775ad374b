"""The driver, its local workers and a submitted job's workers retry MLflow the same way:
the CLI sets ``track.http_env``'s values at start-up, a job forwards them to its workers, and
a value the user set wins everywhere."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from orchestrator.run.driver.submit import build_job
from orchestrator.track.http_env import MLFLOW_HTTP_ENV, OUTAGE_ENV
from tests.helpers import REPO

SPEC = {
    "name": "s",
    "corpus": {"source": "stdlib", "max_documents": 4},
    "scales": ["cpu-xs"],
    "variants": ["standard"],
    "budget": {"mode": "tokens", "tokens": 4096},
    "tracking_uri": "http://mlflow:5000",
    "storage_path": "/shared/s",
}


def _cli_env(**extra: str) -> dict[str, str]:
    code = "import json, os, orchestrator.cli; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('MLFLOW_HTTP')}))"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MLFLOW_HTTP")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**env, **extra}, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cli_sets_one_retry_policy_and_a_users_value_wins():
    assert _cli_env() == MLFLOW_HTTP_ENV
    assert _cli_env(MLFLOW_HTTP_REQUEST_TIMEOUT="7")["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"


def test_a_submitted_job_gives_its_workers_the_drivers_settings(tmp_path, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    for k in MLFLOW_HTTP_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")
    monkeypatch.setenv(OUTAGE_ENV, "600")
    env = build_job(spec, "http://127.0.0.1:8265", working_dir=tmp_path)["runtime_env"]["env_vars"]
    assert {k: env[k] for k in MLFLOW_HTTP_ENV} == {**MLFLOW_HTTP_ENV, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4"}
    assert env[OUTAGE_ENV] == "600"
