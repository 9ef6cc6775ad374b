"""The compose-stack flow is collected last whatever order pytest is given its files in
(tests/conftest.py): .ci/run builds the stack's images in the background while the rest of the
suite runs, so the stack test must not start first and wait for them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = ["tests/docker/test_stack.py", "tests/docker/test_images.py"]  # the stack's first on the line


def collected(*extra: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "QKSTUDY_STACK_TEST"}
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra, *FILES],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [line.split("::")[0] for line in res.stdout.splitlines() if "::" in line]


def test_stack_tests_are_collected_last() -> None:
    files = collected()
    assert FILES[0] in files and FILES[1] in files
    first_stack = files.index(FILES[0])
    assert set(files[first_stack:]) == {FILES[0]}, files  # nothing after the stack flow
    # Negative control: without the conftest hook, pytest keeps the command line's order.
    assert collected("--noconftest")[0] == FILES[0]
