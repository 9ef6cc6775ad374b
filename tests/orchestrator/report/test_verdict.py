"""Seed-paired differences (verdict.py, wiring power.py) on synthetic finals with a known effect (no MLflow)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from orchestrator.report.stats.verdict import compare, paired_differences

TRUE_DLOSS = -0.05  # variant minus reference, nats


def _finals(rng, n_seeds=3, shared=0.1, own=0.005, shift=TRUE_DLOSS, variant_seeds=None) -> pd.DataFrame:
    """x1 finals of one scale: loss 5 + shared[seed] + own noise (+ shift for the variant)."""
    seeds = np.arange(n_seeds)
    common = rng.normal(0.0, shared, n_seeds)
    rows = [
        dict(scale="xs", variant="standard", seed=s, extend=1.0, complete=True, final_ppl=np.exp(5 + common[s] + rng.normal(0, own)))
        for s in seeds
    ]
    rows += [
        dict(
            scale="xs",
            variant="coupled",
            seed=s,
            extend=1.0,
            complete=True,
            final_ppl=np.exp(5 + shift + common[s % n_seeds] + rng.normal(0, own)),
        )
        for s in (variant_seeds or seeds)
    ]
    return pd.DataFrame(rows)


def test_paired_difference_matches_the_paired_t_test_and_beats_unpaired_when_seeds_share_noise():
    f = _finals(np.random.default_rng(0))
    row = paired_differences(f, ["xs"], ["standard", "coupled"], "standard").iloc[0]
    v = np.log(f[f.variant == "coupled"]["final_ppl"].to_numpy())
    r = np.log(f[f.variant == "standard"]["final_ppl"].to_numpy())
    t = stats.ttest_rel(v, r)
    ci = t.confidence_interval(0.95)
    assert row["n_pairs"] == 3 and row["paired_dloss"] == pytest.approx((v - r).mean())
    assert row["p_value"] == pytest.approx(t.pvalue) and (row["paired_low"], row["paired_high"]) == pytest.approx((ci.low, ci.high))
    welch = stats.ttest_ind(v, r, equal_var=False).confidence_interval(0.95)
    assert (row["unpaired_low"], row["unpaired_high"]) == pytest.approx((welch.low, welch.high))
    assert row["paired_low"] <= TRUE_DLOSS <= row["paired_high"]
    # the shared seed noise (0.1 nats) cancels in the pairs: the paired interval is far narrower
    assert (row["unpaired_high"] - row["unpaired_low"]) > 5 * (row["paired_high"] - row["paired_low"])
    assert row["verdict"] == "better" and row["paired_ppl_pct"] == pytest.approx(100 * np.expm1(row["paired_dloss"]))
    assert 0 < row["detectable"] < abs(TRUE_DLOSS) and row["seeds_needed"] <= 3  # the seeds resolve this gap


def test_without_shared_noise_pairing_gains_nothing():
    """Negative control: independent noise per run, so paired and unpaired widths agree on average."""
    ratios = []
    for rep in range(200):
        row = paired_differences(
            _finals(np.random.default_rng(rep), shared=0.0, own=0.05), ["xs"], ["standard", "coupled"], "standard"
        ).iloc[0]
        ratios.append((row["paired_high"] - row["paired_low"]) / (row["unpaired_high"] - row["unpaired_low"]))
    assert 0.8 < np.median(ratios) < 1.5


def test_paired_interval_covers_the_true_difference_at_its_nominal_rate():
    hits = [
        (lambda r: r["paired_low"] <= TRUE_DLOSS <= r["paired_high"])(
            paired_differences(_finals(np.random.default_rng(rep), own=0.03), ["xs"], ["standard", "coupled"], "standard").iloc[0]
        )
        for rep in range(300)
    ]
    assert 0.92 <= np.mean(hits) <= 0.98


def test_unmatched_seeds_are_named_and_too_few_pairs_give_no_verdict():
    row = paired_differences(_finals(np.random.default_rng(1), variant_seeds=[0, 1, 7]), ["xs"], ["standard", "coupled"], "standard").iloc[
        0
    ]
    assert row["n_pairs"] == 2 and "seed(s) 2, 7 without a partner" in row["note"]
    lone = compare(pd.Series({0: 5.0}), pd.Series({0: 5.1, 1: 5.2}))
    assert lone["n_pairs"] == 1 and np.isnan(lone["paired_low"]) and lone["verdict"] == "no verdict: one seed"
    assert "seed(s) 1 without a partner" in lone["note"] and lone["unpaired_dloss"] == pytest.approx(5.0 - 5.15)
