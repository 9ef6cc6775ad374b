"""The suite's order (tests/fixtures/tiers.py): unit tests, then the slow ones, then the stack
tier, whatever order pytest is given its files in; and the stack tier waits for a running image
build: .ci/run builds the stack's images in the background while the unit and slow tiers run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

FILES = ["tests/docker/test_stack.py", "tests/orchestrator/test_e2e.py", "tests/docker/test_compose.py"]  # stack, slow, unit


def collected(*extra: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "QKSTUDY_STACK_TEST"}
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra, *FILES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [line.split("::")[0] for line in res.stdout.splitlines() if "::" in line]


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_unit_then_slow_then_stack_whatever_the_command_lines_order() -> None:
    files = collected()
    groups = [0 if f == FILES[2] else 1 if f == FILES[1] else 2 for f in files]
    assert set(groups) == {0, 1, 2} and groups == sorted(groups), files
    # Negative control: without the conftest (and so the tiers plugin), pytest keeps the command line's order.
    assert collected("--noconftest")[0] == FILES[0]


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_the_stack_tier_waits_for_a_running_image_build(tmp_path) -> None:
    import fcntl
    import threading
    import time

    from tests.fixtures.tiers import wait_for_image_build

    lock = tmp_path / "images.lock"
    assert wait_for_image_build(lock) == 0.0  # no build ever ran: no file
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a build holds it
        release = threading.Timer(1.5, lambda: fcntl.flock(held, fcntl.LOCK_UN))
        release.start()
        t0 = time.monotonic()
        waited = wait_for_image_build(lock)
        release.join()
    assert 1.3 < waited and time.monotonic() - t0 >= 1.3
    assert wait_for_image_build(lock) < 1.0  # negative control: nobody holds it now
