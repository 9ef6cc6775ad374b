"""docker/compose.yaml validated by a real compose implementation (`docker compose` plugin or
Debian's `docker-compose`), rendered with docker/.env.example, then checked for the stack's
shape and secure defaults (loopback-only ports, secrets only from the env file)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
SECRET_VARS = ("MLFLOW_TRACKING_PASSWORD", "POSTGRES_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY",
               "RAY_AUTH_TOKEN")


def compose_command() -> list[str] | None:
    """The compose CLI available here: the docker plugin if it works, else docker-compose."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


@pytest.fixture(scope="module")
def compose() -> list[str]:
    cmd = compose_command()
    if cmd is None:
        pytest.skip("no compose implementation (apt-get install docker-compose)")
    return cmd


def read_env(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def render(compose: list[str], env_file: Path) -> subprocess.CompletedProcess:
    # A bare environment: nothing from the caller's shell may fill in a variable.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [*compose, "--env-file", str(env_file), "-f", str(COMPOSE), "config"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=60,
    )


def published(service: dict) -> list[tuple[str, int]]:
    """(host_ip, target) of each published port; handles short and long syntax."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip", ""), int(port["target"])))
        else:
            parts = str(port).split("/")[0].rsplit(":", 2)
            out.append((parts[0] if len(parts) == 3 else "", int(parts[-1])))
    return out


@pytest.fixture(scope="module")
def config(compose: list[str]) -> dict:
    result = render(compose, ENV_EXAMPLE)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_stack_services(config: dict) -> None:
    assert set(config["services"]) == {"ray-head", "ray-worker", "mlflow", "postgres"}


def test_ports_bind_to_loopback_by_default(config: dict) -> None:
    ports = {name: published(svc) for name, svc in config["services"].items()}
    assert ports["ray-head"] == [("127.0.0.1", 8265)]
    assert ports["mlflow"] == [("127.0.0.1", 5000)]
    assert ports["postgres"] == [] and ports["ray-worker"] == []


def test_binding_elsewhere_is_an_explicit_opt_in(compose: list[str], tmp_path: Path) -> None:
    env_file = tmp_path / "opt-in.env"
    env_file.write_text(ENV_EXAMPLE.read_text().replace("BIND_ADDR=127.0.0.1", "BIND_ADDR=0.0.0.0"))
    result = render(compose, env_file)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert published(services["mlflow"]) == [("0.0.0.0", 5000)]
    assert published(services["ray-head"]) == [("0.0.0.0", 8265)]


@pytest.mark.parametrize("missing", SECRET_VARS)
def test_refuses_to_start_without_secrets(compose: list[str], tmp_path: Path, missing: str) -> None:
    env_file = tmp_path / "partial.env"
    env_file.write_text(
        "\n".join(f"{k}={v}" for k, v in read_env(ENV_EXAMPLE).items() if k != missing) + "\n"
    )
    result = render(compose, env_file)
    assert result.returncode != 0
    assert missing in result.stderr


def test_secrets_come_only_from_the_env_file(config: dict) -> None:
    example = read_env(ENV_EXAMPLE)
    raw = COMPOSE.read_text()
    for var in SECRET_VARS:
        assert example[var] not in raw, f"{var}'s value is hard-coded in compose.yaml"
    services = config["services"]
    mlflow_env = services["mlflow"]["environment"]
    assert mlflow_env["MLFLOW_AUTH_ADMIN_PASSWORD"] == example["MLFLOW_TRACKING_PASSWORD"]
    assert mlflow_env["MLFLOW_FLASK_SERVER_SECRET_KEY"] == example["MLFLOW_FLASK_SERVER_SECRET_KEY"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == example["POSTGRES_PASSWORD"]
    for node in ("ray-head", "ray-worker"):
        env = services[node]["environment"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["MLFLOW_TRACKING_PASSWORD"] == example["MLFLOW_TRACKING_PASSWORD"]
        # The Ray cluster and its Jobs API demand the token.
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"] == example["RAY_AUTH_TOKEN"]
    # Secrets are runtime environment only: no build args carry them into an image.
    for svc in services.values():
        assert not (svc.get("build") or {}).get("args"), svc


def test_env_file_is_gitignored_and_example_is_not() -> None:
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0

    assert ignored("docker/.env")
    assert not ignored("docker/.env.example")


def test_mlflow_uses_basic_auth_and_postgres(config: dict) -> None:
    mlflow = config["services"]["mlflow"]
    assert mlflow["build"]["dockerfile"] == "docker/mlflow.Dockerfile"
    dockerfile = (DOCKER / "mlflow.Dockerfile").read_text()
    assert '"--app-name", "basic-auth"' in dockerfile
    assert mlflow["environment"]["MLFLOW_BACKEND_STORE_URI"].startswith(
        "postgresql+psycopg://mlflow:"
    )
    assert mlflow["environment"]["MLFLOW_BACKEND_STORE_URI"].endswith("@postgres:5432/mlflow")
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"
    mounts = {str(v).split(":")[1] if isinstance(v, str) else v["target"] for v in mlflow["volumes"]}
    assert {"/mlflow/artifacts", "/mlflow/auth"} <= mounts


def test_ray_workers_reserve_gpus_and_share_storage(config: dict) -> None:
    services = config["services"]
    devices = services["ray-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}] or devices == [
        {"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}  # compose v2 renders all as -1
    ]
    assert "--address=ray-head:6379" in services["ray-worker"]["command"]
    assert "--head" in services["ray-head"]["command"]

    def data_mount(svc: dict) -> str:
        for v in svc["volumes"]:
            source, target = (v.split(":")[:2] if isinstance(v, str) else (v["source"], v["target"]))
            if target == "/data":
                return source
        raise AssertionError(f"no /data mount in {svc}")

    assert data_mount(services["ray-head"]) == data_mount(services["ray-worker"]) == "qkstudy-data"
