"""Nothing of a local Ray outlives a driver killed with SIGKILL (``run.driver.ray_reaper``). Fast: a
real process tree (a stand-in driver with a detached ``ray::`` child, as the raylet's agents
are, and a child that is not Ray's). Slow: a real `qkstudy run` killed mid-run: every Ray
process it had is gone 10 s after the kill (without the reaper its DashboardAgent and
RuntimeEnvAgent stay). Prints what it measured with `-s`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.run.driver.ray_reaper import GRACE_S, _alive, descendants, start_reaper, watch
from tests.helpers import TPS, driver_env, reap_driver, start_driver, write_spec

DRIVER = """
import subprocess, sys, time
subprocess.Popen(["bash", "-c", "exec -a ray::FakeAgent sleep 300"], start_new_session=True)
subprocess.Popen(["sleep", "301"], start_new_session=True)
print("ready", flush=True)
time.sleep(300)
"""


def _wait_gone(procs, timeout: float) -> float | None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not any(_alive(p) for p in procs):
            return time.time() - t0
        time.sleep(0.2)
    return None


def test_a_worker_of_the_drivers_ray_session_that_is_not_its_descendant_is_ended_too():
    """A Ray worker spawned after the reaper's last poll (or reparented before it) is no
    descendant it recorded; its command line names the driver's session folder, as Ray's
    default_worker's does (seen: one still running 20 s after a kill -9). Another session's
    worker is left alone."""
    drv = subprocess.Popen(["sleep", "300"])
    fake = "import time; time.sleep(300)"
    ours = subprocess.Popen(
        [
            sys.executable,
            "-c",
            fake,
            "/x/site-packages/ray/_private/workers/default_worker.py",
            f"--object-store-name=/tmp/ray/session_2026-12-01_14-11-49_813168_{drv.pid}/sockets/plasma",
        ],
        start_new_session=True,
    )
    theirs = subprocess.Popen(
        [
            sys.executable,
            "-c",
            fake,
            "/x/site-packages/ray/_private/workers/default_worker.py",
            f"--object-store-name=/tmp/ray/session_2026-12-01_14-11-49_813168_{drv.pid}1/sockets/p",
        ],
        start_new_session=True,
    )
    ended: list[list[int]] = []
    try:
        t = threading.Thread(target=lambda: ended.append(watch(drv.pid, grace_s=0.2, poll_s=0.1)))
        t.start()
        time.sleep(0.5)  # several polls: neither fake worker is the driver's descendant
        drv.kill()
        drv.wait()
        t.join(timeout=15)
        assert ended == [[ours.pid]]
        assert ours.wait(timeout=5) is not None and theirs.poll() is None
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_killed_drivers_ray_children_are_ended_and_its_other_children_left_alone(tmp_path):
    drv = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    assert drv.stdout.readline().strip() == "ready"
    log = tmp_path / "reaper.log"
    reaper = start_reaper(drv.pid, log=log)
    time.sleep(1.5)  # one poll has recorded the children
    kids = descendants(drv.pid, ray_only=False)
    ray_kids = descendants(drv.pid)
    other = kids - ray_kids
    assert len(ray_kids) == 1 and len(other) == 1 and reaper.pid not in {p for p, _ in kids}  # its own session
    try:
        drv.kill()
        drv.wait()
        gone = _wait_gone(ray_kids, GRACE_S + 10)
        assert gone is not None and gone >= GRACE_S - 0.5, gone  # after Ray's grace, not before
        assert all(_alive(p) for p in other)  # not Ray's: not ours to end
        assert reaper.wait(timeout=10) == 0
        assert f"ended 1 process(es) that driver pid {drv.pid}'s local Ray left behind" in log.read_text()
    finally:
        for pid, _ in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
@pytest.mark.stack
def test_nothing_of_a_local_ray_outlives_a_kill_9_of_its_driver(tmp_path):
    spec = write_spec(
        tmp_path, "reap", budget={"mode": "tokens", "tokens": 600 * TPS}, resources={"workers": 1, "cpus_per_worker": 1, "zero_stage": 2}
    )
    p = start_driver(spec, driver_env())
    try:
        deadline, ray_procs = time.time() + 300, set()
        while time.time() < deadline and p.poll() is None:
            ray_procs |= descendants(p.pid)  # every Ray process the driver had, agents included
            if any(_is_title(pid, "ray::RayTrainWorker") for pid, _ in ray_procs):
                break
            time.sleep(0.5)
        time.sleep(2)
        ray_procs |= descendants(p.pid)
        assert any(_is_title(pid, "ray::DashboardAgent") for pid, _ in ray_procs), "no local Ray was seen"
        os.kill(p.pid, signal.SIGKILL)  # the driver only, as a user's kill -9
        p.wait()
        # the reaper's own bound: 1 s poll + GRACE_S + 3 s between SIGTERM and SIGKILL, then exit
        # times on a loaded machine (once seen at idle: a dashboard child still alive at 10 s)
        gone = _wait_gone(ray_procs, 20)
        left = [(pid, _cmdline(pid)) for pid, st in ray_procs if _alive((pid, st))]
    finally:
        reap_driver(p)
    assert gone is not None, f"still running 20 s after the kill: {left}"
    print(f"\n[ray leftovers] {len(ray_procs)} Ray processes under the driver; all gone {gone:.1f} s after its kill -9")


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return ""


def _title(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def _is_title(pid: int, title: str) -> bool:
    return _title(pid).startswith(title)
