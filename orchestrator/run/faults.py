"""Fault injection for the fault and resume tests: the named points where a test makes a worker
fail, each armed by one environment variable.

Why environment variables: the tests start a real driver (``qkstudy run``) whose Ray Train
workers inherit the driver's environment, so a test arms a fault without any test code in the
product's call path. Every ``QKSTUDY_TEST_*`` variable the product reads is read here, and only
here. A point is armed with a step count (unset or 0: disarmed) and fires when the loop has
done that many optimizer steps:

- ``FaultPoint.KILL_AT_STEP`` (``QKSTUDY_TEST_KILL_AT_STEP``): the process dies hard with exit
  code ``KILL_EXIT_CODE`` (as a preempted node would); ``QKSTUDY_TEST_KILL_RUN``, when set,
  limits it to the run of that name (one run of a pack).
- ``FaultPoint.BLOCK_AT_STEP`` (``QKSTUDY_TEST_BLOCK_AT_STEP``): the step never returns (as a
  collective waiting on a lost peer would); only the watchdog ends the process.
- ``FaultPoint.HOLD_AT_STEP`` (``QKSTUDY_TEST_HOLD_AT_STEP``): the run stops at that step and
  says so by creating the file ``QKSTUDY_TEST_HOLD_FILE`` names; it goes on when the test
  deletes the file. A test that kills something mid-run waits for the file and kills at a known
  step, instead of sleeping and hoping the run is still training.

The worker loop installs them for a worker group's first attempt only (no checkpoint existed
when it started), so a retried group resumes instead of failing again (``step_hook``); and a
point that fired leaves a mark in the study's storage, so an attempt retried before its first
checkpoint was registered (a kill that lands while Ray Train's controller has yet to register it,
as under load) does not fire it again.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "FIRED_DIR",
    "HOLD_FILE_ENV",
    "KILL_EXIT_CODE",
    "KILL_RUN_ENV",
    "FaultPoint",
    "StepHook",
    "armed_at",
    "fired_mark",
    "hit",
    "step_hook",
]

KILL_RUN_ENV = "QKSTUDY_TEST_KILL_RUN"  # when set: only the run of this name is killed
HOLD_FILE_ENV = "QKSTUDY_TEST_HOLD_FILE"  # the file a held run creates, and waits for the test to delete
HOLD_POLL_S = 0.1
FIRED_DIR = "faults-fired"  # under the study's storage: the marks of fault points that fired
KILL_EXIT_CODE = 17

# Called before each optimizer step with the number of steps done so far.
StepHook = Callable[[int], None]


class FaultPoint(enum.Enum):
    """A point where a test makes the worker fail; the value is the variable that arms it."""

    KILL_AT_STEP = "QKSTUDY_TEST_KILL_AT_STEP"
    BLOCK_AT_STEP = "QKSTUDY_TEST_BLOCK_AT_STEP"
    HOLD_AT_STEP = "QKSTUDY_TEST_HOLD_AT_STEP"

    @property
    def env(self) -> str:
        """The environment variable that arms this point."""
        return self.value


def armed_at(point: FaultPoint, run_name: str | None = None) -> int | None:
    """The step count at which ``point`` fires for the run ``run_name``, or None when it is
    disarmed: its variable unset or 0, or (``KILL_AT_STEP``) ``KILL_RUN_ENV`` naming another
    run. A ``run_name`` of None matches any run.

    Raises:
        ValueError: ``HOLD_AT_STEP`` armed without ``QKSTUDY_TEST_HOLD_FILE``.
    """
    at = int(os.environ.get(point.env, "0"))
    if not at:
        return None
    if point is FaultPoint.HOLD_AT_STEP and not os.environ.get(HOLD_FILE_ENV):
        raise ValueError(f"{point.env} is set but {HOLD_FILE_ENV} is not: the held run has no file to say it is held")
    only = os.environ.get(KILL_RUN_ENV) if point is FaultPoint.KILL_AT_STEP else None
    if only and run_name is not None and only != run_name:
        return None
    return at


def hit(point: FaultPoint, step: int, run_name: str | None = None) -> None:
    """Fail as ``point`` says when it is armed for ``run_name`` at ``step`` (steps done so
    far); otherwise return at once. Once fired, a kill or a block never returns; a hold returns
    when the test deletes its file."""
    if armed_at(point, run_name) != step:
        return
    if point is FaultPoint.KILL_AT_STEP:
        os._exit(KILL_EXIT_CODE)
    if point is FaultPoint.HOLD_AT_STEP:
        hold(Path(os.environ[HOLD_FILE_ENV]))
        return
    block()


def hold(path: Path) -> None:
    """Create ``path`` (every process of the run does; the first creates it) and wait until it
    is deleted: the test that armed the hold does its work at this known step, then deletes the
    file, or kills the process while it waits here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    while path.exists():
        time.sleep(HOLD_POLL_S)


def block() -> None:
    """Never return, as a collective waiting on a lost peer would: only the watchdog ends the
    process (the stall's reason then shows this frame on top of the stuck thread's stack)."""
    threading.Event().wait()


def fired_mark(fired_dir: str, point: FaultPoint, run_name: str | None) -> Path:
    """The file that says ``point`` fired for ``run_name`` (under ``fired_dir``, the study's storage)."""
    return Path(fired_dir) / FIRED_DIR / f"{run_name or 'any-run'}.{point.name}"


def step_hook(run_name: str | None = None, fired_dir: str | None = None) -> StepHook | None:
    """A hook for the loop to call before each optimizer step, hitting every point armed for
    ``run_name``; None when none is armed (the loop then calls nothing). Reads the environment
    once, when the run starts. ``fired_dir`` (a local folder every attempt of the run sees, the
    study's storage): a point marks there that it fired, and is not armed again for the run."""
    armed = {p: at for p in FaultPoint if (at := armed_at(p, run_name)) is not None}
    if fired_dir:
        armed = {p: at for p, at in armed.items() if not fired_mark(fired_dir, p, run_name).exists()}
    if not armed:
        return None

    def hook(step: int) -> None:
        for point, at in armed.items():
            if step == at:
                if fired_dir:
                    mark = fired_mark(fired_dir, point, run_name)
                    mark.parent.mkdir(parents=True, exist_ok=True)
                    mark.touch()
                hit(point, step, run_name)

    return hook
