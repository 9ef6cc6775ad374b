"""Real services for the deployment tests, started without containers.

`postgres_server` runs Debian's PostgreSQL (initdb + pg_ctl in a throwaway directory, TCP on a
free loopback port, password auth). `mlflow_pg_server` runs `mlflow server --app-name basic-auth`
on top of it, the same way docker/compose.yaml does: backend store on Postgres, proxied artifacts
on disk, admin credentials from environment variables, auth config from an ini file that holds
no secret. Both are session-scoped and reusable by any test (e.g. a tiny study against the
server): the fixture yields ``(tracking_uri, username, password)``.

Tests skip only when the PostgreSQL server binaries are truly absent (CI installs them:
`apt-get install postgresql`).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"


def find_pg_bindir() -> Path | None:
    """Directory holding initdb/pg_ctl/postgres: PATH first, then Debian's versioned layout."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
    )
    for bindir in reversed(candidates):
        if all((Path(bindir) / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres")):
            return Path(bindir)
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class PostgresServer:
    """A running PostgreSQL cluster on loopback: connect as `user`/`password` over TCP."""

    host: str
    port: int
    user: str
    password: str

    def uri(self, database: str) -> str:
        """SQLAlchemy URI for `database` (driver psycopg 3, named explicitly)."""
        return f"postgresql+psycopg://{self.user}:{self.password}@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database `name` and return its URI."""
        import psycopg
        from psycopg import sql

        conn = psycopg.connect(
            host=self.host, port=self.port, user=self.user, password=self.password,
            dbname="postgres", autocommit=True,  # CREATE DATABASE refuses a transaction
        )
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        finally:
            conn.close()
        return self.uri(name)


def _as_pg_owner(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to the `postgres` account when we are root."""
    if os.geteuid() != 0:
        return argv
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL as non-root")
    return [runuser, "-u", "postgres", "--", *argv]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """Start a fresh PostgreSQL cluster for this test session; stop and delete it afterwards."""
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not installed")
    pytest.importorskip("psycopg", reason="psycopg (extra 'server') is needed to reach Postgres")
    root = Path(tempfile.mkdtemp(prefix="qkstudy-pg-"))  # not under pytest's 0700 root dir
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data = root / "data"
    pwfile = root / "pwfile"
    user, password = "qkstudy", secrets.token_urlsafe(16)
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        os.chown(pwfile, pw.pw_uid, pw.pw_gid)
    os.chmod(pwfile, 0o600)
    port = free_port()
    subprocess.run(
        _as_pg_owner([str(bindir / "initdb"), "-D", str(data), "-U", user, f"--pwfile={pwfile}",
                      "--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
                      "--encoding=UTF8", "--no-sync"]),
        check=True, capture_output=True, timeout=120,
    )
    pwfile.unlink()
    # Socket dir inside the cluster: no need for the system's /var/run/postgresql.
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
    subprocess.run(
        _as_pg_owner([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts,
                      "-l", str(root / "server.log"), "-w", "-t", "60", "start"]),
        check=True, capture_output=True, timeout=90,
    )
    try:
        yield PostgresServer("127.0.0.1", port, user, password)
    finally:
        subprocess.run(
            _as_pg_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
            capture_output=True, timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def wait_http(url: str, *, timeout_s: float, proc: subprocess.Popen | None = None) -> int:
    """Poll `url` until the server answers (any HTTP status); return that status code."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


class MlflowServer(tuple):
    """``(tracking_uri, username, password)``, plus where the server logs and its secrets."""

    def __new__(cls, uri: str, username: str, password: str, *, log_path: Path,
                secrets_in_env: tuple[str, ...]) -> MlflowServer:
        obj = super().__new__(cls, (uri, username, password))
        obj.log_path = log_path
        obj.secrets_in_env = secrets_in_env
        return obj


def _env_example() -> dict[str, str]:
    """KEY=value pairs of docker/.env.example (comments skipped)."""
    pairs = {}
    for line in (DOCKER_DIR / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def _stop_group(proc: subprocess.Popen, timeout_s: float = 5) -> None:
    """SIGTERM the process group we started, SIGKILL it if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


@pytest.fixture(scope="session")
def mlflow_pg_server(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowServer]:
    """`mlflow server --app-name basic-auth` on loopback with a Postgres backend store.

    Configured like docker/compose.yaml: the committed docker/mlflow/basic_auth.ini (no secrets;
    its sqlite auth-db path is overridden to a temp file here), backend URI and admin
    credentials from environment variables only, the Host allow-list of docker/.env.example,
    artifacts proxied to a local directory.
    Yields an `MlflowServer`: unpacks as ``(tracking_uri, username, password)``.
    """
    work = tmp_path_factory.mktemp("mlflow-server")
    backend_uri = postgres_server.create_database("mlflow")
    ini = (DOCKER_DIR / "mlflow" / "basic_auth.ini").read_text()
    ini = "\n".join(
        f"database_uri = sqlite:///{work / 'basic_auth.db'}"
        if line.startswith("database_uri") else line
        for line in ini.splitlines()
    )
    (work / "basic_auth.ini").write_text(ini + "\n")
    username, password = "qkstudy-admin", secrets.token_urlsafe(16)
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_BACKEND_STORE_URI": backend_uri,
        "MLFLOW_AUTH_CONFIG_PATH": str(work / "basic_auth.ini"),
        "MLFLOW_AUTH_ADMIN_USERNAME": username,
        "MLFLOW_AUTH_ADMIN_PASSWORD": password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(32),  # CSRF key of the auth app
        # Host-header allow-list exactly as docker/.env.example ships it.
        "MLFLOW_SERVER_ALLOWED_HOSTS": _env_example()["MLFLOW_ALLOWED_HOSTS"],
    }
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(var, None)
    log = open(work / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--artifacts-destination", str(work / "artifacts")],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work,
        start_new_session=True,  # its own process group: the uvicorn workers stop with it
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_http(f"{uri}/health", timeout_s=120, proc=proc)
        except (RuntimeError, TimeoutError) as err:
            log.flush()
            tail = (work / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"mlflow server did not come up: {err}\n{tail}") from err
        yield MlflowServer(
            uri, username, password, log_path=work / "server.log",
            secrets_in_env=(password, postgres_server.password,
                            env["MLFLOW_FLASK_SERVER_SECRET_KEY"]),
        )
    finally:
        _stop_group(proc)
        log.close()


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """Path of a `docker` CLI whose engine answers; skips (saying how to get one) otherwise."""
    exe = shutil.which("docker")
    if exe is None:
        pytest.skip("no docker CLI (apt-get install docker.io; .ci/run does)")
    res = subprocess.run([exe, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        pytest.skip(f"the Docker engine does not answer ({res.stderr.strip()[:200]}): start dockerd (.ci/run does)")
    return exe
