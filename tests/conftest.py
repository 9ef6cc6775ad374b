"""Shared test setup: one prepared-data cache per test session, never the user's ~/.cache; the
order the suite runs in (unit tests, then the `slow` ones, then the compose-stack flow); and no
`slow` test beside an image build.

Why the order: `.ci/run` builds the stack's images in the background (`make images`, which
holds ``build/images.lock``) while lint and the unit tests run. The `slow` tests (real Ray
clusters, DeepSpeed engines, timed faults) wait for that build to end before the first of them
starts: beside it, a worker's health check or a checkpoint's registration can miss its moment.
The stack test runs last and finds the images built.
"""

import fcntl
import os
import time
from pathlib import Path

import pytest

IMAGES_LOCK = Path(__file__).resolve().parents[1] / "build" / "images.lock"  # the Makefile's IMAGES_LOCK
_waited: list[float] = []


@pytest.fixture(scope="session", autouse=True)
def _session_data_cache(tmp_path_factory):
    if "QKSTUDY_CACHE" not in os.environ:
        os.environ["QKSTUDY_CACHE"] = str(tmp_path_factory.mktemp("qkstudy-cache"))
    yield


def suite_order(items: list) -> None:
    """Reorder collected tests in place: unmarked first, then ``slow``, then ``stack`` (the
    compose-stack flow, itself slow), each group keeping its collection order."""
    def group(item) -> int:
        return 2 if item.get_closest_marker("stack") else 1 if item.get_closest_marker("slow") else 0
    items.sort(key=group)  # stable


def wait_for_image_build(lock: Path = IMAGES_LOCK) -> float:
    """Block until no `make images` holds ``lock`` (returns at once when none runs or the
    file is absent); returns the seconds waited."""
    if not lock.exists():
        return 0.0
    t0 = time.monotonic()
    with open(lock) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # the build's flock(1) holds LOCK_EX until it ends
        fcntl.flock(fh, fcntl.LOCK_UN)
    return time.monotonic() - t0


def pytest_collection_modifyitems(config, items):
    suite_order(items)


def pytest_runtest_setup(item):
    if item.get_closest_marker("slow") and not _waited:
        _waited.append(wait_for_image_build())
        if _waited[0] > 1:
            print(f"\n[waited {_waited[0]:.0f} s for the image build to end before the slow tests]")
