"""The report's tuning table on synthetic tuning outcomes with a known answer."""

import math

from orchestrator.plan.tuning import TuningResult
from orchestrator.report.tuning import display, section_text, tuning_table


def _results():
    # standard: interior best at 3e-3 (mean over seeds 0 and 1); differential: best at the lowest LR,
    # its 1e-2 diverged on seed 1 (the point is +inf)
    loss = {
        ("standard", 1e-3): (3.0, 3.2),
        ("standard", 3e-3): (2.5, 2.7),
        ("standard", 1e-2): (2.9, 2.9),
        ("differential", 1e-3): (2.6, 2.6),
        ("differential", 3e-3): (2.8, 2.6),
        ("differential", 1e-2): (2.4, None),
    }
    return [
        TuningResult(v, "cpu-xs", lr, s, x, "finished" if x is not None else "diverged")
        for (v, lr), xs in loss.items()
        for s, x in enumerate(xs)
    ]


def test_tuning_table_means_over_seeds_and_flags_the_edge():
    t = tuning_table(_results()).set_index("variant")
    assert list(t.columns) == ["scale", "lr 0.001", "lr 0.003", "lr 0.01", "chosen_lr", "edge", "seeds", "missing"]
    assert t.loc["standard", "lr 0.001"] == 3.1 and math.isclose(t.loc["standard", "lr 0.003"], 2.6)
    assert (t.loc["standard", "chosen_lr"], t.loc["standard", "edge"]) == (3e-3, "")
    assert math.isinf(t.loc["differential", "lr 0.01"])  # 2.4 on seed 0 does not win: seed 1 diverged
    assert (t.loc["differential", "chosen_lr"], t.loc["differential", "edge"]) == (1e-3, "lowest")
    text = " ".join(section_text(t.reset_index()))
    assert "`differential` @ cpu-xs: the best LR 0.001 is the lowest of the grid" in text and "`standard` @" not in text
    shown = display(t.reset_index())
    assert shown.loc[0, "lr 0.003"] == "2.7000" and shown.loc[1, "chosen_lr"] == "0.003"
