"""docker/compose.yaml (+ compose.gpu.yaml) validated by a real compose implementation (`docker
compose` plugin or Debian's `docker-compose`), rendered with docker/.env.example, then checked
for the stack's shape and secure defaults: loopback-only ports, secrets only from the env file
and each container holding only the secrets it uses, one init per container, the shared volume
at the paths the jobs/ specs use. (tests/docker/test_stack.py runs the stack for real.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
GPU = DOCKER / "compose.gpu.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
SECRET_VARS = (
    "MLFLOW_ADMIN_PASSWORD",
    "QKSTUDY_TRAINING_PASSWORD",
    "QKSTUDY_READER_PASSWORD",
    "POSTGRES_PASSWORD",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "RAY_AUTH_TOKEN",
)
RAY_NODES = ("ray-head", "ray-worker")


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


def render(compose: list[str], env_file: Path, *files: Path) -> subprocess.CompletedProcess:
    # A bare environment: nothing from the caller's shell may fill in a variable.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    args = [a for f in (files or (COMPOSE,)) for a in ("-f", str(f))]
    return subprocess.run(
        [*compose, "--env-file", str(env_file), *args, "config"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
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


def mounts(service: dict) -> dict[str, str]:
    """{target: source} of a service's volumes (short and long syntax)."""
    out = {}
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2] if isinstance(v, str) else (v["source"], v["target"])
        out[target] = source
    return out


@pytest.fixture(scope="module")
def config(compose: list[str]) -> dict:
    result = render(compose, ENV_EXAMPLE)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_stack_services(config: dict) -> None:
    assert set(config["services"]) == {"ray-head", "ray-worker", "mlflow", "mlflow-users", "postgres"}
    images = {name: svc["image"] for name, svc in config["services"].items()}
    assert images == {
        "ray-head": "qkstudy:latest",
        "ray-worker": "qkstudy:latest",
        "mlflow": "qkstudy-mlflow:latest",
        "mlflow-users": "qkstudy-mlflow:latest",
        "postgres": "qkstudy-postgres:latest",
    }
    # Built by `make images` (legacy builder, BASE_IMAGE), never by compose with other arguments.
    assert not any("build" in svc for svc in config["services"].values())


def test_ports_bind_to_loopback_by_default(config: dict) -> None:
    ports = {name: published(svc) for name, svc in config["services"].items()}
    assert ports == {
        "ray-head": [("127.0.0.1", 8265)],
        "mlflow": [("127.0.0.1", 5000)],
        "postgres": [],
        "ray-worker": [],
        "mlflow-users": [],
    }


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
    env_file.write_text("\n".join(f"{k}={v}" for k, v in read_env(ENV_EXAMPLE).items() if k != missing) + "\n")
    result = render(compose, env_file)
    assert result.returncode != 0
    assert missing in result.stderr


def test_each_container_gets_only_the_secrets_it_uses(config: dict) -> None:
    example = read_env(ENV_EXAMPLE)
    raw = COMPOSE.read_text()
    for var in SECRET_VARS:
        assert example[var] not in raw, f"{var}'s value is hard-coded in compose.yaml"

    def holds(service: str) -> set[str]:
        values = " ".join(str(v) for v in (config["services"][service].get("environment") or {}).values())
        return {var for var in SECRET_VARS if example[var] in values}

    assert holds("postgres") == {"POSTGRES_PASSWORD"}
    assert holds("mlflow") == {"POSTGRES_PASSWORD", "MLFLOW_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"}
    assert holds("mlflow-users") == {"MLFLOW_ADMIN_PASSWORD", "QKSTUDY_TRAINING_PASSWORD", "QKSTUDY_READER_PASSWORD"}
    for node in RAY_NODES:
        assert holds(node) == {"RAY_AUTH_TOKEN", "QKSTUDY_TRAINING_PASSWORD"}, node
        env = config["services"][node]["environment"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["MLFLOW_TRACKING_USERNAME"] == example["QKSTUDY_TRAINING_USERNAME"] != example["MLFLOW_ADMIN_USERNAME"]
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_TRAIN_V2_ENABLED"] == "1"


def test_env_files_are_gitignored_and_examples_are_not() -> None:
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0

    assert ignored("docker/.env") and ignored("docker/cluster.env")
    assert not ignored("docker/.env.example") and not ignored("docker/cluster.env.example")


def test_mlflow_uses_basic_auth_and_postgres(config: dict) -> None:
    mlflow = config["services"]["mlflow"]
    dockerfile = (DOCKER / "mlflow.Dockerfile").read_text()
    assert '"--app-name", "basic-auth"' in dockerfile
    uri = mlflow["environment"]["MLFLOW_BACKEND_STORE_URI"]
    assert uri.startswith("postgresql+psycopg://mlflow:") and uri.endswith("@postgres:5432/mlflow")
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert {"/mlflow/artifacts", "/mlflow/auth"} <= set(mounts(mlflow))
    users = config["services"]["mlflow-users"]
    assert users["depends_on"]["mlflow"]["condition"] == "service_healthy"
    assert users["command"] == ["python", "/usr/local/lib/qkstudy/create_user.py"]
    for node in RAY_NODES:  # the nodes start once the training account exists
        deps = config["services"][node]["depends_on"]
        assert "mlflow-users" in deps or deps.get("ray-head", {}).get("condition") == "service_healthy"
    assert config["services"]["ray-head"]["depends_on"]["mlflow-users"]["condition"] == "service_completed_successfully"


def test_no_second_init(config: dict) -> None:
    """The images' PID 1 is tini (Ray, MLflow) or postgres itself: `init: true` would stack
    docker-init on top of it."""
    assert [name for name, svc in config["services"].items() if svc.get("init")] == []


def test_shared_storage_is_where_the_cluster_specs_point(config: dict) -> None:
    services = config["services"]
    assert mounts(services["ray-head"])["/shared"] == mounts(services["ray-worker"])["/shared"] == "qkstudy-shared"
    assert services["ray-head"]["environment"]["QKSTUDY_CACHE"].startswith("/shared/")
    from orchestrator.plan.spec import load_spec

    specs = {p.name: load_spec(p).model_dump() for p in sorted((REPO / "jobs").glob("*.yaml"))}  # extends resolved
    cluster = {n: s for n, s in specs.items() if str(s.get("tracking_uri") or "").startswith("http://mlflow")}
    assert len(cluster) >= 3, "the paper specs target the stack"
    for name, spec in cluster.items():
        assert spec["storage_path"].startswith("/shared/qkstudy/"), name
        corpora = spec.get("corpora") or {"": spec["corpus"]}
        for corpus in corpora.values():
            for path in (corpus.get("paths") or []) + (corpus.get("val_paths") or []):
                assert path.startswith("/shared/data/"), (name, path)


def test_cpu_workers_need_no_gpu_and_the_gpu_override_takes_them_all(compose: list[str], config: dict) -> None:
    services = config["services"]
    assert "deploy" not in services["ray-worker"]
    assert "--address=ray-head:6379" in services["ray-worker"]["command"]
    assert "--head" in services["ray-head"]["command"] and "--num-gpus=0" in services["ray-head"]["command"]
    result = render(compose, ENV_EXAMPLE, COMPOSE, GPU)
    assert result.returncode == 0, result.stderr
    worker = yaml.safe_load(result.stdout)["services"]["ray-worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices in (
        [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}],
        [{"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}],
    )  # v2 renders all as -1
    assert not any(a.startswith("--num-cpus") for a in worker["command"])  # detected on a GPU host


def test_scaling_gpu_workers_on_one_host_is_refused(tmp_path: Path) -> None:
    """`WORKERS=2 GPU=1`: two replicas would be handed the same GPUs; stack.sh refuses (exit 2)
    before touching docker."""
    env_file = tmp_path / "s.env"
    env_file.write_text(
        "\n".join(f"{k}={'x' * 8}{k.lower()}{'y' * 8}" if k in SECRET_VARS else f"{k}={v}" for k, v in read_env(ENV_EXAMPLE).items()) + "\n"
    )
    res = subprocess.run(
        [str(DOCKER / "stack.sh"), "up"],
        env={**os.environ, "ENV_FILE": str(env_file), "GPU": "1", "WORKERS": "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "holds all of its host's GPUs" in res.stderr, res.stderr


def networks_of(service: dict) -> set[str]:
    nets = service.get("networks") or {}
    return set(nets) if isinstance(nets, (dict, list)) else set()


def test_postgres_is_on_an_internal_network_the_ray_nodes_are_not_on(config: dict) -> None:
    """The Ray containers run users' code: they reach MLflow (frontend), never Postgres
    (backend, internal: no route out either). tests/docker/test_stack.py checks it live."""
    nets, services = config["networks"], config["services"]
    assert nets["backend"].get("internal") is True
    assert not (nets.get("frontend") or {}).get("internal")
    on_backend = {name for name, svc in services.items() if "backend" in networks_of(svc)}
    assert on_backend == {"mlflow", "postgres"}
    assert networks_of(services["postgres"]) == {"backend"}
    assert networks_of(services["mlflow"]) == {"frontend", "backend"}  # its published port: frontend
    for name in (*RAY_NODES, "mlflow-users"):
        assert networks_of(services[name]) == {"frontend"}, name


def test_mlflow_connects_as_a_role_that_is_no_superuser() -> None:
    """docker/postgres/entrypoint.sh: the superuser `postgres` has no password (peer, socket
    only); POSTGRES_USER owns the database without superuser rights; pg_hba.conf admits it over
    TCP to its database from the backend network only (no `host all all all`)."""
    script = (DOCKER / "postgres" / "entrypoint.sh").read_text()
    assert "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" in script and "OWNER $role" in script
    assert "--pwfile" not in script and "-U postgres" in script
    hba = script.split('cat >"$PGDATA/pg_hba.conf" <<EOF', 1)[1].split("\nEOF\n", 1)[0]
    rules = [line.split() for line in hba.splitlines() if line.strip() and not line.startswith("#")]
    assert rules == [
        ["local", "all", "postgres", "peer"],
        ["local", "$(ident", '"$db")', "$role", "scram-sha-256"],
        ["host", "$(ident", '"$db")', "$role", "samenet", "scram-sha-256"],
    ]


def test_every_container_is_hardened(compose: list[str], config: dict) -> None:
    for name, svc in config["services"].items():
        assert svc.get("cap_drop") == ["ALL"] and not svc.get("cap_add"), name  # all run as non-root uids
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert svc.get("mem_limit") and int(svc.get("pids_limit", 0)) > 0, name
        assert svc["logging"]["driver"] == "json-file", name
        assert svc["logging"]["options"]["max-size"] and int(svc["logging"]["options"]["max-file"]) >= 2, name
        assert not svc.get("privileged") and not svc.get("read_only"), name
    for node in RAY_NODES:  # the object store's /dev/shm stays (its size counts toward mem_limit)
        assert config["services"][node]["shm_size"]
    result = render(compose, ENV_EXAMPLE, COMPOSE, GPU)
    assert result.returncode == 0, result.stderr
    worker = yaml.safe_load(result.stdout)["services"]["ray-worker"]
    assert worker["cap_drop"] == ["ALL"] and worker["mem_limit"] and worker["shm_size"]


def run_script(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*argv], env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_restore_refuses_a_missing_or_partial_backup(tmp_path: Path) -> None:
    """docker/backup.sh checks the folder before it touches docker: exit 2, saying why."""
    script = str(DOCKER / "backup.sh")
    env_file = tmp_path / "s.env"
    env_file.write_text(f"COMPOSE_PROJECT_NAME=qkstudy-none-{os.getpid()}\n")
    env = {"ENV_FILE": str(env_file)}
    res = run_script(script, "restore", env=env)
    assert res.returncode == 2 and "set BACKUP_DIR" in res.stderr
    res = run_script(script, "restore", env={**env, "BACKUP_DIR": str(tmp_path / "nowhere")})
    assert res.returncode == 2 and "no such backup folder" in res.stderr
    backup = tmp_path / "b"
    backup.mkdir()
    (backup / "postgres.dump").write_bytes(b"x")
    res = run_script(script, "restore", env={**env, "BACKUP_DIR": str(backup)})
    assert res.returncode == 2 and "no SHA256SUMS" in res.stderr and "partial" in res.stderr
    files = ("postgres.dump", "mlflow-artifacts.tar.gz", "mlflow-auth.tar.gz", "qkstudy-shared.tar.gz")
    for f in files[1:]:
        (backup / f).write_bytes(b"y")
    sums = subprocess.run(["sha256sum", *files], cwd=backup, capture_output=True, text=True, check=True).stdout
    (backup / "SHA256SUMS").write_text(sums)
    (backup / "mlflow-auth.tar.gz").unlink()
    res = run_script(script, "restore", env={**env, "BACKUP_DIR": str(backup)})
    assert res.returncode == 2 and "mlflow-auth.tar.gz missing" in res.stderr
    (backup / "mlflow-auth.tar.gz").write_bytes(b"changed")
    res = run_script(script, "restore", env={**env, "BACKUP_DIR": str(backup)})
    assert res.returncode == 2 and "does not match SHA256SUMS" in res.stderr
    res = run_script(script, "backup", env={**env, "BACKUP_DIR": str(backup)})  # never over a backup
    assert res.returncode == 2 and "already holds a backup" in res.stderr


def test_down_keeps_the_volumes_unless_purge() -> None:
    """`make stack-down` keeps the data; PURGE=1 deletes it (the only path to `down --volumes`)."""
    script = (DOCKER / "stack.sh").read_text()
    assert script.count("--volumes") == 1 and "1) purge=(--volumes) ;;" in script
    assert "KEEP_DATA" not in (REPO / "Makefile").read_text()
