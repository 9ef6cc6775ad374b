"""End what a local Ray leaves behind when the driver that started it is killed.

Why: ``ray.init()`` on one machine starts its processes under the driver; a ``kill -9`` of
the driver takes the GCS and raylet down (Ray binds them to their parent), but the raylet's
``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` are not bound to anything: measured with
Ray 2.60, both were still running a minute after the kill, each holding ~100 MB and ports.
So a driver that starts a local Ray also starts this reaper, in a session of its own (it
outlives the driver). Every second it records the driver's descendants that are Ray's (pid
and start time, so a reused pid is never taken for one of them); once the driver is gone it gives Ray
``GRACE_S`` to end its own processes, then sends SIGTERM to those still running, SIGKILL to
any left 3 s later, and exits. Ray also spawns worker processes up to the moment of the kill,
so one born after the last poll is found by its session instead: every Ray process whose
command line names the driver's session folder (``/session_<date>_<time>_<driver pid>/``,
the name Ray gives the session a driver starts). After a normal exit (``ray.shutdown``) nothing is left and
it ends likewise. Linux only (``/proc``); elsewhere ``start_reaper`` does nothing.
Run as ``python -m orchestrator.run.driver.ray_reaper DRIVER_PID``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["GRACE_S", "LOG", "descendants", "in_session", "reap", "start_reaper", "watch"]

GRACE_S = 3.0
POLL_S = 1.0
LOG = Path(tempfile.gettempdir()) / "ray" / "qkstudy_reaper.log"  # beside Ray's own session folders
Proc = tuple[int, int]  # (pid, start time in clock ticks since boot): one process, never a reused pid


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a live process, or None when gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    state, ppid, start = fields[0], int(fields[1]), int(fields[19])
    return None if state in ("Z", "X") else (ppid, start, state)


def _is_ray(pid: int) -> bool:
    """A process of Ray's own (its binaries, its Python entry points, a ``ray::`` title):
    the only kind the reaper ends, so a driver's other children (a server a notebook
    started) are left alone."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return cmd.startswith(("ray::", "ray-dashboard")) or "/site-packages/ray/" in cmd


def descendants(root: int, ray_only: bool = True) -> set[Proc]:
    """Every live process below ``root`` (children, theirs, ...) as (pid, start time); with
    ``ray_only`` those that are Ray's (``_is_ray``)."""
    parent: dict[int, tuple[int, int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))):
            parent[int(d.name)] = (st[0], st[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in parent.items() if ppid in frontier and pid not in found}
        found |= frontier
    return {(pid, parent[pid][1]) for pid in found if not ray_only or _is_ray(pid)}


def _alive(p: Proc) -> bool:
    st = _stat(p[0])
    return st is not None and st[1] == p[1]


def reap(procs: set[Proc], term_wait_s: float = 3.0) -> list[int]:
    """SIGTERM each of ``procs`` still running, SIGKILL those left after ``term_wait_s``;
    returns the pids that had to be ended."""
    left = sorted(p for p in procs if _alive(p) and p[0] != os.getpid())
    for pid, _ in left:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + term_wait_s
    while time.monotonic() < deadline and any(_alive(p) for p in left):
        time.sleep(0.1)
    for p in left:
        if _alive(p):
            _signal(p[0], signal.SIGKILL)
    return [pid for pid, _ in left]


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def in_session(driver: int) -> set[Proc]:
    """Ray's live processes (``_is_ray``) whose command line names the session folder of a
    Ray that ``driver`` started (``.../session_<date>_<time>_<micros>_<driver>/...``)."""
    mark = re.compile(rf"/session_[0-9_-]+_{driver}/")
    out: set[Proc] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or not _is_ray(pid := int(d.name)):
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if mark.search(cmd) and (st := _stat(pid)):
            out.add((pid, st[1]))
    return out


def watch(driver: int, grace_s: float = GRACE_S, poll_s: float = POLL_S) -> list[int]:
    """Record ``driver``'s descendants until it is gone, wait ``grace_s``, end those left and
    those of its Ray session (``in_session``: a worker spawned after the last poll) with
    ``reap``; returns their pids. Returns at once when ``driver`` is not running."""
    first = _stat(driver)
    if first is None:
        return []
    seen: set[Proc] = set()  # this reaper among them until the driver is gone: reap skips it
    while (st := _stat(driver)) is not None and st[1] == first[1]:
        seen |= descendants(driver)
        time.sleep(poll_s)
    time.sleep(grace_s)
    return reap(seen | in_session(driver))


def start_reaper(driver: int | None = None, log: Path = LOG) -> subprocess.Popen[bytes] | None:
    """Start the reaper for ``driver`` (default: this process) in its own session, its note
    appended to ``log`` (not the driver's stderr: a pipe held open by the reaper would keep a
    caller reading it waiting); None where there is no ``/proc``."""
    if not Path("/proc/self/stat").is_file():
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", __name__, str(driver or os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            cwd=str(Path(__file__).resolve().parents[2]),
        )


if __name__ == "__main__":
    pid = int(sys.argv[1])
    ended = watch(pid)
    if ended:
        print(
            f"{time.strftime('%Y-%m-%dT%H:%M:%S')} ray reaper: ended {len(ended)} process(es) that driver pid {pid}'s "
            f"local Ray left behind: {ended}",
            flush=True,
        )
