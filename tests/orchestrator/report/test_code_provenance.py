"""The report's "Code:" line: which commit(s) a study's runs came from, dirty ones marked, with
run counts; runs without provenance (a published store, an older one) are counted as not
recorded and never fail the report."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from orchestrator.report import build_report
from orchestrator.report.provenance import code_line, code_summary, merge_codes
from orchestrator.track.provenance import COMMIT_TAG, DIRTY_TAG, NOT_A_CHECKOUT, SOURCE_TAG
from tests.helpers import mlflow_store
from tests.synthetic_study import SyntheticStudy, write_synthetic_study

A, B = "809a755" + "0" * 33, "1234567" + "f" * 33


def _runs(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"run_uuid": str(i), **{f"tags.{k}": v for k, v in r.items()}} for i, r in enumerate(rows)])


def test_commits_counted_with_their_dirty_flag_most_runs_first():
    dirty_a = {COMMIT_TAG: A, DIRTY_TAG: "true", SOURCE_TAG: "checkout"}
    rows = [dirty_a] * 3 + [{COMMIT_TAG: A, DIRTY_TAG: "false"}, {COMMIT_TAG: B, DIRTY_TAG: "false"}] * 2
    rows += [{SOURCE_TAG: NOT_A_CHECKOUT}, {}]
    code = code_summary(_runs(rows))
    assert code["commits"] == [
        {"commit": A, "dirty": True, "runs": 3},
        {"commit": B, "dirty": False, "runs": 2},  # a tie: by commit
        {"commit": A, "dirty": False, "runs": 2},
    ]
    assert code["not_a_checkout"] == 1 and code["not_recorded"] == 1
    line = code_line(code)
    assert line == "Code: `809a755` (dirty) 3 runs; `1234567` 2 runs; `809a755` 2 runs; not a checkout: 1 run; not recorded: 1 run."


def test_a_store_without_provenance_is_not_recorded():
    code = code_summary(pd.DataFrame({"run_uuid": ["a", "b"], "tags.run_id": ["x", "y"]}))
    assert code == {"commits": [], "not_a_checkout": 0, "not_recorded": 2}
    assert code_line(code) == "Code: not recorded: 2 runs."
    assert merge_codes([code, code_summary(_runs([{COMMIT_TAG: A, DIRTY_TAG: "true"}]))]) == {
        "commits": [{"commit": A, "dirty": True, "runs": 1}],
        "not_a_checkout": 0,
        "not_recorded": 2,
    }


@pytest.fixture
def tagged_store(tmp_path):
    """A one-scale synthetic study in its own store, its runs tagged as two checkouts wrote them."""
    from mlflow import MlflowClient

    study = SyntheticStudy(study="prov", scales={"xs": 2e6}, seeds=(0, 1), extend=(2.0,), n_eval=6)
    uri = mlflow_store(tmp_path)
    ids = write_synthetic_study(study, uri)
    client = MlflowClient(uri)
    for i, rid in enumerate(ids):
        if i == 0:
            continue  # one run from before provenance
        client.set_tag(rid, COMMIT_TAG, A if i % 2 else B)
        client.set_tag(rid, DIRTY_TAG, "true" if i % 2 else "false")
    return study, uri, len(ids)


def test_the_report_names_the_commits_its_runs_came_from(tagged_store, tmp_path):
    study, uri, n = tagged_store
    out = tmp_path / "report"
    summary = build_report(study.study, uri, out, log_to_mlflow=False, n_boot=50)
    dirty = (n - 1 + 1) // 2
    assert summary["code"] == {
        "commits": sorted(
            [{"commit": A, "dirty": True, "runs": dirty}, {"commit": B, "dirty": False, "runs": n - 1 - dirty}],
            key=lambda c: (-c["runs"], c["commit"]),
        ),
        "not_a_checkout": 0,
        "not_recorded": 1,
    }
    assert json.loads((out / "summary.json").read_text())["code"] == summary["code"]
    md = (out / "report.md").read_text()
    assert f"`809a755` (dirty) {dirty} runs" in md and "not recorded: 1 run." in md


def test_the_published_style_store_says_not_recorded(main_report):
    summary, out = main_report
    total = summary["code"]["not_recorded"]
    assert summary["code"]["commits"] == [] and total > 0
    assert f"Code: not recorded: {total} runs." in (out / "report.md").read_text()
