"""Shared test setup: one prepared-data cache per test session, never the user's ~/.cache, and
the plugins that hold every shared fixture (``tests/fixtures/``): the tiers and their guard,
the loopback Ray cluster, the PostgreSQL and MLflow servers, the synthetic report store, and
the trained studies with the session's local Ray.
"""

import os

import pytest

from orchestrator.run.ext_lock import pin_ninja
from orchestrator.track.store_template import TEMPLATE_DIR_ENV

pytest_plugins = [
    "tests.fixtures.tiers",
    "tests.fixtures.cluster",
    "tests.fixtures.services",
    "tests.fixtures.synthetic",
    "tests.fixtures.studies",
]


# Every `mlflow server` a test starts inherits this: MLflow's job runner (seven huey consumer
# processes for its GenAI jobs, which qkstudy never submits) costs each server start seconds
# of CPU and about 1 GB; docker/compose.yaml turns it off the same way.
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")


# The tests' own DeepSpeed engines (the in-process ZeRO tests) and every process they start
# build and check the shm op with this environment's ninja, as the product's prebuild and
# workers do: the system's ninja would rebuild it each time (orchestrator/run/ext_lock.py).
pin_ninja()


@pytest.fixture(scope="session", autouse=True)
def _session_data_cache(tmp_path_factory):
    if "QKSTUDY_CACHE" not in os.environ:
        os.environ["QKSTUDY_CACHE"] = str(tmp_path_factory.mktemp("qkstudy-cache"))
    # One migrated MLflow store template for the session's every store (orchestrator/track/store_template.py),
    # in the folder every pytest-xdist worker's temp folder sits in: built once, copied by each.
    os.environ.setdefault(TEMPLATE_DIR_ENV, str(tmp_path_factory.getbasetemp().parent / "mlflow-store"))
    yield
