"""The http path: a real `mlflow server` over the session's SQLite store, read through its bulk route."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.report import query
from orchestrator.report.query import query_study
from tests.fixtures.synthetic import MAIN
from tests.helpers import free_port


@pytest.fixture(scope="module")
def server(synthetic_store):
    port = free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen(
        [str(mlflow_cli), "server", "--backend-store-uri", synthetic_store, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, so teardown ends the server's workers too
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180  # a loaded 2-core machine has taken over 100 s to start one
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("mlflow server exited during start-up")
                if time.time() > deadline:
                    pytest.fail("mlflow server did not answer /health within 180 s")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_http_bulk_history_matches_sql_including_split_batches(server, synthetic_store, monkeypatch):
    sql = query_study(MAIN.study, synthetic_store)
    http = query_study(MAIN.study, server)
    cols = ["run_uuid", "variant", "scale", "seed", "extend", "status", "n_params", "planned_tokens"]
    pd.testing.assert_frame_equal(http.runs[cols], sql.runs[cols])
    pd.testing.assert_frame_equal(http.metrics, sql.metrics)
    # A cap below one batch's size forces the halving path down to single runs.
    monkeypatch.setattr(query, "BULK_POINTS", 50)
    pd.testing.assert_frame_equal(query_study(MAIN.study, server).metrics, sql.metrics)
