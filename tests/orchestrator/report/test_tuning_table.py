"""The report's tuning table on synthetic tuning outcomes with a known answer."""

import math

from orchestrator.plan.tuning import TuningResult
from orchestrator.report.parts.tuning import display, section_text, tuning_table


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


RULE = {"grid": [1e-3, 3e-3, 1e-2], "seeds": [0, 1], "extend_edges": 2, "min_steps": 50, "per_corpus": False, "unigram_bar": True}


def _ruled_results():
    # standard: its optimum below the grid, extended twice (1e-3 / 3, / 3 again) and interior at
    # 3.333e-4; coupled: still falling at the second extension (at the edge after 2);
    # differential: 1e-2 has the lowest mean (3.1) but seed 1 ended above unigram (ln ppl 5.0)
    loss = {
        ("standard", 1.111e-4): (3.1, 3.1),
        ("standard", 3.333e-4): (3.0, 3.0),
        ("standard", 1e-3): (3.2, 3.2),
        ("standard", 3e-3): (3.5, 3.5),
        ("standard", 1e-2): (3.9, 3.9),
        ("coupled", 1.111e-4): (2.9, 2.9),
        ("coupled", 3.333e-4): (3.0, 3.0),
        ("coupled", 1e-3): (3.2, 3.2),
        ("coupled", 3e-3): (3.5, 3.5),
        ("coupled", 1e-2): (3.9, 3.9),
        ("differential", 1e-3): (3.4, 3.4),
        ("differential", 3e-3): (3.3, 3.3),
        ("differential", 1e-2): (1.0, 5.2),
    }
    return [TuningResult(v, "cpu-xs", lr, s, x, "finished", "stdlib") for (v, lr), xs in loss.items() for s, x in enumerate(xs)]


def test_a_recorded_rule_shows_extended_points_the_unigram_flag_and_the_note():
    t = tuning_table(_ruled_results(), RULE, {"stdlib": math.exp(5.0)}).set_index("variant")
    lrs = ["lr 0.0001111", "lr 0.0003333", "lr 0.001", "lr 0.003", "lr 0.01"]
    assert list(t.columns) == ["scale", *lrs, "chosen_lr", "edge", "seeds", "missing", "extended", "above_unigram", "note"]
    s, c, d = t.loc["standard"], t.loc["coupled"], t.loc["differential"]
    assert (s["chosen_lr"], s["edge"], s["note"]) == (3.333e-4, "", "interior after 2 extensions")
    assert s["extended"] == "0.0001111, 0.0003333 (2 below, 0 above)" and s["above_unigram"] == ""
    assert (c["chosen_lr"], c["edge"], c["note"]) == (1.111e-4, "lowest", "at the lowest edge after 2 extensions")
    assert (d["chosen_lr"], d["above_unigram"], d["extended"]) == (3e-3, "0.01", "") and math.isnan(d["lr 0.0001111"])
    text = " ".join(section_text(t.reset_index()))
    assert "`standard` @ cpu-xs: the grid was extended at the grid's own ratio to 0.0001111, 0.0003333 (2 below, 0 above); " in text
    assert "the best LR is interior after 2 extensions." in text
    assert "the best LR is at the lowest edge after 2 extensions; the optimum may lie beyond it (raise tune.extend_edges)." in text
    assert "`differential` @ cpu-xs: the tuning runs at LR 0.01 ended above their corpus's unigram perplexity: never chosen." in text
    assert "widen the grid" not in text  # the extended arm's edge is said once, with its extensions
    shown = display(t.reset_index()).set_index("variant")
    assert shown.loc["differential", "lr 0.0001111"] == "—" and shown.loc["standard", "chosen_lr"] == "0.0003333"


def test_negative_control_a_store_without_the_rule_keeps_the_plain_argmin_and_its_columns():
    t = tuning_table(_ruled_results()).set_index("variant")
    assert "note" not in t.columns and "extended" not in t.columns
    assert t.loc["differential", "chosen_lr"] == 1e-2  # no unigram bar: the lowest mean wins
    assert t.loc["standard", "chosen_lr"] == 3.333e-4 and t.loc["standard", "edge"] == ""  # every LR is its grid
