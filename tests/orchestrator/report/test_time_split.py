"""The report's time split on frames with a known answer: last values per run summed per
variant, other = elapsed - sections, outside = 1 - steps / elapsed; a store without the split
says so and gets no table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from orchestrator.report.parts import time_split


def _frames(splits: dict[str, tuple[str, dict[str, float]]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = pd.DataFrame([{"run_uuid": u, "variant": v, "status": "finished"} for u, (v, _) in splits.items()])
    rows = []
    for u, (_, sec) in splits.items():
        for k, v in sec.items():
            rows.append({"run_uuid": u, "key": f"time/{k}_s", "step": 1000, "value": v, "timestamp": 0})
            rows.append({"run_uuid": u, "key": f"time/{k}_s", "step": 500, "value": v / 2, "timestamp": 0})  # earlier
    rows.append({"run_uuid": "a", "key": "train/loss", "step": 1000, "value": 3.0, "timestamp": 0})
    return runs, pd.DataFrame(rows)


SPLITS = {
    "a": ("standard", {"elapsed": 100.0, "startup": 5.0, "step": 80.0, "eval": 6.0, "checkpoint": 4.0}),
    "b": ("standard", {"elapsed": 50.0, "startup": 2.0, "step": 45.0, "eval": 1.0, "checkpoint": 1.0}),
    "c": ("coupled", {"elapsed": 40.0, "startup": 4.0, "step": 36.0, "eval": 0.0, "checkpoint": 0.0}),
}


def test_sums_per_variant_and_for_the_study():
    table = time_split.time_split_table(*_frames(SPLITS)).set_index("variant")
    std = table.loc["standard"]
    assert std["runs"] == 2 and std["elapsed_s"] == 150.0 and std["step_s"] == 125.0
    assert std["other_s"] == pytest.approx(150 - 7 - 125 - 7 - 5)
    assert std["outside_steps"] == pytest.approx(25 / 150)
    assert table.loc["coupled", "outside_steps"] == pytest.approx(0.1)
    assert table.loc["coupled", "other_s"] == pytest.approx(0.0)
    total = table.loc["all"]
    assert total["runs"] == 3 and total["elapsed_s"] == 190.0 and total["outside_steps"] == pytest.approx(29 / 190)


def test_summary_and_goal():
    entry = time_split.summary_entry(time_split.time_split_table(*_frames(SPLITS)), 3)
    assert entry["recorded"] and not entry["meets_goal"] and entry["goal"] == 0.05
    fast = {"a": ("standard", {"elapsed": 100.0, "startup": 1.0, "step": 96.0, "eval": 2.0, "checkpoint": 1.0})}
    one = time_split.summary_entry(time_split.time_split_table(*_frames(fast)), 1)
    assert one["meets_goal"] and time_split.section_text(one)[0].startswith("1 finished training run spent")
    text = " ".join(time_split.section_text(entry))
    assert "15.3% outside steps" in text and "over the 5% goal" in text and text.startswith("3 finished training runs")


def test_a_store_without_the_split_says_so():
    runs, metrics = _frames({})
    assert time_split.time_split_table(runs, metrics[metrics["key"] == "train/loss"]) is None
    summary: dict = {}
    tabs: dict = {}
    time_split.attach(summary, tabs, runs, metrics[metrics["key"] == "train/loss"])
    assert summary["time_split"] == {"recorded": False, "finished": 0, "note": time_split.NOT_RECORDED} and tabs == {}
    assert "no training run finished" in time_split.section_text(summary["time_split"])[0]


def test_unfinished_runs_are_left_out():
    runs, metrics = _frames(SPLITS)
    runs.loc[runs["run_uuid"] == "b", "status"] = "failed"
    summary: dict = {}
    tabs: dict = {}
    time_split.attach(summary, tabs, runs, metrics)
    assert summary["time_split"]["runs"] == 2 and summary["time_split"]["elapsed_s"] == 140.0
    assert not math.isnan(summary["time_split"]["outside_steps"])


def test_finished_runs_without_a_split_are_counted_and_said():
    runs, metrics = _frames(SPLITS)
    runs = pd.concat([runs, pd.DataFrame([{"run_uuid": "old", "variant": "standard", "status": "finished"}])])
    summary: dict = {}
    time_split.attach(summary, {}, runs, metrics)
    assert summary["time_split"]["runs"] == 3 and summary["time_split"]["finished"] == 4
    assert time_split.section_text(summary["time_split"])[0].startswith("3 of 4 finished training runs (the others logged no split)")
    only_old = runs[runs["run_uuid"] == "old"]
    time_split.attach(summary, {}, only_old, metrics[metrics["run_uuid"] == "old"])
    assert "no finished training run logged one" in time_split.section_text(summary["time_split"])[0]


def test_diagnostics_count_as_evaluation_and_leave_other_unchanged():
    """``time/diag_s`` (diagnostics timed on their own, nested in the eval section) is part of the
    evaluation column; a run without it reads as before."""
    with_diag = {**SPLITS, "c": ("coupled", {**SPLITS["c"][1], "eval": 1.0, "diag": 3.0, "step": 32.0})}
    table = time_split.time_split_table(*_frames(with_diag)).set_index("variant")
    assert table.loc["coupled", "eval_s"] == 4.0 and table.loc["coupled", "other_s"] == pytest.approx(0.0)
    assert table.loc["standard", "eval_s"] == 7.0  # no diag_s logged: eval alone
