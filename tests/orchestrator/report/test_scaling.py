"""Scaling fits on synthetic finals with known answers, and the fits that must be refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.scaling import PowerLawFit, crossover_scale, scaling_analysis

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
    n = np.logspace(6, 8, 5)
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


def test_three_scales_are_refused_unless_the_exponent_is_fixed():
    n = np.logspace(6, 8, 3)
    f = _finals({"standard": _law(*REF), "coupled": _law(*VAR)}, n)
    res = scaling_analysis(f, "standard", n_boot=20)
    assert res["fits"]["standard"]["N"]["fit"] is None
    assert res["fits"]["standard"]["N"]["reason"] == (
        "3 scales for a 3-parameter law: a fit needs at least 4 distinct scales, or a fixed exponent"
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
