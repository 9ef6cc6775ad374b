"""docker/postgres/entrypoint.sh re-keys MLflow's role from POSTGRES_PASSWORD at every start, so
a password rotated in docker/.env applies at the next `make stack-up` instead of locking MLflow
out (the official image reads it only on an empty volume). Run on this machine's PostgreSQL
binaries, as the container would run it: a fresh data folder, then a restart with a new
password; the old one is refused afterwards (the negative control)."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.fixtures.services import _as_pg_owner, find_pg_bindir
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.slow  # a real PostgreSQL server, twice

ENTRYPOINT = REPO / "docker" / "postgres" / "entrypoint.sh"


def _start(data: Path, port: int, password: str, bindir: Path, log: Path) -> subprocess.Popen:
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "PGDATA": str(data),
        "PGPORT": str(port),
        "POSTGRES_USER": "mlflow",
        "POSTGRES_PASSWORD": password,
        "POSTGRES_DB": "mlflow",
    }
    argv = _as_pg_owner(["env", *(f"{k}={v}" for k, v in env.items()), "bash", str(ENTRYPOINT)])
    return subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def _login(port: int, password: str) -> str:
    """'ok', or the server's refusal; waits for the server to listen (up to 60 s)."""
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(host="127.0.0.1", port=port, user="mlflow", password=password, dbname="mlflow", connect_timeout=5) as conn:
                (superuser,) = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
                return "superuser" if superuser else "ok"
        except psycopg.OperationalError as err:
            if "password authentication failed" in str(err) or time.monotonic() > deadline:
                return str(err)
            time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # the entrypoint exec'd postgres: SIGTERM is its smart shutdown
    proc.wait(timeout=60)


def test_a_rotated_password_applies_at_the_next_start(tmp_path) -> None:
    bindir = find_pg_bindir()
    if bindir is None or not Path("/var/run/postgresql").is_dir():
        pytest.skip("PostgreSQL server binaries (and their socket folder) not installed")
    root = Path(tempfile.mkdtemp(prefix="qkstudy-pgrekey-"))
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data, log, port = root / "data", tmp_path / "postgres.log", free_port()
    old, new = secrets.token_urlsafe(18), secrets.token_urlsafe(18)
    try:
        proc = _start(data, port, old, bindir, log)
        try:
            assert _login(port, old) == "ok", log.read_text()[-2000:]  # a role, not a superuser
        finally:
            _stop(proc)
        proc = _start(data, port, new, bindir, log)
        try:
            assert _login(port, new) == "ok", log.read_text()[-2000:]
            assert "password authentication failed" in _login(port, old)
        finally:
            _stop(proc)
        assert new not in log.read_text() and old not in log.read_text()  # no password in its log
    finally:
        shutil.rmtree(root, ignore_errors=True)
