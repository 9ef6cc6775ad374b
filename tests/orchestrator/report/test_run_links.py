"""The report's runs table ties each run to MLflow: a link on a server, the bare run id on a SQLite store."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from orchestrator.report import run_links
from orchestrator.report.build import analyse
from orchestrator.report.query import query_study
from orchestrator.report.render import html, markdown
from tests.fixtures.synthetic import MAIN


@pytest.mark.parametrize(
    ("uri", "base"),
    [
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("https://mlflow.example.org/", "https://mlflow.example.org"),
        ("https://u:***@mlflow.example.org/prefix/?token=***", "https://mlflow.example.org/prefix"),
        ("HTTP://host:8080/a/b/", "http://host:8080/a/b"),
        ("sqlite:////tmp/mlflow.db", None),
        ("postgresql://mlflow:***@db/mlflow", None),
        ("file:///tmp/mlruns", None),
        ("/tmp/mlruns", None),
        ("", None),
        (None, None),
    ],
)
def test_only_an_http_server_has_run_pages(uri, base):
    assert run_links.server(uri) == base


def _runs() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_name": ["standard-xs-s0-x1", "coupled-xs-s0-x1"],
            "variant": ["standard", "coupled"],
            "scale": ["xs", "xs"],
            "seed": [0.0, float("nan")],
            "extend": [1.0, 1.0],
            "status": ["finished", "failed"],
            "final_ppl": [22.5, float("nan")],
            "run_uuid": ["a" * 32, "b" * 32],
        }
    )


def test_a_server_store_links_each_run_to_its_page():
    shown = run_links.display({"tracking_uri": "http://mlflow.example:5000/", "experiment_id": "7"}, _runs())
    assert list(shown["MLflow run"]) == [
        f"[{'a' * 32}](http://mlflow.example:5000/#/experiments/7/runs/{'a' * 32})",
        f"[{'b' * 32}](http://mlflow.example:5000/#/experiments/7/runs/{'b' * 32})",
    ]
    assert list(shown["seed"]) == ["0", "—"] and list(shown["final ppl"]) == ["22.500", "—"]
    assert (
        "linked to its page on the MLflow server `http://mlflow.example:5000` (experiment 7)"
        in run_links.section_text({"tracking_uri": "http://mlflow.example:5000/", "experiment_id": "7"})[0]
    )


def test_a_sqlite_store_shows_run_ids_and_links_nothing():
    summary = {"tracking_uri": "sqlite:////tmp/x/mlflow.db", "experiment_id": "3"}
    shown = run_links.display(summary, _runs())
    assert list(shown["MLflow run"]) == ["a" * 32, "b" * 32]
    (text,) = run_links.section_text(summary)
    assert "not an MLflow server, so there is no run page to link" in text and "experiment 3" in text


@pytest.fixture(scope="module")
def analysed(synthetic_store):
    """analyse() of MAIN: its summary (no figures) and tables."""
    summary, tabs, _ = analyse(query_study(MAIN.study, synthetic_store), reference="standard", target="coupled", n_boot=20)
    return summary | {"figures": []}, tabs


def test_the_html_report_links_every_run_on_a_server_and_none_on_sqlite(analysed, tmp_path):
    summary, tabs = analysed
    runs = tabs[run_links.TABLE]
    assert len(runs) == summary["runs"]["total"] and runs["run_uuid"].str.fullmatch(r"[0-9a-f]{32}").all()
    served = summary | {"tracking_uri": "http://mlflow.example:5000"}
    page = html(served, tabs, tmp_path)
    hrefs = re.findall(r'<a href="([^"]+)">([0-9a-f]{32})</a>', page)
    eid = summary["experiment_id"]
    assert sorted(hrefs) == sorted((f"http://mlflow.example:5000/#/experiments/{eid}/runs/{r}", r) for r in runs["run_uuid"])
    assert "## Runs in MLflow" in markdown(served, tabs)
    local = html(summary, tabs, tmp_path)  # the session's store is SQLite: ids, no anchors
    assert not re.search(r'<a href="[^"]*/runs/', local) and all(r in local for r in runs["run_uuid"])
