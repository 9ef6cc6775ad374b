"""The report's start-up section on frames with a known answer: each run's first attempt (the
earliest step its timeline was logged at), runs that opened a worker group apart from runs that
followed another in it, medians and maxima per section; no timeline, no section."""

from __future__ import annotations

import pandas as pd
import pytest

from orchestrator.report.parts import startup
from orchestrator.track.timeline import PREFIX, TOTAL


def _frames(timelines: dict[str, list[tuple[int, dict[str, float]]]], status: str = "finished") -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = pd.DataFrame([{"run_uuid": u, "variant": "standard", "status": status} for u in timelines])
    rows = [
        {"run_uuid": u, "key": f"{PREFIX}{k}_s" if k != "total" else TOTAL, "step": step, "value": v, "timestamp": step}
        for u, attempts in timelines.items()
        for step, sec in attempts
        for k, v in {**sec, "total": sum(sec.values())}.items()
    ]
    rows.append({"run_uuid": "a", "key": "train/loss", "step": 512, "value": 3.0, "timestamp": 0})
    return runs, pd.DataFrame(rows)


TIMELINES = {
    # opened its worker group; a restart at step 4096 logged a second, shorter timeline
    "a": [(512, {"ray": 5.0, "trainer": 3.0, "worker_group": 12.0, "engine": 2.0}), (4096, {"engine": 1.0})],
    "b": [(512, {"ray": 7.0, "trainer": 4.0, "worker_group": 16.0, "engine": 3.0})],
    "c": [(512, {"ray": 6.0, "trainer": 5.0, "worker_group": 14.0, "engine": 4.0})],
    # trained after another run of its worker group
    "d": [(512, {"model": 0.5, "engine": 1.0, "first_step": 0.1})],
}


def test_first_attempts_split_by_where_their_timeline_began():
    t = startup.startup_table(*_frames(TIMELINES)).set_index(["runs_from", "section"])
    first = t.loc[startup.FIRST]
    assert list(first.index) == ["ray", "trainer", "worker_group", "engine", "total"]  # the product's section order
    assert first.loc["worker_group", "runs"] == 3 and first.loc["worker_group", "median_s"] == 14.0
    assert first.loc["engine", "median_s"] == 3.0 and first.loc["engine", "max_s"] == 4.0  # not the restart's 1.0
    assert first.loc["total", "median_s"] == 29.0 and first.loc["total", "max_s"] == 30.0
    later = t.loc[startup.LATER]
    assert later.loc["total", "runs"] == 1 and later.loc["total", "median_s"] == pytest.approx(1.6)


def test_summary_and_text():
    runs, metrics = _frames(TIMELINES)
    summary: dict = {}
    tabs: dict = {}
    startup.attach(summary, tabs, runs, metrics)
    assert summary["startup"][startup.FIRST] == {"runs": 3, "median_s": 29.0, "max_s": 30.0}
    text = startup.section_text(tabs[startup.TABLE])
    assert text[0].startswith("3 run(s) timed from the command: first optimizer step after 29.0 s")
    assert "the largest part worker_group (14.0 s" in text[0]
    assert text[1].startswith("1 run(s) timed from the worker (a previous run or a restart): first optimizer step after 1.6 s")


def test_no_timeline_no_section():
    runs, metrics = _frames(TIMELINES)
    only_loss = metrics[metrics["key"] == "train/loss"]
    summary: dict = {}
    tabs: dict = {}
    startup.attach(summary, tabs, runs, only_loss)
    assert summary == {} and tabs == {}
    failed_runs, failed_metrics = _frames(TIMELINES, status="failed")  # only finished runs count
    assert startup.startup_table(failed_runs[failed_runs["status"] == "finished"], failed_metrics) is None
