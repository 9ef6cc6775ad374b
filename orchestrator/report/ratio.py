"""Token ratio at equal perplexity, as DESIGN.md "Token ratio" defines it.

Per scale and per non-reference variant v: target = v's final val perplexity (mean over
seeds) at its planned tokens D_c. The reference variant's extend runs (x1, x1.5, x2, ...,
each with its own full LR schedule) give final perplexity at several token counts; D* is
where that curve reaches the target, by monotone (PCHIP, Fritsch & Carlson 1980) interpolation
of log perplexity vs log tokens, after an isotonic fit so seed noise cannot make it
non-monotone. ratio = D* / D_c. A target outside the measured range is censored: the ratio
is reported as the bound (">3.0x": the reference never got there; "<1.0x": it was already
better), never extrapolated. The interval is a percentile bootstrap over seeds, parametric
because studies have 2-5 seeds: each (variant, extend) group's seed mean is redrawn from
its mean and the seed standard deviation pooled over the variant's groups (with the
uncertainty of that standard deviation), then D* is re-solved. Checked by simulation on
synthetic studies (orchestrator.report.synthetic, 250 repetitions): 100% coverage with 3
seeds (conservative: the target's own spread has 2 degrees of freedom), 97% with 5, where
resampling the seeds with replacement covers only ~75% (3 seeds) and ~85% (5 seeds).

Beside it: the single-run estimate (where the reference's longest eval curve crosses the
target; intermediate points of a run are not annealed, so this estimate is biased high and
labelled as such), the FLOP ratio D* x flops_per_token_ref / (D_c x flops_per_token_v), and
the wall-clock ratio (the reference's seconds to D*, interpolated log-log across its extend
runs, over v's seconds to D_c).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy.interpolate import PchipInterpolator
from scipy.optimize import isotonic_regression


@dataclass
class Estimate:
    """A ratio that may be censored: value is the bound when censored ('>' or '<')."""

    value: float | None
    censored: bool = False
    direction: str | None = None
    reason: str | None = None

    def display(self) -> str:
        if self.value is None:
            return "n/a"
        return f"{self.direction}{self.value:.2f}x" if self.censored else f"{self.value:.2f}x"


@dataclass
class RatioResult:
    """Token ratio of one variant against the reference at one scale, with its neighbours."""

    scale: str
    variant: str
    reference: str
    token_ratio: Estimate
    ci_low: float | None = None
    ci_high: float | None = None
    ci_note: str | None = None
    ci_low_censored: bool = False
    ci_high_censored: bool = False
    # Which bound an interval end sits on: '<' (the reference's x1 run was already better),
    # '>' (its longest run never got there) or '' (inside the measured range).
    ci_low_side: str = ""
    ci_high_side: str = ""
    n_boot: int = 0
    boot_censored_frac: float | None = None
    target_ppl: float | None = None
    target_tokens: float | None = None
    tokens_star: float | None = None
    ref_extends: list[float] = field(default_factory=list)
    single_run: Estimate = field(default_factory=lambda: Estimate(None))
    single_run_source: str | None = None
    flop_ratio: Estimate = field(default_factory=lambda: Estimate(None))
    wall_ratio: Estimate = field(default_factory=lambda: Estimate(None))

    def interval_display(self) -> str:
        if self.ci_low is None:
            return self.ci_note or "n/a"
        if self.boot_censored_frac == 1.0:
            return "censored in every draw"
        # An end that sits on the measured range's bound is itself censored.
        lo = f"{self.ci_low_side}{self.ci_low:.2f}"
        hi = f"{self.ci_high_side}{self.ci_high:.2f}"
        return f"[{lo}, {hi}]"

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("token_ratio", "single_run", "flop_ratio", "wall_ratio"):
            d[k]["display"] = getattr(self, k).display()
        d["interval_display"] = self.interval_display()
        return d


def solve_tokens(tokens: np.ndarray, ppl: np.ndarray, target: float) -> tuple[float, str | None]:
    """Tokens at which the monotone log-log interpolant of (tokens, ppl) reaches `target`.

    tokens, ppl: shape (k,), one point per extend level (any order, k >= 2, tokens distinct).
    Returns (D*, None) inside the measured range, (max tokens, '>') when even the most tokens
    stay above target, (min tokens, '<') when the fewest tokens are already at or below it.
    """
    d, side = solve_tokens_batch(tokens, np.asarray(ppl, float)[None, :], np.array([target]))
    return float(d[0]), (side[0] or None)


def solve_tokens_batch(tokens: np.ndarray, ppl: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """solve_tokens for many draws at once (the bootstrap): ppl shape (n, k), target shape (n,).

    Returns D* shape (n,) and the censoring side shape (n,): '>' , '<' or '' (inside).
    One PCHIP (scipy, all draws as columns) and a vectorised bisection on each draw's cubic
    piece replace n interpolator builds and n scalar root searches.
    """
    order = np.argsort(tokens)
    d = np.asarray(tokens, float)[order]
    x = np.log(d)
    y = np.log(np.asarray(ppl, float)[:, order])
    # Isotonic (non-increasing) fit only where seed noise broke monotonicity.
    for r in np.nonzero((np.diff(y, axis=1) > 0).any(axis=1))[0]:
        y[r] = isotonic_regression(y[r], increasing=False).x
    t = np.log(np.asarray(target, float))
    out = np.empty(len(t))
    side = np.full(len(t), "", dtype="<U1")
    hi, lo = t < y[:, -1], t >= y[:, 0]
    out[hi], side[hi] = d[-1], ">"
    out[lo & ~hi], side[lo & ~hi] = d[0], "<"
    inside = np.nonzero(~hi & ~lo)[0]
    if len(inside):
        yi, ti = y[inside], t[inside]
        # Segment whose right end is the first point at or below the target: y[i] > t >= y[i+1].
        seg = np.argmax(yi <= ti[:, None], axis=1) - 1
        coef = PchipInterpolator(x, yi.T, axis=0).c  # (4, k-1, n): cubic in h = u - x[seg]
        c = coef[:, seg, np.arange(len(inside))]
        a, b = np.zeros(len(inside)), x[seg + 1] - x[seg]
        for _ in range(60):  # PCHIP is monotone on each piece, so bisection brackets the root
            m = (a + b) / 2
            above = ((c[0] * m + c[1]) * m + c[2]) * m + c[3] > ti
            a, b = np.where(above, m, a), np.where(above, b, m)
        out[inside] = np.exp(x[seg] + (a + b) / 2)
    return out, side


def _ratio_from(tokens, ppl, target, target_tokens) -> Estimate:
    d, direction = solve_tokens(tokens, ppl, target)
    return Estimate(d / target_tokens, direction is not None, direction)


def curve_crossing(steps: np.ndarray, ppl: np.ndarray, target: float) -> tuple[float, str | None]:
    """Tokens where an eval curve (steps ascending, shape (k,)) first reaches `target`.

    Uses the running minimum (the best checkpoint so far) and log-log linear interpolation
    between the two eval points that bracket the target. Censored like solve_tokens.
    """
    best = np.minimum.accumulate(np.asarray(ppl, float))
    hit = np.nonzero(best <= target)[0]
    if len(hit) == 0:
        return float(steps[-1]), ">"
    j = int(hit[0])
    if j == 0:
        return float(steps[0]), "<"
    x0, x1 = np.log(steps[j - 1]), np.log(steps[j])
    y0, y1 = np.log(best[j - 1]), np.log(best[j])
    u = (np.log(target) - y0) / (y1 - y0)
    return float(np.exp(x0 + u * (x1 - x0))), None


def token_ratio(
    scale: str,
    variant: str,
    reference: str,
    finals: pd.DataFrame,
    curves: pd.DataFrame | None = None,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    rng: np.random.Generator | None = None,
) -> RatioResult:
    """Token ratio of `variant` vs `reference` at `scale` from per-run finals (curves.run_finals).

    curves: curve_stats output for val/ppl (for the single-run estimate); optional.
    Never raises for missing data: the result's `reason` says why a value is None.
    """
    rng = rng or np.random.default_rng(0)
    f = finals[(finals["scale"] == scale) & finals["complete"]]
    tgt = f[(f["variant"] == variant) & (f["extend"] == 1.0)]
    ref = f[f["variant"] == reference]
    res = RatioResult(scale, variant, reference, Estimate(None))
    if tgt.empty:
        res.token_ratio.reason = f"no finished {variant} run at scale {scale}"
        return res
    if ref.empty:
        res.token_ratio.reason = f"no finished {reference} run at scale {scale}"
        return res
    res.target_ppl = float(tgt["final_ppl"].mean())
    res.target_tokens = d_c = float(tgt["tokens"].mean())
    groups = {e: g["final_ppl"].to_numpy(float) for e, g in ref.groupby("extend")}
    g_tokens = ref.groupby("extend")["tokens"].mean()
    res.ref_extends = sorted(float(e) for e in groups)
    _single_run(res, ref, curves)
    if len(groups) < 2:
        res.token_ratio.reason = (
            f"no {reference} extend runs at scale {scale} (only x{res.ref_extends[0]:g}): "
            "the token ratio needs the reference trained at several lengths"
        )
        return res
    tokens = g_tokens.loc[list(groups)].to_numpy(float)
    means = np.array([g.mean() for g in groups.values()])
    res.token_ratio = _ratio_from(tokens, means, res.target_ppl, d_c)
    d_star = res.token_ratio.value * d_c
    res.tokens_star = d_star
    fpt_ref, fpt_v = ref["flops_per_token"].mean(), tgt["flops_per_token"].mean()
    if np.isfinite(fpt_ref) and np.isfinite(fpt_v):
        tr = res.token_ratio
        res.flop_ratio = Estimate(tr.value * fpt_ref / fpt_v, tr.censored, tr.direction)
    res.wall_ratio = _wall_ratio(res, ref, tgt, d_star)

    # Bootstrap over seeds (see module docstring): draw seed means, re-solve, take percentiles.
    ref_groups = [g for g in groups.values()]
    tgt_ppl = tgt["final_ppl"].to_numpy(float)
    ref_sd, tgt_sd = _pooled_sd(ref_groups), _pooled_sd([tgt_ppl])
    if ref_sd is None and tgt_sd is None:
        res.ci_note = "one seed per run group: no bootstrap interval"
        return res
    notes = []
    if ref_sd is None or tgt_sd is None:
        lone, other = (reference, variant) if ref_sd is None else (variant, reference)
        notes.append(f"{lone} has one seed per run: its seed spread is taken from {other}")
        ref_sd, tgt_sd = ref_sd or tgt_sd, tgt_sd or ref_sd
    ref_draws = _mean_draws(ref_groups, *ref_sd, n_boot, rng)
    tgt_draws = _mean_draws([tgt_ppl], *tgt_sd, n_boot, rng)[:, 0]
    d_draws, sides = solve_tokens_batch(tokens, ref_draws, tgt_draws)
    boot, cens = d_draws / d_c, sides != ""
    a = (1.0 - level) / 2.0
    res.ci_low, res.ci_high = (float(v) for v in np.quantile(boot, [a, 1.0 - a], method="inverted_cdf"))
    # An end is a bound only when the draw at that percentile is itself censored (a few
    # censored draws beyond an interior percentile do not make it one).
    res.ci_low_side = _end_side(sides, boot == res.ci_low, first="<")
    res.ci_high_side = _end_side(sides, boot == res.ci_high, first=">")
    res.ci_low_censored, res.ci_high_censored = res.ci_low_side != "", res.ci_high_side != ""
    res.n_boot = n_boot
    res.boot_censored_frac = float(cens.mean())
    if cens.any():
        notes.append(f"{cens.mean():.0%} of bootstrap draws censored at the measured range")
    res.ci_note = "; ".join(notes) or None
    return res


def _end_side(sides: np.ndarray, at_end: np.ndarray, first: str) -> str:
    """Censoring mark of an interval end: the side of the censored draws equal to it (the
    percentile is one of the draws), else ''. An end can carry either mark: when nearly every
    draw is below the measured range, the upper end is '<' too."""
    marks = set(sides[at_end]) - {""}
    return first if first in marks else (marks.pop() if marks else "")


def _pooled_sd(groups: list[np.ndarray]) -> tuple[float, int] | None:
    """Pooled within-group seed std of log perplexity and its degrees of freedom; None without any."""
    dof = sum(len(g) - 1 for g in groups)
    if dof == 0:
        return None
    ss = sum(float(((np.log(g) - np.log(g).mean()) ** 2).sum()) for g in groups)
    return float(np.sqrt(ss / dof)), dof


def _mean_draws(groups: list[np.ndarray], sd: float, dof: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Draws of each group's seed mean, shape (n_boot, len(groups)).

    sd* = sd * sqrt(dof / chi2_dof) carries the uncertainty of the spread itself (few seeds), then
    mean_g* = mean_g * exp(sd* Z / sqrt(n_g)) (sd of log perplexity, so draws stay positive). Resampling 3 seeds with replacement instead would
    understate the spread ((n-1)/n variance, discrete means): ~75% coverage for a 95% interval.
    """
    s = sd * np.sqrt(dof / rng.chisquare(dof, n_boot))
    return np.stack([g.mean() * np.exp(s * rng.standard_normal(n_boot) / np.sqrt(len(g))) for g in groups], axis=1)


def _wall_ratio(res: RatioResult, ref: pd.DataFrame, tgt: pd.DataFrame, d_star: float) -> Estimate:
    """Reference seconds to D* (log-log interpolation across extend runs) / variant seconds to D_c."""
    w = ref.groupby("extend")[["tokens", "final_wall_s"]].mean().dropna()
    t_v = tgt["final_wall_s"].mean()
    if len(w) < 2 or not np.isfinite(t_v) or t_v <= 0:
        return Estimate(None, reason="time/wall_s missing")
    w = w.sort_values("tokens")
    secs = np.exp(np.interp(np.log(d_star), np.log(w["tokens"]), np.log(w["final_wall_s"])))
    tr = res.token_ratio
    return Estimate(float(secs / t_v), tr.censored, tr.direction)


def _single_run(res: RatioResult, ref: pd.DataFrame, curves: pd.DataFrame | None) -> None:
    """The reference's longest run's seed-mean eval curve, read where it crosses the target."""
    if curves is None or curves.empty:
        res.single_run.reason = "no eval curves"
        return
    e = max(res.ref_extends)
    c = curves[(curves["scale"] == res.scale) & (curves["variant"] == res.reference) & (curves["extend"] == e)]
    c = c.sort_values("step")
    if c.empty:
        res.single_run.reason = f"no val/ppl curve for {res.reference} x{e:g}"
        return
    d, direction = curve_crossing(c["step"].to_numpy(float), c["mean"].to_numpy(float), res.target_ppl)
    res.single_run = Estimate(d / res.target_tokens, direction is not None, direction)
    res.single_run_source = (
        f"single-run curve estimate: eval curve of {res.reference} x{e:g} (mean of {int(c['n_seeds'].max())} seeds); "
        "intermediate checkpoints are not annealed, so it overstates the tokens needed"
    )
