"""Torch-extension build locks: a stale one (its builder killed) is removed and said so; one a
live process holds open, or builds under, is left alone; a waiter is freed by the sweeper; and
(slow) the planted lock that hangs a real DeepSpeed op load is cleared by ``--prebuild``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from pathlib import Path

import pytest
from torch.utils.file_baton import FileBaton

from orchestrator.run.ext_lock import clear_stale_locks, find_locks, lock_users, pin_ninja, sweeping
from tests.helpers import REPO

OP = "deepspeed_shm_comm"


def _plant(root: Path, age_s: float = 3600.0, op: str = OP) -> Path:
    """A lock file as a killed FileBaton holder leaves it, ``age_s`` old."""
    d = root / op
    d.mkdir(parents=True, exist_ok=True)
    lock = d / "lock"
    os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def _holder(lock: Path, cwd: Path | None = None) -> subprocess.Popen:
    """A live child that took ``lock`` with torch's own FileBaton (fd kept open), or, when
    ``lock`` exists already, one that only works in ``cwd`` (a ninja left running)."""
    code = textwrap.dedent("""
        import sys, time
        from torch.utils.file_baton import FileBaton
        if sys.argv[2] == "take":
            assert FileBaton(sys.argv[1]).try_acquire()
        print("ready", flush=True)
        time.sleep(600)
    """)
    take = "take" if not lock.exists() else "cwd"
    p = subprocess.Popen([sys.executable, "-c", code, str(lock), take], stdout=subprocess.PIPE, text=True, cwd=cwd or REPO)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_planted_stale_lock_is_found_and_removed(tmp_path):
    lock = _plant(tmp_path / "py311_cpu")  # the default root's layout: <tag>/<op>/lock
    other = _plant(tmp_path, op="other_op")  # $TORCH_EXTENSIONS_DIR's layout: <op>/lock
    assert find_locks([tmp_path]) == sorted([lock, other])
    assert lock_users(lock) == []
    msgs = clear_stale_locks([tmp_path], recheck_s=0.1)
    assert len(msgs) == 2 and all("removed stale torch-extension build lock" in m for m in msgs)
    assert str(lock) in " ".join(msgs) and not lock.exists() and not other.exists()
    assert clear_stale_locks([tmp_path], recheck_s=0.1) == []


def test_lock_held_open_by_a_live_process_is_kept_until_it_dies(tmp_path):
    lock = tmp_path / OP / "lock"
    lock.parent.mkdir()
    p = _holder(lock)
    try:
        os.utime(lock, (time.time() - 3600, time.time() - 3600))  # old, but held
        assert p.pid in (lock_users(lock) or [])
        assert clear_stale_locks([tmp_path], recheck_s=0.1) == [] and lock.exists()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    # the holder was killed mid-build: now nobody holds it
    msgs = clear_stale_locks([tmp_path], recheck_s=0.1)
    assert len(msgs) == 1 and not lock.exists()


def test_lock_is_kept_while_a_process_builds_in_its_folder_or_when_young(tmp_path):
    lock = _plant(tmp_path)
    p = _holder(lock, cwd=lock.parent)  # no fd on the lock, but working in the build dir
    try:
        assert lock_users(lock) == [p.pid]
        assert clear_stale_locks([tmp_path], recheck_s=0.1) == [] and lock.exists()
    finally:
        p.kill()
        p.wait()
    young = _plant(tmp_path, age_s=0.0, op="young_op")
    msgs = clear_stale_locks([tmp_path], min_age_s=60, recheck_s=0.1)
    assert len(msgs) == 1 and str(lock) in msgs[0]  # stale once its builder was gone
    assert young.exists() and not lock.exists()  # too young to judge


def test_sweeper_frees_a_process_waiting_on_a_dead_builders_lock(tmp_path):
    lock = _plant(tmp_path)
    logged: list[str] = []
    done = threading.Event()

    def wait_like_torch() -> None:
        FileBaton(str(lock), wait_seconds=0.05).wait()  # what cpp_extension.load does: poll forever
        done.set()

    t = threading.Thread(target=wait_like_torch, daemon=True)
    with sweeping(logged.append, interval_s=0.2, roots=[tmp_path]):
        t.start()
        assert done.wait(60)
    assert len(logged) == 1 and str(lock) in logged[0]


def test_pin_ninja_puts_the_environments_ninja_first_once(tmp_path, monkeypatch):
    scripts = Path(sysconfig.get_path("scripts"))
    assert os.access(scripts / "ninja", os.X_OK)  # the ninja wheel DeepSpeed depends on
    env = {"PATH": f"/usr/bin:{scripts}:/bin"}
    assert pin_ninja(env) == scripts and env["PATH"] == f"{scripts}:/usr/bin:/bin"
    assert pin_ninja(env) == scripts and env["PATH"] == f"{scripts}:/usr/bin:/bin"  # idempotent
    # an environment without a ninja of its own leaves PATH as it is
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(tmp_path))
    env = {"PATH": "/usr/bin:/bin"}
    assert pin_ninja(env) is None and env["PATH"] == "/usr/bin:/bin"
    (tmp_path / "ninja").write_text("#!/bin/sh\n")
    assert pin_ninja(env) is None  # not executable: not a ninja
    (tmp_path / "ninja").chmod(0o755)
    assert pin_ninja(env) == tmp_path and env["PATH"] == f"{tmp_path}:/usr/bin:/bin"


def _other_ninja(scripts: Path) -> str | None:
    """A ninja on the system PATH of another version than the environment's, or None."""
    found = shutil.which("ninja", path="/usr/local/bin:/usr/bin:/bin")
    if found is None:
        return None
    version = lambda exe: subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    return found if version(found) != version(str(scripts / "ninja")) else None


IMPORTS = "from deepspeed.accelerator import get_accelerator"
LOAD = "get_accelerator().create_op_builder('ShareMemCommBuilder').load()"


@pytest.mark.slow
def test_planted_lock_hangs_a_real_op_load_and_prebuild_clears_it(tmp_path):
    # this environment's bin first on PATH, as in an activated venv or a Ray node started from it
    scripts = Path(sysconfig.get_path("scripts"))
    env = {
        **os.environ,
        "TORCH_EXTENSIONS_DIR": str(tmp_path),
        "DS_ACCELERATOR": "cpu",
        "PYTHONPATH": str(REPO),
        "PATH": f"{scripts}{os.pathsep}{os.environ['PATH']}",
    }
    lock = _plant(tmp_path)
    # Without the sweep, the load waits on the planted lock with no end and no message: it
    # never holds the lock, so it never writes the build file (torch writes it under the lock).
    # It says when the load starts: the timeout then bounds the load itself, not the imports.
    with pytest.raises(subprocess.TimeoutExpired) as hung:
        subprocess.run([sys.executable, "-c", f"{IMPORTS}; print('loading', flush=True); {LOAD}"], env=env, capture_output=True, timeout=25)
    assert hung.value.stdout and b"loading" in hung.value.stdout, "the load never started: the timeout proves nothing"
    assert lock.exists() and not (tmp_path / OP / "build.ninja").exists()
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator.run.ext_lock", "--prebuild"], env=env, cwd=REPO, capture_output=True, text=True, timeout=800
    )
    build_s = time.time() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"removed stale torch-extension build lock {lock}" in p.stdout
    assert f"{OP} (" in p.stdout and "ready in" in p.stdout
    (so,) = (tmp_path / OP).glob(f"{OP}*.so")
    assert not lock.exists()
    built_ns = so.stat().st_mtime_ns
    # Again, from a shell whose PATH finds the system's ninja first: the prebuild pins the
    # environment's, so the op is up to date (another ninja version would rebuild it, ext_lock).
    other = _other_ninja(scripts)
    t0 = time.time()
    again = subprocess.run(
        [sys.executable, "-m", "orchestrator.run.ext_lock", "--prebuild"],
        env={**env, "PATH": f"{Path(other).parent}{os.pathsep}{env['PATH']}" if other else env["PATH"]},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "removed" not in again.stdout
    assert so.stat().st_mtime_ns == built_ns, f"rebuilt by {other or 'the same ninja'}"
    if other is None:
        print("no system ninja of another version on this machine: the rebuild it would cause is not exercised")
    print(f"prebuild of {OP}: {build_s:.0f} s (compiling), {time.time() - t0:.0f} s when built")
