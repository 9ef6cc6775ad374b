"""The progress watchdog: a blocked section is reported once with its name and the blocking
function's stack; fast sections never are; a process stuck in a C call (a collective waiting for
a peer that never comes) is ended by the stall callback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from orchestrator.run.worker.watchdog import STALL_EXIT_CODE, Watchdog, WatchdogLimits, limits_from_env, stall_reason
from tests.helpers import REPO, free_port


def blocked_in_collective(release: threading.Event) -> None:
    """Stands in for a step that never returns (waits until the test releases it)."""
    release.wait(60)


def test_blocked_step_is_reported_once_with_its_stack():
    reports: list[tuple[str, float, str]] = []
    release = threading.Event()

    def on_stall(section: str, elapsed: float, stack: str) -> None:
        reports.append((section, elapsed, stack))

    def loop(wd: Watchdog) -> None:
        with wd.section("startup"):
            pass
        for _ in range(3):
            with wd.section("step"):
                pass
        with wd.section("step"):
            blocked_in_collective(release)

    with Watchdog(on_stall, WatchdogLimits(startup=5, step=0.3, eval=5, checkpoint=5), poll_s=0.05) as wd:
        t = threading.Thread(target=loop, args=(wd,), name="train-loop")
        t0 = time.monotonic()
        t.start()
        while not reports and time.monotonic() - t0 < 30:
            time.sleep(0.02)
        time.sleep(0.5)  # ten more polls: still one report for this entry
        release.set()
        t.join()
    assert len(reports) == 1, [r[:2] for r in reports]
    section, elapsed, stack = reports[0]
    assert section == "step" and elapsed > 0.3
    first = stack.split("\n\n")[0]  # the stuck thread comes first
    assert first.startswith("Thread 'train-loop'") and "<- stuck" in first
    assert "blocked_in_collective" in first and "release.wait(60)" in first
    assert "MainThread" in stack  # every thread is in the dump


def test_fast_sections_and_idle_time_never_fire():
    reports = []
    limits = WatchdogLimits(startup=0.5, step=0.5, eval=0.5, checkpoint=0.5)
    with Watchdog(lambda *a: reports.append(a), limits, poll_s=0.01) as wd:
        for i in range(2000):
            with wd.section("step"):
                if i % 500 == 0:
                    with wd.section("eval"):  # nested: its own clock
                        time.sleep(0.05)
        time.sleep(1.2)  # idle between sections (a pack between runs) is not watched
        with wd.section("checkpoint"):
            time.sleep(0.2)
    assert reports == []


def test_bound_is_exact_and_nested_sections_restore_the_outer_clock():
    reports = []
    wd = Watchdog(lambda *a: reports.append(a), WatchdogLimits(startup=10, step=2, eval=1, checkpoint=10))
    with wd.section("eval"):
        assert wd._open is not None
        t_eval = wd._open[2]
        with wd.section("checkpoint"):
            t_ck = wd._open[2]
            assert not wd.check(now=t_ck + 9.99)
            assert wd.check(now=t_ck + 10.01) and reports[-1][0] == "checkpoint"
        assert wd._open[2] == t_eval  # back on the outer section's own clock
        assert not wd.check(now=t_eval + 0.99)
        assert wd.check(now=t_eval + 1.01) and reports[-1][0] == "eval"
        assert not wd.check(now=t_eval + 5)  # once per entry
    assert wd._open is None and not wd.check(now=time.monotonic() + 1e6)
    assert [r[0] for r in reports] == ["checkpoint", "eval"]


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_seconds_per_section_leave_nested_sections_out(monkeypatch):
    import orchestrator.run.worker.watchdog as watchdog

    clock = _Clock()
    monkeypatch.setattr(watchdog, "time", clock)
    wd = Watchdog(lambda *a: None)
    with wd.section("startup"):
        clock.now += 7.0
    for _ in range(3):
        with wd.section("step"):
            clock.now += 0.5
        clock.now += 0.25  # between sections: counted nowhere
    with wd.section("eval"):
        clock.now += 2.0
        with wd.section("checkpoint"):
            clock.now += 4.0
        clock.now += 1.0
    # eval is 2 + 1 (its 4 s checkpoint counts as checkpoint only); steps 3 x 0.5
    assert wd.seconds == {"startup": 7.0, "step": 1.5, "eval": 3.0, "diag": 0.0, "checkpoint": 4.0}
    assert wd.totals() == wd.seconds  # nothing open


def test_totals_count_the_open_sections_so_far(monkeypatch):
    """A checkpoint's snapshot is taken inside an eval and its checkpoint section: both count."""
    import orchestrator.run.worker.watchdog as watchdog

    clock = _Clock()
    monkeypatch.setattr(watchdog, "time", clock)
    wd = Watchdog(lambda *a: None)
    with wd.section("eval"):
        clock.now += 2.0
        with wd.section("step"):  # a nested section that closed
            clock.now += 1.0
        clock.now += 0.5
        with wd.section("checkpoint"):
            clock.now += 0.25
            assert wd.totals() == {"startup": 0.0, "step": 1.0, "eval": 2.5, "diag": 0.0, "checkpoint": 0.25}
            assert wd.seconds["eval"] == 0.0  # not closed yet


def test_limits_from_env_and_reason():
    lim = limits_from_env(env="step=5, eval=60.5")
    assert (lim.startup, lim.step, lim.eval, lim.checkpoint) == (1800.0, 5.0, 60.5, 1800.0)
    assert limits_from_env(env="") == WatchdogLimits()
    for bad in ("stepp=5", "step=0", "step=x", "step"):
        with pytest.raises(ValueError, match="QKSTUDY_WATCHDOG"):
            limits_from_env(env=bad)
    with pytest.raises(ValueError, match="unknown watchdog section"):
        WatchdogLimits().bound("train")
    r = stall_reason("step", 12.3, 5, "x" * 10_000, max_chars=300)
    assert r.startswith("no progress: section 'step' ran 12 s, past its 5 s bound") and len(r) == 300


# A worker stuck in C: gloo rendezvous for a world of 2 whose second rank never comes. The
# stall callback prints the reason and ends the process, as the worker's will.
STUCK = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    from orchestrator.run.worker.watchdog import STALL_EXIT_CODE, Watchdog, WatchdogLimits, stall_reason

    def on_stall(section, elapsed, stack):
        print(stall_reason(section, elapsed, 2.0, stack), flush=True)
        os._exit(STALL_EXIT_CODE)

    with Watchdog(on_stall, WatchdogLimits(startup=2.0), poll_s=0.1) as wd:
        with wd.section("startup"):
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=2)
    print("not stuck?", flush=True)
""")


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_process_stuck_in_a_c_call_is_ended_with_the_section_and_stack():
    port = free_port()
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, "-c", STUCK, str(port)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == STALL_EXIT_CODE, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "section 'startup'" in p.stdout and "init_process_group" in p.stdout
    assert "not stuck?" not in p.stdout
    assert time.time() - t0 < 240  # ended by the watchdog, not the test's timeout
