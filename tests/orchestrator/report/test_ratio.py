"""Token-ratio, interval and scaling statistics on exact, known curves (no MLflow)."""

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.stats.scaling import PowerLawFit, crossover_scale, fit_power_law
from orchestrator.report.stats.solve import curve_crossing, solve_tokens


def _ppl(tokens, k=1.0):
    # Saturating law in tokens: ln ppl = 2 + 100 (k D)^-0.28
    return np.exp(2.0 + 100.0 * (k * np.asarray(tokens, float)) ** -0.28)


def test_solve_tokens_finds_known_ratio_between_extend_runs():
    d_c = 1e8
    tokens = d_c * np.array([1.0, 1.5, 2.0, 3.0])
    d, censor = solve_tokens(tokens, _ppl(tokens), _ppl(d_c, k=2.4))
    assert censor is None
    assert d / d_c == pytest.approx(2.4, rel=1e-3)


def test_solve_tokens_censors_instead_of_extrapolating():
    tokens = 1e8 * np.array([1.0, 2.0, 3.0])
    assert solve_tokens(tokens, _ppl(tokens), _ppl(1e8, k=4.0)) == (3e8, ">")
    assert solve_tokens(tokens, _ppl(tokens), _ppl(1e8, k=0.5)) == (1e8, "<")


def test_solve_tokens_tolerates_seed_noise_that_breaks_monotonicity():
    tokens = 1e8 * np.array([1.0, 1.5, 2.0, 3.0])
    ppl = _ppl(tokens)
    ppl[2] = ppl[1] * 1.001  # x2 noisily worse than x1.5
    d, censor = solve_tokens(tokens, ppl, _ppl(1e8, k=2.6))
    assert censor is None and 2e8 <= d <= 3e8


def test_curve_crossing_interpolates_log_log_and_censors():
    steps = np.array([1e7, 2e7, 4e7, 8e7])
    ppl = np.array([40.0, 30.0, 20.0, 10.0])
    d, censor = curve_crossing(steps, ppl, 25.0)
    # between 2e7 (30) and 4e7 (20): log-linear in both axes
    u = (np.log(25) - np.log(30)) / (np.log(20) - np.log(30))
    assert censor is None and d == pytest.approx(np.exp(np.log(2e7) + u * np.log(2)))
    assert curve_crossing(steps, ppl, 5.0) == (8e7, ">")
    assert curve_crossing(steps, ppl, 50.0) == (1e7, "<")


def test_fit_power_law_recovers_parameters_from_several_starts():
    n = np.array([1e6, 3e6, 1e7, 3e7, 1e8])
    loss = 1.7 + 40.0 * n**-0.3
    fit = fit_power_law(n, loss)
    assert fit is not None
    assert fit.E == pytest.approx(1.7, abs=1e-3)
    assert fit.alpha == pytest.approx(0.3, abs=1e-3)
    assert np.allclose(fit.loss(n), loss, atol=1e-6)
    assert fit_power_law(n[:2], loss[:2]) is None  # fewer than 3 scales: no fit
    assert fit_power_law(n[:3], loss[:3]) is None  # 3 scales for 3 parameters: no fit either
    fixed = fit_power_law(n[:3], loss[:3], alpha=0.3)  # a fixed exponent leaves 2 parameters
    assert fixed is not None and fixed.alpha == 0.3 and fixed.E == pytest.approx(1.7, abs=1e-6)


def test_crossover_scale_where_advantage_reaches_zero():
    ref = PowerLawFit(E=2.0, A=1.0, alpha=0.3, x0=1e7, rmse=0.0)
    var = PowerLawFit(E=2.05, A=0.8, alpha=0.3, x0=1e7, rmse=0.0)
    # gap 0.05 - 0.2 (N/1e7)^-0.3 = 0  <=>  N = 1e7 * 4^(1/0.3)
    assert crossover_scale(ref, var, 1e6, 1e12) == pytest.approx(1e7 * 4 ** (1 / 0.3), rel=1e-3)
    never = PowerLawFit(E=1.9, A=0.8, alpha=0.3, x0=1e7, rmse=0.0)
    assert crossover_scale(ref, never, 1e6, 1e12) is None  # better everywhere in the span
    assert crossover_scale(ref, var, 1e6, 1e8) is None  # the crossing lies beyond the span
    worse = PowerLawFit(E=2.3, A=1.0, alpha=0.3, x0=1e7, rmse=0.0)
    assert crossover_scale(ref, worse, 1e6, 1e12) == 1e6  # no advantage at the start


def _finals(study, scale, rng):
    """Per-run finals of one scale of a synthetic study, as curves.run_finals would give them."""
    from tests.synthetic_study import finals_frame

    return finals_frame(study, rng, scales=[scale])


def test_interval_covers_truth_at_nominal_rate_with_three_seeds():
    """The quick check; the coverage simulation at realistic noise is test_coverage.py."""
    from orchestrator.report.stats.ratio import token_ratio
    from tests.synthetic_study import SyntheticStudy

    study = SyntheticStudy(scales={"xs": 2e6}, seeds=(0, 1, 2))
    hits = []
    for rep in range(40):
        rng = np.random.default_rng(rep)
        r = token_ratio("xs", "coupled", "standard", _finals(study, "xs", rng))
        hits.append(r.ci_low <= 2.4 <= r.ci_high)
    # Resampling 3 seeds with replacement covers ~75% (30/40); the interval must do better.
    assert sum(hits) >= 36


def test_interval_ends_carry_the_side_they_are_censored_on():
    """A variant far worse than the reference's x1 run: equal loss is rejected at every measured
    length, so the set lies below the range and both ends are upper bounds ('<'), never '>'
    (the reference's longest run reached it easily)."""
    from orchestrator.report.stats.ratio import token_ratio
    from tests.synthetic_study import SyntheticStudy

    study = SyntheticStudy(scales={"xs": 2e6}, seeds=(0, 1, 2), variants={"standard": 1.0, "worse": 0.5})
    rng = np.random.default_rng(0)
    r = token_ratio("xs", "worse", "standard", _finals(study, "xs", rng))
    assert r.token_ratio.censored and r.token_ratio.display().startswith("<")
    assert (r.ci_low_side, r.ci_high_side) == ("<", "<")
    assert r.interval_display() == f"[<{r.ci_low:.2f}, <{r.ci_high:.2f}]"
    # and a variant far better than the longest reference run: both ends '>'
    study = SyntheticStudy(scales={"xs": 2e6}, seeds=(0, 1, 2), variants={"standard": 1.0, "better": 6.0})
    r = token_ratio("xs", "better", "standard", _finals(study, "xs", rng))
    assert r.token_ratio.display().startswith(">") and (r.ci_low_side, r.ci_high_side) == (">", ">")


def test_interior_interval_end_is_not_marked_censored():
    """The CPU study's stdlib cpu-xs finals (results/cpu-study): coupled's target sits near
    standard's x1 run, so the interval's lower end is censored below; its upper end is inside
    the measured range and must print as a plain number (a bootstrap version once printed
    '>1.49' because some draw beyond it was censored)."""
    from orchestrator.report.stats.ratio import token_ratio

    ppl = {
        ("coupled", 1.0): [165.408, 164.773, 126.361],
        ("standard", 1.0): [143.954, 141.273, 128.6],
        ("standard", 1.5): [103.666, 108.975, 87.188],
        ("standard", 2.0): [72.987, 87.03, 69.386],
        ("standard", 3.0): [52.379, 58.247, 50.679],
    }
    rows = [
        dict(
            scale="cpu-xs",
            variant=v,
            seed=i,
            extend=e,
            tokens=(159744 if v == "coupled" else 163840 * e),
            final_ppl=p,
            complete=True,
            flops_per_token=1.0,
            final_wall_s=1.0,
        )
        for (v, e), ps in ppl.items()
        for i, p in enumerate(ps)
    ]
    r = token_ratio("cpu-xs", "coupled", "standard", pd.DataFrame(rows))
    assert r.token_ratio.display() == "<1.03x"
    assert r.ci_low_side == "<" and r.ci_high_side == "" and 1.03 < r.ci_high < 3.0
    assert r.interval_display() == f"[<1.03, {r.ci_high:.2f}]"


def test_single_run_estimate_is_flagged_when_it_disagrees_with_the_extend_estimate():
    from orchestrator.report.stats.ratio import Estimate, RatioResult, single_run_disagreement

    def result(extend, interval, single):
        r = RatioResult("xs", "v", "standard", extend, single_run=single)
        r.ci_low, r.ci_high, r.ci_low_side, r.ci_high_side = interval
        return r

    inside = (1.1, 1.6, "", "")
    assert single_run_disagreement(result(Estimate(1.3), inside, Estimate(1.4))) is None
    # opposite sides of 1x: the published CPU study's stdlib cpu-m coupled row (0.84x vs 1.21x)
    flag = single_run_disagreement(result(Estimate(1.21), (1.02, 1.42, "<", ""), Estimate(0.84)))
    assert flag == "opposite sides of 1x: curve 0.84x vs extend 1.21x"
    # same side, outside the interval (above its uncensored end)
    assert single_run_disagreement(result(Estimate(1.3), inside, Estimate(1.9))) == "curve 1.90x outside the interval [1.10, 1.60]"
    # a censored extend bound leaves the side open and a marked end is open: no flag
    assert single_run_disagreement(result(Estimate(1.03, True, "<"), (1.03, 1.24, "<", ""), Estimate(0.73))) is None
    assert single_run_disagreement(result(Estimate(3.0, True, ">"), (2.5, 3.0, "", ">"), Estimate(3.0, True, ">"))) is None
    # a censored curve estimate beyond an uncensored interval end is outside it
    assert single_run_disagreement(result(Estimate(1.3), inside, Estimate(1.6, True, ">"))).startswith("curve >1.60x outside")


def test_single_run_estimate_reads_the_curve_at_the_variants_last_curve_point():
    """The curve is measured on the eval windows; the final pass averages more windows, so the
    variant's final perplexity (12 here) is not the level to look for on the reference's curve:
    its last curve point (10) is. The reference's curve reaches 10 at 2.5e5 tokens (12 at 2e5)."""
    from orchestrator.report.stats.ratio import token_ratio

    d_c = 1e5
    rows = [
        dict(scale="xs", variant=v, seed=s, extend=e, tokens=d_c * e, final_ppl=p, complete=True, flops_per_token=1.0, final_wall_s=1.0)
        for v, e, p in (("coupled", 1.0, 12.0), ("standard", 1.0, 14.0), ("standard", 3.0, 8.0))
        for s in (0, 1)
    ]
    ref_steps = np.array([1e5, 2e5, 2.5e5, 3e5])
    curves = pd.DataFrame(
        [dict(scale="xs", variant="standard", extend=3.0, step=t, mean=p, n_seeds=2) for t, p in zip(ref_steps, (16.0, 12.0, 10.0, 9.0))]
        + [dict(scale="xs", variant="coupled", extend=1.0, step=t, mean=p, n_seeds=2) for t, p in ((5e4, 20.0), (1e5, 10.0))]
    )
    r = token_ratio("xs", "coupled", "standard", pd.DataFrame(rows), curves)
    assert r.single_run.value == pytest.approx(2.5) and not r.single_run.censored
    assert "coupled's last eval point (10)" in r.single_run_source
    # without the variant's own curve the final perplexity is the level, as before
    r = token_ratio("xs", "coupled", "standard", pd.DataFrame(rows), curves[curves["variant"] == "standard"])
    assert r.single_run.value == pytest.approx(2.0)
    assert "coupled's final perplexity" in r.single_run_source
