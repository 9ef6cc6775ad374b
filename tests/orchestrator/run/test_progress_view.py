"""The driver's progress view in log mode (not a terminal): one line per finished run, printed
once whichever report (board snapshot or the pack's result) comes first, and failures."""

import io

from rich.console import Console

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.progress import StudyProgress


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


def test_log_mode_lines():
    a, b, c = _runs()
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    ended: dict[str, str] = {}
    with StudyProgress("view", [a, b, c], console) as view:
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


def test_log_mode_study_line_every_30_s():
    a, b, _ = _runs()
    buf = io.StringIO()
    with StudyProgress("view", [a, b], Console(file=buf, force_terminal=False, width=200)) as view:
        view._last_line -= 31  # as if the last study line were 31 s ago
        view.update({a.run_id: {"tokens": a.tokens // 2, "planned": a.tokens, "state": "running"}}, {})
        view.update({a.run_id: {"tokens": a.tokens // 2, "planned": a.tokens, "state": "running"}}, {})
    total = a.tokens + b.tokens
    assert buf.getvalue().splitlines() == [f"study view: {a.tokens // 2:,}/{total:,} tokens; running: {a.run_name} 50%"]
