"""Shared test setup: one prepared-data cache per test session, never the user's ~/.cache; the
tests marked `stack` (the compose-stack flow) run last."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_data_cache(tmp_path_factory):
    if "QKSTUDY_CACHE" not in os.environ:
        os.environ["QKSTUDY_CACHE"] = str(tmp_path_factory.mktemp("qkstudy-cache"))
    yield


def stack_last(items: list) -> None:
    """Reorder collected tests in place so the ones marked ``stack`` come last, the others
    keeping their order: `.ci/run` builds the stack's images in the background while the rest
    of the suite runs, and the stack test's `make stack-up` then finds them built."""
    items.sort(key=lambda item: item.get_closest_marker("stack") is not None)  # stable


def pytest_collection_modifyitems(config, items):
    stack_last(items)
