"""docker/check_env.py: the stack refuses docker/.env.example's placeholders (and short, missing
or misplaced secrets) before anything starts, on the host (`make stack-up`) and in each
image's entrypoint (`--exec`)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

CHECK = REPO / "docker" / "check_env.py"
EXAMPLE = REPO / "docker" / ".env.example"
SECRETS = (
    "MLFLOW_ADMIN_PASSWORD",
    "QKSTUDY_TRAINING_PASSWORD",
    "QKSTUDY_READER_PASSWORD",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "RAY_AUTH_TOKEN",
    "POSTGRES_PASSWORD",
)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"], **(env or {})}
    )


def good_env_file(tmp_path: Path, **override: str) -> Path:
    """docker/.env.example with every secret replaced by a fresh random one."""
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        key = line.partition("=")[0]
        if key in SECRETS:
            line = f"{key}={override.get(key, secrets.token_urlsafe(24))}"
        lines.append(line)
    path = tmp_path / "stack.env"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_example_file_is_refused_naming_every_secret() -> None:
    res = run(str(EXAMPLE))
    assert res.returncode == 2
    for name in SECRETS:
        assert f"{EXAMPLE}: {name} is still a placeholder" in res.stderr, res.stderr


def test_a_file_with_real_secrets_passes(tmp_path: Path) -> None:
    res = run(str(good_env_file(tmp_path)))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "value,why", [("", "is empty"), ("short-but-real", "is shorter than 16"), ("ChangeMe-please-0123456789", "is still a placeholder")]
)
def test_each_bad_value_is_named(tmp_path: Path, value: str, why: str) -> None:
    res = run(str(good_env_file(tmp_path, RAY_AUTH_TOKEN=value)))
    assert res.returncode == 2 and f"RAY_AUTH_TOKEN {why}" in res.stderr, res.stderr
    assert res.stderr.count("error:") == 1  # the other secrets are fine


def test_missing_secret_and_file_rules(tmp_path: Path) -> None:
    env_file = good_env_file(tmp_path)
    env_file.write_text("\n".join(line for line in env_file.read_text().splitlines() if not line.startswith("POSTGRES_PASSWORD=")) + "\n")
    assert "POSTGRES_PASSWORD is not set" in run(str(env_file)).stderr
    same = secrets.token_urlsafe(24)
    res = run(str(good_env_file(tmp_path, MLFLOW_ADMIN_PASSWORD=same, QKSTUDY_TRAINING_PASSWORD=same)))
    assert res.returncode == 2 and "QKSTUDY_TRAINING_PASSWORD must differ from MLFLOW_ADMIN_PASSWORD" in res.stderr
    res = run(str(good_env_file(tmp_path, QKSTUDY_TRAINING_PASSWORD=same, QKSTUDY_READER_PASSWORD=same)))
    assert res.returncode == 2 and "QKSTUDY_READER_PASSWORD must differ from QKSTUDY_TRAINING_PASSWORD" in res.stderr
    res = run(str(good_env_file(tmp_path, POSTGRES_PASSWORD="a/b@c" + secrets.token_hex(8))))
    assert res.returncode == 2 and "URL-safe" in res.stderr
    assert run(str(tmp_path / "absent.env")).returncode == 2


def test_each_account_needs_its_own_username(tmp_path: Path) -> None:
    """One name for two accounts is refused, including a name equal to another's compose default."""
    env_file = good_env_file(tmp_path)
    lines = env_file.read_text().splitlines()
    env_file.write_text(
        "\n".join("QKSTUDY_READER_USERNAME=qkstudy-train" if line.startswith("QKSTUDY_READER_USERNAME=") else line for line in lines) + "\n"
    )
    res = run(str(env_file))
    assert res.returncode == 2 and "QKSTUDY_READER_USERNAME (qkstudy-train) must differ from QKSTUDY_TRAINING_USERNAME" in res.stderr
    # the training name left out: compose's default qkstudy-train still collides
    env_file.write_text(
        "\n".join(line for line in env_file.read_text().splitlines() if not line.startswith("QKSTUDY_TRAINING_USERNAME=")) + "\n"
    )
    assert "must differ from QKSTUDY_TRAINING_USERNAME" in run(str(env_file)).stderr
    env_file.write_text("\n".join(line for line in lines if not line.startswith("QKSTUDY_READER_USERNAME=")) + "\n")
    assert run(str(env_file)).returncode == 0  # defaults differ


def test_exec_checks_the_environment_then_runs_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ok = {"RAY_AUTH_TOKEN": secrets.token_hex(16)}
    assert run("--exec", "touch", str(marker), env=ok).returncode == 0 and marker.exists()
    marker.unlink()
    res = run("--exec", "touch", str(marker), env={"RAY_AUTH_TOKEN": "change-me-ray-token"})
    assert res.returncode == 2 and "environment: RAY_AUTH_TOKEN" in res.stderr and not marker.exists()
    # A password inside a URI counts too (the MLflow server's backend store).
    res = run("--exec", "true", env={"MLFLOW_BACKEND_STORE_URI": "postgresql+psycopg://mlflow:change-me@postgres/mlflow"})
    assert res.returncode == 2 and "MLFLOW_BACKEND_STORE_URI: its password" in res.stderr


def test_ray_role_refuses_server_secrets() -> None:
    node = {"RAY_AUTH_TOKEN": secrets.token_hex(16), "MLFLOW_TRACKING_PASSWORD": secrets.token_hex(16)}
    assert run("--role", "ray", "--exec", "true", env=node).returncode == 0
    res = run("--role", "ray", "--exec", "true", env={**node, "POSTGRES_PASSWORD": secrets.token_hex(16)})
    assert res.returncode == 2 and "POSTGRES_PASSWORD is set, but a Ray node" in res.stderr
    # Without the role (the MLflow server) the same variable is expected.
    assert run("--exec", "true", env={**node, "POSTGRES_PASSWORD": secrets.token_hex(16)}).returncode == 0
