"""A verdict with its power: is a variant's gap to the reference distinguishable from seed noise?

Runs of one seed share data order and initial weights (DESIGN.md, "Conventions"), so the
comparison is paired by seed: for each seed s with a final loss of both arms,

    d_s = L_variant,s - L_reference,s      (final val loss, nats/token; < 0: variant better)

and the test is Student's paired t-test on the n differences (``scipy.stats.ttest_rel``):
mean, its 95% interval mean +- t_{n-1, 0.975} sd/sqrt(n), and the two-sided p-value.

Power (Cohen 1988, "Statistical Power Analysis for the Behavioral Sciences", ch. 2): with
normal differences of true spread sigma, the t statistic is noncentral-t with n - 1 degrees
of freedom and noncentrality delta sqrt(n) / sigma, so the power of the two-sided level-alpha
test is exactly

    power(delta) = P(T > t_crit) + P(T < -t_crit),   T ~ nct(n - 1, delta sqrt(n) / sigma)

(``scipy.stats.nct``; no normal approximation). The minimum detectable effect (MDE) is the
delta with power(delta) = 80% at alpha = 0.05, and `seeds_needed` the smallest n whose power
at a given gap reaches 80%. Post hoc, sigma is the measured sd of the paired differences, a
plug-in: with 2-3 seeds that sd is itself uncertain, and "seeds needed to detect the
observed gap" inherits the noise of the observed gap (Hoenig & Heisey 2001); the numbers
say how fine the study's resolution was, not that an effect exists. `plan_power` gives the
same estimate before a study from a declared or previously measured seed spread.

Pure: numbers in, numbers out (no MLflow).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

ALPHA, POWER = 0.05, 0.8
MAX_SEEDS = 1_000_000


def paired_power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` to detect a mean difference
    ``effect`` (nats) with n pairs whose differences have sd ``sd`` (noncentral t, exact for
    normal differences). n >= 2; sd == 0 gives 1 for a nonzero effect."""
    if n < 2:
        raise ValueError(f"a paired t-test needs n >= 2 pairs, got {n}")
    if sd == 0:
        return 1.0 if effect else alpha
    df, nc = n - 1, abs(effect) * math.sqrt(n) / sd
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    # P(T > c) + P(T < -c) with T ~ nct(df, nc); the lower tail as P(T' > c), T' ~ nct(df, -nc):
    # scipy's nct.cdf returns NaN for some such tails (df 1-4, |nc| > 8), its sf does not.
    return float(stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc))


def min_detectable_effect(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest |mean difference| (units of ``sd``, e.g. nats) the paired t-test detects with
    probability ``power`` at level ``alpha`` with n pairs (solves `paired_power` = power)."""
    if n < 2:
        raise ValueError(f"a paired t-test needs n >= 2 pairs, got {n}")
    if sd == 0:
        return 0.0
    hi = sd
    while paired_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda e: paired_power(e, sd, n, alpha) - power, 0.0, hi, xtol=1e-12 * hi, rtol=1e-12))


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Smallest n >= 2 of seed pairs whose paired t-test detects ``effect`` with ``power``;
    None for a zero effect (nothing to detect) or beyond MAX_SEEDS."""
    if effect == 0:
        return None
    if sd == 0:
        return 2
    lo, hi = 1, 2  # power(lo) < target <= power(hi), lo = 1 standing for "not enough"
    while paired_power(effect, sd, hi, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > MAX_SEEDS:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if paired_power(effect, sd, mid, alpha) >= power else (mid, hi)
    return hi


@dataclass(frozen=True)
class PairedVerdict:
    """The seed-paired comparison of one variant with the reference (one scale, equal tokens).

    n_pairs: seeds with both finals; mean_diff: mean of variant - reference (nats; < 0 is
    better); low, high: its (1 - alpha) t interval; p_value: two-sided paired t-test; sd_diff:
    sd of the paired differences; mde: minimum detectable |difference| at ``power`` and
    ``alpha`` with these seeds and sd_diff; seeds_needed: pairs to detect |mean_diff| at that
    power (None: zero gap); verdict: "better", "worse", "no detectable difference", or "no
    verdict: ..." with why (then the numbers are NaN); unpaired: seeds of only one arm.
    """

    n_pairs: int
    mean_diff: float
    low: float
    high: float
    p_value: float
    sd_diff: float
    mde: float
    seeds_needed: int | None
    verdict: str
    unpaired: tuple[int, ...] = ()


def paired_verdict(
    variant: Mapping[int, float], reference: Mapping[int, float], alpha: float = ALPHA, power: float = POWER
) -> PairedVerdict:
    """`PairedVerdict` of per-seed final losses (seed -> nats/token) of a variant and the reference.

    Fewer than 2 common seeds: "no verdict: one seed" (or "no verdict: no seed of both"),
    with NaN numbers. Identical differences (sd 0): p = 0 and a point interval for a
    nonzero mean, p = 1 for a zero one.
    """
    common = sorted(set(variant) & set(reference))
    unpaired = tuple(sorted(set(variant) ^ set(reference)))
    nan = math.nan
    if len(common) < 2:
        why = "no verdict: one seed" if common else "no verdict: no seed of both"
        mean = float(variant[common[0]] - reference[common[0]]) if common else nan
        return PairedVerdict(len(common), mean, nan, nan, nan, nan, nan, None, why, unpaired)
    v = np.array([variant[s] for s in common], float)
    r = np.array([reference[s] for s in common], float)
    d = v - r
    n, mean, sd = len(d), float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        p, low, high = (0.0 if mean else 1.0), mean, mean
    else:
        res = stats.ttest_rel(v, r)
        ci = res.confidence_interval(1 - alpha)
        p, low, high = float(res.pvalue), float(ci.low), float(ci.high)
    verdict = "no detectable difference" if p >= alpha else "better" if mean < 0 else "worse"
    return PairedVerdict(
        n, mean, low, high, p, sd, min_detectable_effect(n, sd, alpha, power), seeds_needed(mean, sd, alpha, power), verdict, unpaired
    )


@dataclass(frozen=True)
class PowerEstimate:
    """What a study of ``n_seeds`` paired seeds can resolve: the sd of paired differences
    used (nats), the MDE at ``power``/``alpha``, and, for a given ``effect``, the seeds
    needed to detect it (None without an effect)."""

    n_seeds: int
    diff_sd: float
    mde: float
    effect: float | None
    seeds_needed: int | None


def diff_sd(seed_sd: float, correlation: float = 0.0) -> float:
    """sd of paired differences from the per-arm seed sd: seed_sd sqrt(2 (1 - rho)), rho the
    correlation of the two arms' finals across seeds (0: independent; pairing helps when > 0)."""
    if seed_sd < 0 or not -1 <= correlation <= 1:
        raise ValueError(f"need seed_sd >= 0 and correlation in [-1, 1], got {seed_sd}, {correlation}")
    return seed_sd * math.sqrt(2 * (1 - correlation))


def plan_power(n_seeds: int, sd: float, effect: float | None = None, alpha: float = ALPHA, power: float = POWER) -> PowerEstimate:
    """The power estimate for ``qkstudy plan``: ``sd`` is the declared or previously measured
    sd of paired differences (nats; `diff_sd` converts a per-arm seed spread). Raises
    ValueError for n_seeds < 2 ("no verdict: one seed") or sd < 0."""
    if n_seeds < 2:
        raise ValueError(f"no verdict: one seed (a paired test needs at least 2 seeds, the study has {n_seeds})")
    if sd < 0:
        raise ValueError(f"the seed spread must be >= 0, got {sd}")
    needed = seeds_needed(effect, sd, alpha, power) if effect is not None else None
    return PowerEstimate(n_seeds, sd, min_detectable_effect(n_seeds, sd, alpha, power), effect, needed)
