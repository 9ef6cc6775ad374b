"""Tokens to an MQAR accuracy and the seed-paired token ratio at one (orchestrator/report/stats/recall.py),
on synthetic curves with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.stats.recall import accuracy_ratio, crossing_column, display_ratio, seed_crossings, tokens_to

COL = crossing_column(0.9)


def _learning_curve(tokens: np.ndarray, midpoint: float, width: float = 0.15) -> np.ndarray:
    """A recall task's jump: a guess among 4 values (0.25) until near `midpoint` tokens, then a
    logistic rise in ln tokens to 1.0."""
    return 0.25 + 0.75 / (1.0 + np.exp(-(np.log(tokens) - math.log(midpoint)) / width))


def _crossing_at(midpoint: float, at: float, width: float = 0.15) -> float:
    """Where _learning_curve reaches `at`, solved in closed form."""
    return midpoint * math.exp(width * math.log((at - 0.25) / (1.0 - at)))


def test_tokens_to_interpolates_between_the_evaluations_around_the_first_crossing():
    t = np.array([100.0, 200.0, 300.0, 400.0])
    assert tokens_to(t, np.array([0.2, 0.4, 0.8, 0.95]), 0.6) == pytest.approx(250.0)
    assert tokens_to(t, np.array([0.2, 0.4, 0.8, 0.95]), 0.8) == pytest.approx(300.0)  # at an evaluation
    assert tokens_to(t, np.array([0.95, 0.97, 0.98, 0.99]), 0.9) == 100.0  # no point before the first
    assert tokens_to(t, np.array([0.2, 0.4, 0.8, 0.85]), 0.9) is None  # censored at 400
    # the first crossing counts, not a later one after a dip
    assert tokens_to(t, np.array([0.2, 0.92, 0.5, 0.95]), 0.9) == pytest.approx(100.0 + 0.7 / 0.72 * 100.0)
    with pytest.raises(ValueError, match="increase"):
        tokens_to(np.array([100.0, 100.0]), np.array([0.1, 0.2]), 0.5)
    with pytest.raises(ValueError, match="one length"):
        tokens_to(t, np.array([0.1, 0.2]), 0.5)


def test_tokens_to_recovers_a_known_crossing_within_the_interpolation_error():
    t = np.linspace(5.12e5, 1.2288e7, 24)  # the 24 evaluations of a 12.3M-token run, as jobs/cpu-mqar-easy.yaml
    acc = _learning_curve(t, 6e6)
    truth = _crossing_at(6e6, 0.9)
    err = abs(tokens_to(t, acc, 0.9) / truth - 1)
    assert err < 0.01
    # negative control: the first evaluation at or above, without interpolating, is off by more
    nearest = t[np.flatnonzero(acc >= 0.9)[0]]
    assert abs(nearest / truth - 1) > 0.02 > 5 * err


def _cross(rows: list[tuple], first: float = 2.5e5) -> pd.DataFrame:
    """A crossing table from (variant, seed, tokens_to_90, last_tokens), every run's first
    evaluation at ``first`` tokens."""
    return pd.DataFrame(
        [{"scale": "xs", "variant": v, "seed": s, COL: t, "first_tokens": first, "last_tokens": last} for v, s, t, last in rows]
    )


def test_the_ratio_is_the_geometric_mean_of_the_paired_ratios_with_a_t_interval():
    cross = _cross([("standard", 0, 6e6, 1e7), ("standard", 1, 8e6, 1e7), ("coupled", 0, 3e6, 1e7), ("coupled", 1, 5e6, 1e7)])
    r = accuracy_ratio(cross, "xs", "coupled", "standard")
    logs = np.log([2.0, 1.6])
    assert r["ratio"] == pytest.approx(math.sqrt(2.0 * 1.6)) and r["direction"] == "" and r["pairs"] == 2
    half = 12.706204736 * np.std(logs, ddof=1) / math.sqrt(2)  # t_{1, 0.975}
    assert r["ci_low"] == pytest.approx(math.exp(logs.mean() - half)) and r["ci_high"] == pytest.approx(math.exp(logs.mean() + half))
    assert display_ratio(r) == f"1.79x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def test_known_ratios_are_recovered_from_curves_and_the_interval_separates_them_from_one():
    """Variant curves are the reference's shifted by a known factor in tokens per seed (plus seed
    noise shared by both arms of a seed): the estimate recovers the factor, the interval holds
    it; with no shift (the negative control) the interval holds 1, with a 2x shift it excludes 1."""
    t = np.linspace(2.5e5, 1.2e7, 48)
    rng = np.random.default_rng(0)
    for shift in (1.0, 2.0):
        rows = []
        for seed in range(3):
            mid = 6e6 * math.exp(rng.normal(0, 0.1))  # the seed moves both arms' jump together
            jitter = math.exp(rng.normal(0, 0.03))  # and each pair's ratio a little
            for variant, m in (("standard", mid), ("coupled", mid / shift * jitter)):
                rows.append(("standard" if variant == "standard" else "coupled", seed, tokens_to(t, _learning_curve(t, m), 0.9), t[-1]))
        r = accuracy_ratio(_cross(rows), "xs", "coupled", "standard")
        assert r["ratio"] == pytest.approx(shift, rel=0.06)
        assert r["ci_low"] <= shift <= r["ci_high"]
        assert (r["ci_low"] <= 1.0 <= r["ci_high"]) == (shift == 1.0)


def test_the_t_interval_covers_a_known_ratio_at_its_level():
    """Coverage on 2,000 synthetic studies of 3 seed pairs with log-normal pair noise: 95% within
    Monte Carlo error; the negative control scores the same intervals against a wrong truth."""
    rng = np.random.default_rng(1)
    truth, hits, wrong = 1.5, 0, 0
    for _ in range(2000):
        ref = 6e6 * np.exp(rng.normal(0, 0.2, 3))
        var = ref / truth * np.exp(rng.normal(0, 0.15, 3))
        rows = [("standard", s, ref[s], 1.2e7) for s in range(3)] + [("coupled", s, var[s], 1.2e7) for s in range(3)]
        r = accuracy_ratio(_cross(rows), "xs", "coupled", "standard")
        hits += r["ci_low"] <= truth <= r["ci_high"]
        wrong += r["ci_low"] <= 1.3 * truth <= r["ci_high"]
    assert 0.93 <= hits / 2000 <= 0.97
    assert wrong / 2000 < 0.8


def test_a_seed_that_never_got_there_makes_the_ratio_a_bound_or_none():
    late_variant = accuracy_ratio(
        _cross([("standard", 0, 6e6, 1e7), ("standard", 1, 8e6, 1e7), ("coupled", 0, 3e6, 1e7), ("coupled", 1, np.nan, 1e7)]),
        "xs",
        "coupled",
        "standard",
    )
    # seed 1's ratio is below 8e6 / 1e7: the mean of ln 2 and ln 0.8 bounds the mean from above
    assert late_variant["direction"] == "<" and late_variant["ratio"] == pytest.approx(math.sqrt(2.0 * 0.8))
    assert late_variant["ci_low"] is None and display_ratio(late_variant) == "<1.26x"
    late_ref = accuracy_ratio(_cross([("standard", 0, np.nan, 1e7), ("coupled", 0, 4e6, 1e7)]), "xs", "coupled", "standard")
    assert late_ref["direction"] == ">" and late_ref["ratio"] == pytest.approx(2.5)
    both_ways = accuracy_ratio(
        _cross([("standard", 0, np.nan, 1e7), ("standard", 1, 8e6, 1e7), ("coupled", 0, 3e6, 1e7), ("coupled", 1, np.nan, 1e7)]),
        "xs",
        "coupled",
        "standard",
    )
    assert both_ways["ratio"] is None and "both ways" in both_ways["note"]
    neither = accuracy_ratio(_cross([("standard", 0, np.nan, 1e7), ("coupled", 0, np.nan, 1e7)]), "xs", "coupled", "standard")
    assert neither["ratio"] is None and display_ratio(neither) == "n/a (seed 0: neither arm reached 90%)"


def test_a_crossing_at_the_first_evaluation_is_at_most_its_tokens():
    """Reached by the first evaluation, a crossing is only known as <= those tokens: the variant's
    makes the ratio a '>' bound, the reference's a '<' one, both at once no ratio. The control: a
    crossing just after the first evaluation is exact, with an interval."""
    first = 1e6
    fast_variant = accuracy_ratio(
        _cross([("standard", 0, 6e6, 1e7), ("standard", 1, 8e6, 1e7), ("coupled", 0, first, 1e7), ("coupled", 1, 4e6, 1e7)], first),
        "xs",
        "coupled",
        "standard",
    )
    assert (
        fast_variant["direction"] == ">" and fast_variant["ratio"] == pytest.approx(math.sqrt(6.0 * 2.0)) and fast_variant["ci_low"] is None
    )
    fast_ref = accuracy_ratio(_cross([("standard", 0, first, 1e7), ("coupled", 0, 4e6, 1e7)], first), "xs", "coupled", "standard")
    assert fast_ref["direction"] == "<" and fast_ref["ratio"] == pytest.approx(0.25)
    both = accuracy_ratio(_cross([("standard", 0, first, 1e7), ("coupled", 0, first, 1e7)], first), "xs", "coupled", "standard")
    assert both["ratio"] is None and both["note"] == "seed 0: its bounds point both ways at 90%"
    # the variant known to be slower than 1e7 and the reference by 1e6: both push the ratio down
    down = accuracy_ratio(_cross([("standard", 0, first, 1e7), ("coupled", 0, np.nan, 1e7)], first), "xs", "coupled", "standard")
    assert down["direction"] == "<" and down["ratio"] == pytest.approx(0.1)
    control = accuracy_ratio(
        _cross([("standard", 0, 6e6, 1e7), ("standard", 1, 8e6, 1e7), ("coupled", 0, first * 1.01, 1e7), ("coupled", 1, 4e6, 1e7)], first),
        "xs",
        "coupled",
        "standard",
    )
    assert control["direction"] == "" and control["ci_low"] is not None
    cells = seed_crossings(_cross([("coupled", 0, first, 1e7), ("coupled", 1, 4e6, 1e7), ("coupled", 2, np.nan, 1.2e7)], first), 0.9)
    assert cells == {("xs", "coupled"): "<=1M, 4M, >12M"}
