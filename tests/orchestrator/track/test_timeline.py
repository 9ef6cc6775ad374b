"""The start-up timeline on marks with a known answer: sections are the spans between marks,
named by the mark that ends them, and add up to the total; a copy per run leaves the original."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from orchestrator.track.timeline import PREFIX, TOTAL, Timeline


def test_sections_are_spans_named_by_their_end_mark():
    tl = Timeline([("process", 100.0), ("imports", 103.5), ("ray", 109.0), ("engine", 111.25)])
    assert tl.sections() == {"imports": 3.5, "ray": 5.5, "engine": 2.25}
    assert tl.total() == 11.25
    assert tl.metrics() == {f"{PREFIX}imports_s": 3.5, f"{PREFIX}ray_s": 5.5, f"{PREFIX}engine_s": 2.25, TOTAL: 11.25}


def test_a_name_marked_twice_sums_its_spans():
    tl = Timeline([("start", 0.0), ("model", 1.0), ("engine", 3.0), ("model", 7.0)])
    assert tl.sections() == {"model": 5.0, "engine": 2.0} and tl.total() == 7.0


def test_then_copies_and_json_round_trips():
    tl = Timeline.since("start", at=time.time() - 2.0)
    run = tl.then("queued")
    assert len(tl.marks) == 1 and [n for n, _ in run.marks] == ["start", "queued"]
    assert run.sections()["queued"] == pytest.approx(2.0, abs=0.5)
    assert Timeline.from_json(run.to_json()) == run
    assert Timeline.from_json(None) is None and Timeline.from_json([]) is None
    assert Timeline().total() == 0.0 and Timeline().sections() == {}


def test_since_process_start_begins_at_the_processes_creation():
    tl = Timeline.since_process_start()
    assert tl.marks[0] == ("process", psutil.Process(os.getpid()).create_time())
    assert tl.marks[0][1] < time.time()
