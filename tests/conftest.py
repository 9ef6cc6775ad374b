"""Shared test setup: one prepared-data cache per test session, never the user's ~/.cache."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_data_cache(tmp_path_factory):
    if "QKSTUDY_CACHE" not in os.environ:
        os.environ["QKSTUDY_CACHE"] = str(tmp_path_factory.mktemp("qkstudy-cache"))
    yield
