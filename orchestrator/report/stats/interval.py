"""Confidence interval of the token ratio: the inversion of a seed-paired t-test.

Setting (ratio.py): the reference's final loss (ln perplexity, nats/token) at its extend
lengths D_1 < ... < D_k, the variant's final loss at its planned tokens D_c, seeds s = 1..n.
M(x) is the reference's monotone seed-mean curve in x = ln D (solve.monotone_curve); the
token ratio is D*/D_c where M reaches the variant's seed-mean loss.

Paired (the default: same seed = same data order and the same initial weights for every
parameter the variants share). Seed s gives, at any x,

    d_s(x) = L_v,s - M(x) - dev_s(x),

dev_s(x) being the linear interpolation in x of seed s's deviations from the reference's
per-length seed means, so that mean_s d_s(x) = mean L_v - M(x). The interval is the set of D
in [D_1, D_k] where the two-sided paired t-test of "variant at D_c and reference at D have
equal expected loss" does not reject,

    |mean d(x)| <= t_{n-1, (1+level)/2} * sd_s(d_s(x*)) / sqrt(n),

At the true D the d_s are independent across seeds with mean zero (up to interpolation
error), so T ~ t_{n-1} and the set covers the truth with probability `level` under normal
seed noise at any noise level; what the seeds share (data order, init) cancels in d_s. The
standard error is taken at the point estimate x* (the root of mean d, or the range's end it
is censored at), so the set is one interval around x* (with a spread re-estimated at every
x, 2 to 5 seeds make it wander and the accepted set can exclude x*).

Unpaired fallback, when fewer than 2 seeds have the variant's run and the reference's run at
every length: Welch's t with Satterthwaite degrees of freedom, the reference's spread pooled
over its lengths (a variant with one seed borrows the reference's spread, and vice versa;
the note says so).

Ends: the set is clipped to the measured range; an end on D_1 or D_k is censored ('<' /
'>': the set continues beyond the range), and a set that lies entirely beyond the range is
reported as both ends '>' at D_k (or both '<' at D_1), never extrapolated.

Coverage, measured by tests/orchestrator/report/test_coverage.py (slow; 400 repetitions per
cell of synthetic finals with a known ratio through token_ratio; seed std of final loss
sigma, half of its variance shared by the runs of one seed; the reference's loss falls 0.64
nats from x1 to x3, as steeply as in the CPU study's 0.6 to 1.2):

    sigma  seeds  truth 1.8x (inside x1..x3)  truth 4.0x (beyond: censored '>')
    0.03   3      95.8%                        100%
    0.03   5      93.8%                        100%
    0.10   3      95.2%                        100%
    0.10   5      95.8%                        100%

Unpaired (Welch, sigma 0.1, 3 seeds, truth 1.8x): 95.8%. For comparison, in the same cells
a percentile bootstrap that resamples the seeds jointly covers 72% (3 seeds) and 85% (5):
3 seeds give at most 10 distinct resamples and a spread (n-1)/n too small. A truth beyond
the range is always covered by the open end, which is why that column reads 100%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from orchestrator.report.stats.solve import monotone_curve

# Measured coverage of the nominal 95% interval, (seed std of final loss in nats, seeds,
# true ratio) -> fraction of 400 repetitions covering it (module docstring; test_coverage.py
# checks these numbers against the simulation it runs).
COVERAGE: dict[tuple[float, int, float], float] = {
    (0.03, 3, 1.8): 0.9575,
    (0.03, 5, 1.8): 0.9375,
    (0.1, 3, 1.8): 0.9525,
    (0.1, 5, 1.8): 0.9575,
    (0.03, 3, 4.0): 1.0,
    (0.03, 5, 4.0): 1.0,
    (0.1, 3, 4.0): 1.0,
    (0.1, 5, 4.0): 1.0,
}


@dataclass
class Runs:
    """Finished runs of one variant at one scale as arrays, shape (n,) each (curves.run_finals
    columns seed, extend, tokens, final_ppl, flops_per_token, final_wall_s)."""

    seed: np.ndarray
    extend: np.ndarray
    tokens: np.ndarray
    ppl: np.ndarray
    fpt: np.ndarray
    wall: np.ndarray

    @classmethod
    def of(cls, df: pd.DataFrame) -> Runs:
        cols = ("seed", "extend", "tokens", "final_ppl", "flops_per_token", "final_wall_s")
        return cls(*(df[c].to_numpy(np.int64 if c == "seed" else float) for c in cols))

    def where(self, mask: np.ndarray) -> Runs:
        return Runs(*(a[mask] for a in (self.seed, self.extend, self.tokens, self.ppl, self.fpt, self.wall)))

    def __len__(self) -> int:
        return len(self.seed)

    def levels(self) -> tuple[np.ndarray, np.ndarray]:
        """(extend levels, mean tokens per level), both in token order."""
        ext = np.unique(self.extend)
        tokens = np.array([self.tokens[self.extend == e].mean() for e in ext])
        order = np.argsort(tokens)
        return ext[order], tokens[order]

    def level_means(self, values: np.ndarray) -> np.ndarray:
        """Mean of `values` (shape (n,)) per extend level, in token order (NaN ignored)."""
        ext, _ = self.levels()
        return np.array([np.nanmean(values[self.extend == e]) if np.isfinite(values[self.extend == e]).any() else np.nan for e in ext])


@dataclass
class Interval:
    """A token-ratio interval (ratio units, D / D_c) with its censoring marks and method."""

    low: float | None = None
    high: float | None = None
    low_side: str = ""  # '<': the set continues below the reference's shortest run
    high_side: str = ""  # '>': the set continues beyond the reference's longest run
    method: str = ""
    n: int = 0
    note: str | None = None


def ratio_interval(ref: Runs, tgt: Runs, d_c: float, level: float = 0.95) -> Interval:
    """The token ratio's `level` interval from finished runs of one scale.

    ref: the reference's runs, at least 2 extend levels; tgt: the variant's planned (x1) runs;
    d_c: the variant's tokens. Paired over the seeds both have (every reference length
    present), else Welch (module doc). Returns an Interval with low = high = None and a note
    when no seed spread exists.
    """
    ext, tokens = ref.levels()
    x = np.log(tokens)
    loss, seeds = _loss_table(ref, ext)
    v_seed, v_loss = _seed_means(tgt.seed, np.log(tgt.ppl))
    complete = seeds[~np.isnan(loss).any(axis=1)]
    paired = np.intersect1d(v_seed, complete)
    if len(paired) >= 2:
        out = _paired(x, loss[np.searchsorted(seeds, paired)], v_loss[np.searchsorted(v_seed, paired)], level)
        left = sorted(set(np.union1d(v_seed, seeds).tolist()) - set(paired.tolist()))
        if left:
            out.note = f"seed(s) {', '.join(map(str, left))} not paired (a run is missing): left out of the interval"
    else:
        out = _welch(x, loss, v_loss, level)
        if out.method:
            out.note = "; ".join(filter(None, ["seeds do not pair (fewer than 2 seeds have every run): unpaired interval", out.note]))
    if out.low is not None and out.high is not None:
        out.low, out.high = out.low / d_c, out.high / d_c
    return out


def _seed_means(seed: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique seeds, mean value per seed): duplicates of one seed are averaged."""
    u, inv = np.unique(seed, return_inverse=True)
    return u, np.bincount(inv, values) / np.bincount(inv)


def _loss_table(ref: Runs, ext: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(loss table shape (seeds, levels), NaN for a missing run; sorted seeds) of the reference."""
    seeds = np.unique(ref.seed)
    table = np.full((len(seeds), len(ext)), np.nan)
    loss = np.log(ref.ppl)
    for j, e in enumerate(ext):
        s, m = _seed_means(ref.seed[ref.extend == e], loss[ref.extend == e])
        table[np.searchsorted(seeds, s), j] = m
    return table, seeds


def _paired(x: np.ndarray, r: np.ndarray, v: np.ndarray, level: float) -> Interval:
    """r: reference loss, shape (n, k) (seeds x lengths); v: variant loss, shape (n,)."""
    n = len(v)
    curve = monotone_curve(x, r.mean(axis=0))
    dev = r - r.mean(axis=0)
    crit = float(stats.t.ppf((1 + level) / 2, n - 1))

    def se_crit(u: float) -> tuple[float, float]:
        e = (v - v.mean()) - np.array([np.interp(u, x, row) for row in dev])
        return float(e.std(ddof=1) / np.sqrt(n)), crit

    return _invert(x[0], x[-1], lambda u: float(v.mean() - curve(u)), se_crit) | Interval(method=f"paired t over {n} seeds", n=n)


def _welch(x: np.ndarray, loss: np.ndarray, v: np.ndarray, level: float) -> Interval:
    """Unpaired: Welch's t of the variant's mean loss against the reference curve's.

    loss: the reference's table (seeds x lengths, NaN for a missing run); v: variant loss per seed.
    """
    sizes = (~np.isnan(loss)).sum(axis=0).astype(float)
    dof_r = int((sizes - 1).clip(min=0).sum())
    ss_r = float(np.nansum((loss - np.nanmean(loss, axis=0)) ** 2))
    n_v = len(v)
    if dof_r == 0 and n_v < 2:
        return Interval(note="one seed per run group: no interval")
    var_r = ss_r / dof_r if dof_r else float(np.var(v, ddof=1))
    var_v = float(np.var(v, ddof=1)) if n_v > 1 else var_r
    note = None
    if dof_r == 0 or n_v < 2:
        note = "one seed per run on one side: its seed spread is taken from the other"
        dof_r = dof_r or n_v - 1
    dof_v = n_v - 1 if n_v > 1 else dof_r
    curve = monotone_curve(x, np.nanmean(loss, axis=0))

    def se_crit(u: float) -> tuple[float, float]:
        a, b = var_v / n_v, var_r / float(np.interp(u, x, sizes))
        dof = (a + b) ** 2 / (a**2 / dof_v + b**2 / dof_r) if a + b > 0 else dof_v
        return float(np.sqrt(a + b)), float(stats.t.ppf((1 + level) / 2, dof))

    return _invert(x[0], x[-1], lambda u: float(v.mean() - curve(u)), se_crit) | Interval(method="Welch t (unpaired)", n=n_v, note=note)


def _invert(x_lo: float, x_hi: float, d: Callable[[float], float], se_crit: Callable[[float], tuple[float, float]]) -> _Ends:
    """The set {x in [x_lo, x_hi]: |d(x)| <= crit se} as tokens, se and crit taken at the estimate.

    d(x) = mean variant loss - M(x) does not decrease with x (M is monotone). se and crit are
    evaluated once, at the point estimate x* (the root of d, or the range's end it is censored
    at): with 2 to 5 seeds the per-x spread estimate wanders, and a test with its own se at
    every x can accept a set that excludes x*.
    """
    d_lo, d_hi = d(x_lo), d(x_hi)
    x_star = x_lo if d_lo >= 0 else x_hi if d_hi <= 0 else _root(d, x_lo, x_hi, 0.0)
    se, crit = se_crit(x_star)
    w = crit * se
    if d_lo > w:  # the variant is worse than the reference's shortest run, significantly
        return _Ends(np.exp(x_lo), np.exp(x_lo), "<", "<")
    if d_hi < -w:  # better than its longest run
        return _Ends(np.exp(x_hi), np.exp(x_hi), ">", ">")
    lo = x_lo if d_lo >= -w else _root(d, x_lo, x_hi, -w)
    hi = x_hi if d_hi <= w else _root(d, x_lo, x_hi, w)
    return _Ends(np.exp(lo), np.exp(hi), "<" if lo == x_lo else "", ">" if hi == x_hi else "")


def _root(d: Callable[[float], float], a: float, b: float, level: float) -> float:
    """x in [a, b] where the non-decreasing d crosses `level` (d(a) < level < d(b)), by bisection."""
    for _ in range(50):
        m = (a + b) / 2
        a, b = (m, b) if d(m) < level else (a, m)
    return (a + b) / 2


@dataclass
class _Ends:
    """Interval ends in tokens (not yet divided by D_c); `|` merges them into an Interval."""

    low: float
    high: float
    low_side: str
    high_side: str

    def __or__(self, other: Interval) -> Interval:
        return Interval(float(self.low), float(self.high), self.low_side, self.high_side, other.method, other.n, other.note)
