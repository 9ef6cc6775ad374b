"""The seed-paired verdict and its power, checked against scipy and by simulating many studies."""

import math

import numpy as np
import pytest
from scipy import stats

from orchestrator.report.stats.power import diff_sd, min_detectable_effect, paired_power, paired_verdict, plan_power, seeds_needed

VAR = {0: 3.10, 1: 3.05, 2: 3.12}
REF = {0: 3.20, 1: 3.18, 2: 3.19}


def test_fixed_example_against_scipy_and_by_hand():
    v = paired_verdict(VAR, REF)
    res = stats.ttest_rel([3.10, 3.05, 3.12], [3.20, 3.18, 3.19])
    ci = res.confidence_interval(0.95)
    assert v.n_pairs == 3 and v.mean_diff == pytest.approx(-0.10, abs=1e-12)
    assert v.sd_diff == pytest.approx(0.03, abs=1e-12)
    assert v.p_value == pytest.approx(res.pvalue, rel=1e-12) and (v.low, v.high) == pytest.approx((ci.low, ci.high), rel=1e-12)
    # by hand: t = -0.1 / (0.03 / sqrt 3) = -5.7735 with 2 df; t_{2, 0.975} = 4.3027
    assert v.p_value == pytest.approx(2 * stats.t.sf(0.1 / (0.03 / math.sqrt(3)), 2), rel=1e-9)
    assert v.p_value == pytest.approx(0.028714, abs=1e-6)
    assert (v.low, v.high) == pytest.approx((-0.1 - 4.302653 * 0.03 / math.sqrt(3), -0.1 + 4.302653 * 0.03 / math.sqrt(3)))
    assert v.verdict == "better" and v.unpaired == ()
    assert v.mde == pytest.approx(min_detectable_effect(3, 0.03)) and v.seeds_needed == 3
    worse = paired_verdict(REF, VAR)
    assert worse.verdict == "worse" and worse.mean_diff == pytest.approx(0.10) and worse.p_value == pytest.approx(v.p_value)


def test_mde_has_exactly_the_asked_power_and_tends_to_the_normal_formula():
    for n in (2, 3, 5, 10):
        m = min_detectable_effect(n, 0.05)
        assert paired_power(m, 0.05, n) == pytest.approx(0.8, abs=1e-9)
        assert paired_power(0.0, 0.05, n) == pytest.approx(0.05, abs=1e-12)  # no effect: the test's level
    # large n: (z_0.975 + z_0.8) sd / sqrt(n) (normal approximation)
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    gaps = [min_detectable_effect(n, 1.0) * math.sqrt(n) / z - 1 for n in (40, 400, 4000)]
    assert 0 < gaps[2] < gaps[1] < gaps[0] and gaps[2] < 3e-4  # the t correction, O(1/n)
    # few seeds: the noncentral t needs more than the normal-quantile shortcut
    assert min_detectable_effect(3, 1.0) > (stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) / math.sqrt(3)
    assert min_detectable_effect(3, 1.0) == pytest.approx(3.2640, abs=1e-3)
    assert min_detectable_effect(10, 1.0) == pytest.approx(0.9960, abs=1e-3)  # Cohen's d for n = 10


def test_seeds_needed_inverts_the_mde():
    for n in range(2, 9):
        m = min_detectable_effect(n, 0.04)
        assert seeds_needed(m * (1 + 1e-6), 0.04) == n
        assert seeds_needed(m * (1 - 1e-3), 0.04) == n + 1
    assert seeds_needed(0.0, 0.04) is None and seeds_needed(0.01, 0.0) == 2
    assert seeds_needed(1e-6, 1.0) is None  # beyond a million seeds


@pytest.mark.parametrize("n", [3, 5])
def test_simulated_studies_reject_at_the_mde_80_percent_and_at_zero_5_percent(n):
    rng = np.random.default_rng(1234 + n)
    sims, sd = 6000, 0.05
    mde = min_detectable_effect(n, sd)
    seed_effect = rng.normal(0, 0.3, (sims, n))  # shared by both arms of a seed: pairing removes it
    ref = 3.0 + seed_effect + rng.normal(0, sd / math.sqrt(2), (sims, n))
    for effect, want in ((mde, 0.8), (0.0, 0.05), (-mde, 0.8)):
        var = 3.0 + effect + seed_effect + rng.normal(0, sd / math.sqrt(2), (sims, n))
        p = stats.ttest_rel(var, ref, axis=1).pvalue
        rate = float(np.mean(p < 0.05))
        assert abs(rate - want) < 3.5 * math.sqrt(want * (1 - want) / sims), (effect, rate)
        for i in range(20):  # the verdict's own test agrees study by study
            v = paired_verdict(dict(enumerate(var[i])), dict(enumerate(ref[i])))
            assert v.p_value == pytest.approx(p[i], rel=1e-9)
            assert (v.verdict != "no detectable difference") == (p[i] < 0.05)


def test_no_verdict_with_one_seed_said_plainly():
    one = paired_verdict({0: 3.1, 1: 3.0}, {0: 3.2, 2: 3.3})
    assert one.verdict == "no verdict: one seed" and one.n_pairs == 1 and one.unpaired == (1, 2)
    assert one.mean_diff == pytest.approx(-0.1) and math.isnan(one.p_value) and math.isnan(one.mde)
    none = paired_verdict({0: 3.1}, {1: 3.2})
    assert none.verdict == "no verdict: no seed of both" and math.isnan(none.mean_diff)
    with pytest.raises(ValueError, match="no verdict: one seed"):
        plan_power(1, 0.05)


def test_identical_differences():
    same = paired_verdict({0: 3.0, 1: 3.1}, {0: 3.1, 1: 3.2})
    assert same.p_value == 0.0 and same.low == same.high == pytest.approx(-0.1) and same.mde == 0.0
    assert same.verdict == "better"
    zero = paired_verdict({0: 3.0, 1: 3.1}, {0: 3.0, 1: 3.1})
    assert zero.p_value == 1.0 and zero.verdict == "no detectable difference" and zero.seeds_needed is None


def test_plan_power_from_a_declared_spread():
    # the paper's coupled seed std 0.04 per arm, arms independent: sd of differences 0.04 sqrt 2
    assert diff_sd(0.04) == pytest.approx(0.04 * math.sqrt(2))
    assert diff_sd(0.04, correlation=0.75) == pytest.approx(0.04 * math.sqrt(0.5))
    est = plan_power(3, diff_sd(0.04), effect=0.02)
    assert est.mde == pytest.approx(min_detectable_effect(3, 0.04 * math.sqrt(2)))
    assert est.seeds_needed == seeds_needed(0.02, 0.04 * math.sqrt(2)) and est.seeds_needed > 3
    assert paired_power(0.02, est.diff_sd, est.seeds_needed) >= 0.8 > paired_power(0.02, est.diff_sd, est.seeds_needed - 1)
    assert plan_power(5, 0.05).seeds_needed is None
    # measured in a study, then planned: the same numbers
    v = paired_verdict(VAR, REF)
    assert plan_power(3, v.sd_diff, effect=v.mean_diff).mde == v.mde
    with pytest.raises(ValueError):
        diff_sd(0.04, correlation=2)
