"""Scaling fits on synthetic finals with known answers, and the fits that must be refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.sections import scaling
from orchestrator.report.stats.scaling import PowerLawFit, crossover_scale, scaling_analysis

X0 = 1e7
REF, VAR = (2.0, 3.0, 0.3), (2.1, 2.6, 0.3)  # (E, A, alpha): VAR is better below ~1e9, worse above


def _finals(laws: dict, n: np.ndarray, seeds=(0, 1, 2), noise=0.003, rng=None) -> pd.DataFrame:
    """Planned finished runs whose loss is E + A (N/X0)^-alpha (+ seed noise) per variant."""
    rng = rng or np.random.default_rng(0)
    rows = [
        dict(
            variant=v,
            scale=f"s{i}",
            seed=s,
            extend=1.0,
            complete=True,
            n_params=x,
            final_flops=120 * x * x,
            final_ppl=np.exp(law(x) + rng.normal(0, noise)),
        )
        for v, law in laws.items()
        for i, x in enumerate(n)
        for s in seeds
    ]
    return pd.DataFrame(rows)


def _law(E, A, alpha):
    return lambda x: E + A * (x / X0) ** -alpha


def test_true_power_law_on_five_scales_recovers_alpha_and_the_crossover():
    n = np.logspace(6.5, 8.5, 5)  # the crossover (1.0e9) lies 3.2x beyond the largest: an extrapolation
    res = scaling_analysis(
        _finals({"standard": _law(*REF), "coupled": _law(*VAR)}, n), "standard", n_boot=200, rng=np.random.default_rng(1)
    )
    for v, (E, _, alpha) in (("standard", REF), ("coupled", VAR)):
        fit = res["fits"][v]["N"]
        assert fit["reason"] is None and fit["fit"]["alpha"] == pytest.approx(alpha, abs=0.02)
        assert fit["fit"]["E"] == pytest.approx(E, abs=0.03)
    truth = crossover_scale(PowerLawFit(*REF[:2], REF[2], X0, 0.0), PowerLawFit(*VAR[:2], VAR[2], X0, 0.0), 1e6, 1e10)
    assert truth == pytest.approx(X0 * (0.4 / 0.1) ** (1 / 0.3), rel=1e-3)  # 0.1 = 0.4 (N/X0)^-0.3
    c = res["crossover"]["coupled"]
    assert c["n"] == pytest.approx(truth, rel=0.3)
    assert c["ci"][0] <= truth <= c["ci"][1] and c["failed_draws"] < 0.05
    assert c["extrapolation"] and c["note"].startswith("an extrapolation: beyond the largest measured N (3.16e+08)")


def test_a_crossover_past_ten_times_the_largest_scale_is_refused():
    n = np.logspace(5.5, 7.5, 5)  # the same laws cross at 1.0e9: 32x the largest measured N
    res = scaling_analysis(_finals({"standard": _law(*REF), "coupled": _law(*VAR)}, n), "standard", n_boot=50)
    c = res["crossover"]["coupled"]
    assert c["n"] is None and c["note"].startswith("refused: the fits do not cross within 10x the largest measured N (3.16e+08)")


def test_four_scales_are_refused_unless_the_exponent_is_fixed():
    n = np.logspace(6, 8, 4)
    f = _finals({"standard": _law(*REF), "coupled": _law(*VAR)}, n)
    res = scaling_analysis(f, "standard", n_boot=20)
    assert res["fits"]["standard"]["N"]["fit"] is None
    assert res["fits"]["standard"]["N"]["reason"] == (
        "4 scales for a 3-parameter law: a fit needs at least 5 distinct scales, or a fixed exponent"
    )
    assert res["crossover"]["coupled"]["n"] is None and "refused" in res["crossover"]["coupled"]["note"]
    fixed = scaling_analysis(f, "standard", n_boot=50, fixed_alpha=0.3)
    assert fixed["fixed_alpha"] == 0.3 and fixed["fits"]["standard"]["N"]["fit"]["alpha"] == 0.3
    assert fixed["crossover"]["coupled"]["n"] == pytest.approx(X0 * 4 ** (1 / 0.3), rel=0.3)


def test_loss_rising_with_n_is_refused_and_says_where():
    """The published CPU study's shape: bigger models got fewer steps and ended worse."""
    n = np.logspace(6, 8, 5)
    res = scaling_analysis(_finals({"standard": lambda x: 4.9 + 0.1 * np.log10(x / 1e6), "coupled": _law(*VAR)}, n), "standard", n_boot=20)
    why = res["fits"]["standard"]["N"]["reason"]
    assert why.startswith("loss does not fall with N: seed-mean loss 4.90") and "at N = 1e+06 rises to 4.95" in why
    assert res["fits"]["coupled"]["N"]["reason"] is None  # the other variant's law is fine


def test_fit_on_a_parameter_bound_is_refused():
    """A loss that falls faster than any alpha <= 3 allows ends on the bound: refused, not drawn."""
    n = np.logspace(6, 8, 5)
    res = scaling_analysis(_finals({"standard": _law(2.0, 0.5, 6.0)}, n, noise=0.0), "standard", n_boot=20)
    fit = res["fits"]["standard"]["N"]
    assert fit["fit"] is None and fit["reason"].startswith("the best fit sits on the parameter bound ")
    assert fit["reason"].split("bound ")[1] in ("alpha = 3 (upper)", "E = 0 (lower)")


def test_no_advantage_at_the_smallest_scale_gives_no_crossover():
    n = np.logspace(6, 8, 5)
    res = scaling_analysis(_finals({"standard": _law(*REF), "worse": _law(2.2, 3.0, 0.3)}, n), "standard", n_boot=20)
    c = res["crossover"]["worse"]
    assert c["n"] is None and c["note"].startswith("no advantage at the smallest measured scale (N = 1e+06")


def test_backtest_predicts_the_held_out_largest_scale_of_a_true_law():
    n = np.logspace(6, 8, 5)
    res = scaling_analysis(_finals({"standard": _law(*REF)}, n, noise=0.003), "standard", n_boot=20)
    b = res["fits"]["standard"]["backtest"]
    truth = _law(*REF)(n[-1])
    assert b["held_out"] == "s4" and b["n_fit_scales"] == 4 and b["n_seeds"] == 3 and b["reason"] is None
    assert b["predicted"] == pytest.approx(truth, abs=0.02) and abs(b["error"]) < 0.02
    assert b["low"] < b["observed"] < b["high"] and b["covered"]
    assert b["high"] - b["low"] < 0.1


def test_backtest_catches_a_largest_scale_that_leaves_the_law():
    """Negative control: the held-out rung sits 0.1 nats above the law the others follow."""
    n = np.logspace(6, 8, 5)
    law = _law(*REF)
    res = scaling_analysis(_finals({"standard": lambda x: law(x) + 0.1 * (x >= n[-1])}, n, noise=0.003), "standard", n_boot=20)
    b = res["fits"]["standard"]["backtest"]
    assert b["error"] == pytest.approx(0.1, abs=0.02) and b["covered"] is False


def test_backtest_vs_flops_predicts_the_held_out_scale_and_catches_one_that_leaves_the_law():
    """FLOPs = 120 N^2 here, so the loss is a power law in FLOPs too (exponent alpha / 2): fitted
    on four scales it predicts the fifth. Negative control: the fifth 0.1 nats above the law."""
    n = np.logspace(6, 8, 5)
    law = _law(*REF)
    b = scaling_analysis(_finals({"standard": law}, n, noise=0.003), "standard", n_boot=20)["fits"]["standard"]["backtest_flops"]
    assert b["held_out"] == "s4" and b["n_params"] == pytest.approx(120 * n[-1] ** 2) and b["reason"] is None
    assert b["predicted"] == pytest.approx(law(n[-1]), abs=0.02) and b["covered"]
    off = scaling_analysis(_finals({"standard": lambda x: law(x) + 0.1 * (x >= n[-1])}, n, noise=0.003), "standard", n_boot=20)
    b = off["fits"]["standard"]["backtest_flops"]
    assert b["error"] == pytest.approx(0.1, abs=0.02) and b["covered"] is False


def test_prediction_intervals_cover_the_law_and_widen_with_seed_noise():
    n = np.logspace(6, 8, 5)
    widths = {}
    for noise in (0.003, 0.03):
        res = scaling_analysis(_finals({"standard": _law(*REF)}, n, noise=noise), "standard", n_boot=20)
        pred = res["fits"]["standard"]["N"]["prediction"]
        assert [p["scale"] for p in pred] == [f"s{i}" for i in range(5)] and all(p["n_seeds"] == 3 for p in pred)
        assert all(p["low"] < _law(*REF)(p["n_params"]) < p["high"] for p in pred)
        widths[noise] = np.median([p["high"] - p["low"] for p in pred])
    assert 4 < widths[0.03] / widths[0.003] < 25  # width follows the noise, not a constant


def test_no_flops_logged_gives_a_flop_backtest_reason_and_keeps_the_n_one():
    """Runs that logged no FLOPs: the FLOP backtest says why it has nothing to hold out (it
    used to raise IndexError and take the report down); the N backtest is unchanged."""
    f = _finals({"standard": _law(*REF)}, np.logspace(6, 8, 5))
    res = scaling_analysis(f.assign(final_flops=np.nan), "standard", n_boot=20)["fits"]["standard"]
    why = "0 scale(s) with training FLOPs logged: nothing to hold out"
    assert res["backtest_flops"] == {"held_out": None, "n_fit_scales": 0, "reason": why}
    assert res["backtest"] == scaling_analysis(f, "standard", n_boot=20)["fits"]["standard"]["backtest"]


def test_four_scales_have_no_backtest():
    res = scaling_analysis(_finals({"standard": _law(*REF)}, np.logspace(6, 8, 4)), "standard", n_boot=20)
    why = {"reason": "4 scales: a backtest holds out the largest and fits 4 or more others"}
    assert res["fits"]["standard"]["backtest"] == res["fits"]["standard"]["backtest_flops"] == why


def test_the_scaling_section_prints_intervals_backtest_and_an_extrapolated_crossover():
    n = np.logspace(6.5, 8.5, 5)
    res = scaling_analysis(_finals({"standard": _law(*REF), "coupled": _law(*VAR)}, n), "standard", n_boot=50)
    text = "\n".join(scaling({"scaling": res, "reference": "standard"}).text)
    b = res["fits"]["standard"]["backtest"]
    assert f"`standard` vs N: fitted to 4 scales, predicts s4 (N = 3.16e+08) at {b['predicted']:.4f} nats" in text
    bf = res["fits"]["standard"]["backtest_flops"]
    assert f"`standard` vs FLOPs: fitted to 4 scales, predicts s4 (FLOPs = {bf['n_params']:.3g}) at {bf['predicted']:.4f}" in text
    assert "inside its interval. Fitted with one spare scale only." in text
    p = res["fits"]["coupled"]["N"]["prediction"][0]
    assert f"s0 {p['predicted']:.4f} [{p['low']:.4f}, {p['high']:.4f}] observed {p['observed']:.4f}" in text
    assert "an extrapolation: beyond the largest measured N (3.16e+08)" in text
    assert "(in-sample, 3 seeds)" in text and "(held-out, 2 seeds)" in text  # the simulated coverage is printed
