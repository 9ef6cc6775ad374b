"""The driver's progress view: one line per pack and one for the study with an ETA measured
from the board's snapshots (``TokenRate``, on an injected clock: nothing sleeps). In log mode
(not a terminal): one line per finished run, printed once whichever report (board snapshot or
the pack's result) comes first, failures, and a study line every 30 s with the ETA."""

import io

import pytest
from rich.console import Console

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.packing import launch_order, make_packs
from orchestrator.run.progress import StudyProgress, TokenRate, fmt_eta, pack_label


def _runs():
    return plan(
        parse_spec(
            {
                "name": "view",
                "scales": ["cpu-xs"],
                "variants": ["standard", "coupled", "differential"],
                "budget": {"mode": "tokens", "tokens": 40960},
                "extend": [],
            }
        )
    )


def _packed_runs():
    """Six runs (two variants x three seeds) that the plan cuts into two packs of three."""
    runs = plan(
        parse_spec(
            {
                "name": "view",
                "scales": ["cpu-xs"],
                "variants": ["standard", "coupled"],
                "seeds": [0, 1, 2],
                "budget": {"mode": "tokens", "tokens": 40960},
                "extend": [],
                "resources": {"runs_per_trainer": 3},
            }
        )
    )
    return [p.runs for p in make_packs(launch_order(runs), {r.run_id for r in runs})]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _drawn(view: StudyProgress) -> list[str]:
    """The lines the view's bars draw now, as a terminal shows them."""
    out = Console(record=True, file=io.StringIO(), width=200, color_system=None)
    out.print(view.bar.get_renderable())
    return [line.rstrip() for line in out.export_text().splitlines() if line.strip()]


# -- the ETA estimator ------------------------------------------------------------------


def test_constant_throughput_gives_the_known_eta():
    rate = TokenRate()
    for t in range(6):  # 1000 tok/s, measured once a second
        rate.add(100.0 + t, 1000 * t)
    assert rate.rate() == pytest.approx(1000.0)
    assert rate.eta_s(10_000) == pytest.approx(10.0)
    assert fmt_eta(rate.eta_s(10_000)) == "ETA 10s"
    assert fmt_eta(rate.eta_s(192_000)) == "ETA 3m12s"
    assert rate.eta_s(0) == 0.0


def test_the_rate_forgets_what_is_older_than_its_window():
    rate = TokenRate(window_s=300)
    done = 0
    for t in range(1, 601):  # ten minutes at 1000 tok/s, then five at 2000 tok/s
        done += 1000
        rate.add(float(t), done)
    for t in range(601, 901):
        done += 2000
        rate.add(float(t), done)
    assert rate.rate() == pytest.approx(2000.0)
    assert rate.eta_s(60_000) == pytest.approx(30.0)


def test_no_eta_without_progress_or_before_two_measurements():
    rate = TokenRate()
    assert rate.eta_s(10_000) is None
    rate.add(0.0, 500)
    assert rate.rate() is None and rate.eta_s(10_000) is None  # one measurement: no rate yet
    for t in range(1, 30):  # the study stalls: no tokens, no division by zero, no ETA
        rate.add(float(t), 500)
    assert rate.rate() == 0.0 and rate.eta_s(10_000) is None
    assert fmt_eta(None) == "ETA —"
    rate.add(29.0, 400)  # a measurement at the same time replaces the last one (a run restarted)
    assert rate.rate() is not None and rate.rate() < 0 and rate.eta_s(10_000) is None
    with pytest.raises(ValueError):
        TokenRate(window_s=0)


def test_eta_formats():
    assert [fmt_eta(s) for s in (0, 44.6, 60, 192, 3599, 3600, 7500)] == [
        "ETA 0s",
        "ETA 45s",
        "ETA 1m00s",
        "ETA 3m12s",
        "ETA 59m59s",
        "ETA 1h00m",
        "ETA 2h05m",
    ]


# -- one line per pack ------------------------------------------------------------------


def test_pack_labels_name_the_runs_compactly():
    assert pack_label(["standard-cpu-xs-s0-x1", "standard-cpu-xs-s1-x1", "standard-cpu-xs-s2-x1"]) == "standard-cpu-xs s0-2 x1 (3 runs)"
    assert pack_label(["standard-cpu-xs-s0-x1", "standard-cpu-xs-s1-x1", "standard-cpu-xs-s5-x1"]) == "standard-cpu-xs s0-1,5 x1 (3 runs)"
    assert pack_label(["standard-cpu-xs-s0-x1", "coupled-cpu-xs-s0-x1"]) == "standard,coupled cpu-xs-s0-x1 (2 runs)"
    assert pack_label(["coupled-cpu-s-s0-x1"]) == "coupled-cpu-s-s0-x1"
    # an LR with a minus sign in it (1e-05) splits into more parts: still one short label
    tune = ["tune-standard-cpu-xs-lr0.001-s0", "tune-standard-cpu-xs-lr1e-05-s0"]
    assert pack_label(tune) == "tune-standard-cpu-xs lr0.001,lr1e-05 s0 (2 runs)"


def test_terminal_draws_one_line_per_pack_and_the_study_eta():
    (p1, p2) = _packed_runs()
    clock = Clock()
    console = Console(file=io.StringIO(), force_terminal=True, width=200, record=True)
    with StudyProgress("view", [p1, p2], console, clock=clock) as view:
        assert view.live
        lines = _drawn(view)
        assert len(lines) == 3  # the study and its two packs, not six runs
        assert "study view" in lines[0] and "ETA —" in lines[0]
        assert "coupled-cpu-xs s0-2 x1 (3 runs)" in lines[1] and "queued" in lines[1]
        assert "standard-cpu-xs s0-2 x1 (3 runs)" in lines[2] and "queued" in lines[2]

        a, b, _ = p1
        view.update({}, {})
        clock.t += 10  # 10 s later: the first run of the first pack is done, the second halfway
        view.update(
            {
                a.run_id: {"tokens": a.tokens, "planned": a.tokens, "state": "finished", "loss": 3.5},
                b.run_id: {"tokens": b.tokens // 2, "planned": b.tokens, "state": "running", "loss": 3.25},
            },
            {},
        )
        done = a.tokens + b.tokens // 2
        rate = done / 10
        eta = (sum(r.tokens for r in p1 + p2) - done) / rate
        lines = _drawn(view)
        assert len(lines) == 3
        assert f"{done}/{sum(r.tokens for r in p1 + p2)}" in lines[0] and fmt_eta(eta) in lines[0]
        assert f"{done}/{sum(r.tokens for r in p1)}" in lines[1]
        assert f"running 1/3 · {b.run_name} loss 3.250" in lines[1]
        assert "queued" in lines[2]
        assert lines[1].endswith("0:00:00") and lines[2].endswith("-:--:--")  # a queued pack's clock has not started

        clock.t += 5
        for r in p1:
            view.run_ended(r, "finished", "")
        view.run_ended(p2[0], "failed", "non-finite loss at step 3")
        lines = _drawn(view)
        assert "finished 3/3" in lines[1] and lines[1].endswith("0:00:05")
        clock.t += 60  # an ended pack's clock stops
        lines = _drawn(view)
        assert lines[1].endswith("0:00:05") and lines[0].endswith("0:01:15")
        assert "running 0/3, failed 1" in lines[2]
        view.run_ended(p2[1], "finished", "")
        view.run_ended(p2[2], "finished", "")
        assert "failed 1/3, finished 2/3" in _drawn(view)[2]
    shown = console.export_text()
    assert f"{p2[0].run_name} failed: non-finite loss at step 3" in shown  # printed above the bars
    assert "failed 1/3, finished 2/3" in shown.splitlines()[-1]  # the bars' last frame, left on screen


def test_a_failed_runs_rest_leaves_the_remaining_tokens():
    (p1, _) = _packed_runs()
    a, b, c = p1
    clock = Clock()
    with StudyProgress("view", [p1], Console(file=io.StringIO(), force_terminal=False), clock=clock) as view:
        view.update({a.run_id: {"tokens": 100, "planned": a.tokens, "state": "running"}}, {})
        assert view.remaining_tokens == a.tokens + b.tokens + c.tokens - 100
        view.run_ended(a, "failed", "x")
        assert view.remaining_tokens == b.tokens + c.tokens


# -- log mode ---------------------------------------------------------------------------


def test_log_mode_lines():
    a, b, c = _runs()
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    ended: dict[str, str] = {}
    with StudyProgress("view", [[a], [b], [c]], console, clock=Clock()) as view:
        assert not view.live
        view.update({a.run_id: {"tokens": 100, "planned": a.tokens, "state": "running", "loss": 3.0}}, ended)
        assert view.done_tokens == 100 and buf.getvalue() == ""
        view.update({a.run_id: {"tokens": a.tokens, "planned": a.tokens, "state": "finished"}}, ended)
        view.update({a.run_id: {"tokens": a.tokens, "planned": a.tokens, "state": "finished"}}, ended)
        ended[a.run_id] = "finished"
        view.run_ended(a, "finished", "")  # the pack's result comes later: no second line
        view.run_ended(b, "finished", "")
        ended[c.run_id] = "failed"
        view.run_ended(c, "failed", "non-finite loss at step 3")
        # a snapshot of an ended run changes nothing
        view.update({c.run_id: {"tokens": 10**9, "planned": c.tokens, "state": "running"}}, ended)
        assert view.done_tokens == a.tokens + b.tokens
    lines = buf.getvalue().splitlines()
    assert lines == [
        f"finished {a.run_name} ({a.tokens:,} tokens) [1/3]",
        f"finished {b.run_name} ({b.tokens:,} tokens) [2/3]",
        f"{c.run_name} failed: non-finite loss at step 3",
    ]


def test_log_mode_study_line_every_30_s_with_the_eta():
    a, b, _ = _runs()
    buf = io.StringIO()
    clock = Clock()
    half = a.tokens // 2
    with StudyProgress("view", [[a], [b]], Console(file=buf, force_terminal=False, width=200), clock=clock) as view:
        clock.t += 31  # the first measurement: no rate yet
        view.update({a.run_id: {"tokens": half, "planned": a.tokens, "state": "running"}}, {})
        clock.t += 10  # not 30 s since the last line: none
        view.update({a.run_id: {"tokens": half + 1000, "planned": a.tokens, "state": "running"}}, {})
        clock.t += 25  # 35 s since the last line; 1000 tokens in the last 35 s
        view.update({a.run_id: {"tokens": half + 1000, "planned": a.tokens, "state": "running"}}, {})
    total = a.tokens + b.tokens
    eta = fmt_eta((total - half - 1000) / (1000 / 35))
    assert buf.getvalue().splitlines() == [
        f"study view: {half:,}/{total:,} tokens, ETA —; running: {a.run_name} 50%",
        f"study view: {half + 1000:,}/{total:,} tokens, {eta}; running: {a.run_name} {(half + 1000) * 100 // a.tokens}%",
    ]
