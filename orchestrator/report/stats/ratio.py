"""Token ratio at equal perplexity, as DESIGN.md "Token ratio" defines it.

Per scale and per non-reference variant v: target = v's final val perplexity (geometric mean
over seeds, i.e. the mean loss, as the interval uses) at its planned tokens D_c. The reference's extend runs (x1, x1.5, x2, ..., each with
its own full LR schedule) give final perplexity at several token counts; D* is where their
monotone log-log curve reaches the target (solve.py). ratio = D* / D_c. A target outside the
measured range is censored: the ratio is reported as the bound (">3.0x": the reference never
got there; "<1.0x": it was already better), never extrapolated. The interval inverts a
seed-paired t-test (interval.py, with its method and measured coverage).

Beside it: the single-run curve estimate (where the reference's longest run's seed-mean eval
curve crosses the target; its intermediate points are read before that run's LR has decayed,
so it can differ from the extend estimate either way: on the CPU study it was lower in every
row), flagged when it disagrees with the extend estimate in sign (relative to 1x) or lies
outside its interval; the FLOP ratio D* x flops_per_token_ref / (D_c x flops_per_token_v);
and the wall-clock ratio (the reference's seconds to D*, interpolated log-log across its
extend runs, over v's seconds to D_c).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from orchestrator.report.stats.interval import Runs, ratio_interval
from orchestrator.report.stats.solve import curve_crossing, solve_tokens


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

    def side_of_one(self) -> int | None:
        """+1 above 1x, -1 below, 0 at it; None when a censored bound leaves the side open."""
        if self.value is None:
            return None
        if not self.censored:
            return int(np.sign(round(self.value - 1.0, 9)))
        if self.direction == "<" and self.value <= 1.0:
            return -1
        if self.direction == ">" and self.value >= 1.0:
            return 1
        return None


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
    ci_method: str | None = None
    ci_n: int = 0
    ci_low_censored: bool = False
    ci_high_censored: bool = False
    # Which bound an interval end sits on: '<' (the set continues below the reference's x1
    # run), '>' (beyond its longest run) or '' (inside the measured range).
    ci_low_side: str = ""
    ci_high_side: str = ""
    target_ppl: float | None = None
    target_tokens: float | None = None
    tokens_star: float | None = None
    ref_extends: list[float] = field(default_factory=list)
    single_run: Estimate = field(default_factory=lambda: Estimate(None))
    single_run_source: str | None = None
    single_run_flag: str | None = None
    flop_ratio: Estimate = field(default_factory=lambda: Estimate(None))
    wall_ratio: Estimate = field(default_factory=lambda: Estimate(None))

    def interval_display(self) -> str:
        if self.ci_low is None:
            return self.ci_note or "n/a"
        # An end that sits on the measured range's bound is itself censored.
        return f"[{self.ci_low_side}{self.ci_low:.2f}, {self.ci_high_side}{self.ci_high:.2f}]"

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("token_ratio", "single_run", "flop_ratio", "wall_ratio"):
            d[k]["display"] = getattr(self, k).display()
        d["interval_display"] = self.interval_display()
        return d


def token_ratio(
    scale: str, variant: str, reference: str, finals: pd.DataFrame, curves: pd.DataFrame | None = None, *, level: float = 0.95
) -> RatioResult:
    """Token ratio of `variant` vs `reference` at `scale` from per-run finals (curves.run_finals).

    finals: columns scale, variant, seed, extend, tokens, final_ppl, complete, flops_per_token,
    final_wall_s. curves: curve_stats output for val/ppl (for the single-run estimate); optional.
    level: of the interval (interval.ratio_interval). Never raises for missing data: the
    result's `reason` (or `ci_note`) says why a value is None.
    """
    f = finals[(finals["scale"].to_numpy() == scale) & finals["complete"].to_numpy(bool)]
    runs, names = Runs.of(f), f["variant"].to_numpy()
    tgt, ref = runs.where((names == variant) & (runs.extend == 1.0)), runs.where(names == reference)
    res = RatioResult(scale, variant, reference, Estimate(None))
    for who, r in ((variant, tgt), (reference, ref)):
        if not len(r):
            res.token_ratio.reason = f"no finished {who} run at scale {scale}"
            return res
    # geometric means (mean loss), as the interval uses: the point estimate sits inside it
    res.target_ppl = target = float(np.exp(np.log(tgt.ppl).mean()))
    res.target_tokens = d_c = float(tgt.tokens.mean())
    res.ref_extends = sorted(float(e) for e in np.unique(ref.extend))
    _single_run(res, curves, target, d_c)
    if len(res.ref_extends) < 2:
        res.token_ratio.reason = (
            f"no {reference} extend runs at scale {scale} (only x{res.ref_extends[0]:g}): "
            "the token ratio needs the reference trained at several lengths"
        )
        return res
    _point_estimate(res, ref, target, d_c)
    _costs(res, ref, tgt)
    _interval(res, ref, tgt, d_c, level)
    res.single_run_flag = single_run_disagreement(res)
    return res


def _point_estimate(res: RatioResult, ref: Runs, target: float, d_c: float) -> None:
    """D* from the reference's seed-geometric-mean final perplexity (mean loss) per extend level."""
    _, tokens = ref.levels()
    d, direction = solve_tokens(tokens, np.exp(ref.level_means(np.log(ref.ppl))), target)
    res.token_ratio = Estimate(d / d_c, direction is not None, direction)
    res.tokens_star = d


def _costs(res: RatioResult, ref: Runs, tgt: Runs) -> None:
    """FLOP and wall-clock ratios at equal perplexity (censored like the token ratio)."""
    tr = res.token_ratio
    fpt_ref, fpt_v = np.mean(ref.fpt), np.mean(tgt.fpt)
    if tr.value is not None and np.isfinite(fpt_ref) and np.isfinite(fpt_v) and fpt_v > 0:
        res.flop_ratio = Estimate(float(tr.value * fpt_ref / fpt_v), tr.censored, tr.direction)
    else:
        res.flop_ratio.reason = "flops_per_token missing"
    res.wall_ratio = _wall_ratio(res, ref, tgt)


def _interval(res: RatioResult, ref: Runs, tgt: Runs, d_c: float, level: float) -> None:
    iv = ratio_interval(ref, tgt, d_c, level)
    res.ci_note, res.ci_method, res.ci_n = iv.note, iv.method or None, iv.n
    if iv.low is None:
        return
    res.ci_low, res.ci_high = iv.low, iv.high
    res.ci_low_side, res.ci_high_side = iv.low_side, iv.high_side
    res.ci_low_censored, res.ci_high_censored = iv.low_side != "", iv.high_side != ""


def single_run_disagreement(res: RatioResult) -> str | None:
    """Why the single-run curve estimate disagrees with the extend estimate, or None.

    Disagreement: the two lie on opposite sides of 1x (where both sides are determined; a
    censored bound such as '<1.03x' leaves it open), or the curve estimate lies outside the
    extend estimate's interval (a censored end is open beyond its bound).
    """
    s, e = res.single_run, res.token_ratio
    if s.value is None or e.value is None:
        return None
    ss, es = s.side_of_one(), e.side_of_one()
    if ss and es and ss != es:
        return f"opposite sides of 1x: curve {s.display()} vs extend {e.display()}"
    if res.ci_low is None or res.ci_high is None:
        return None
    below = res.ci_low_side != "<" and (s.value <= res.ci_low if s.direction == "<" else s.value < res.ci_low)
    above = res.ci_high_side != ">" and (s.value >= res.ci_high if s.direction == ">" else s.value > res.ci_high)
    if below or above:
        return f"curve {s.display()} outside the interval {res.interval_display()}"
    return None


def _wall_ratio(res: RatioResult, ref: Runs, tgt: Runs) -> Estimate:
    """Reference seconds to D* (log-log interpolation across extend runs) / variant seconds to D_c."""
    _, tokens = ref.levels()
    secs, t_v = ref.level_means(ref.wall), float(np.mean(tgt.wall))
    ok = np.isfinite(secs) & (secs > 0)
    if res.tokens_star is None or ok.sum() < 2 or not np.isfinite(t_v) or t_v <= 0:
        return Estimate(None, reason="time/wall_s missing")
    at = np.exp(np.interp(np.log(res.tokens_star), np.log(tokens[ok]), np.log(secs[ok])))
    tr = res.token_ratio
    return Estimate(float(at / t_v), tr.censored, tr.direction)


def _curve(curves: pd.DataFrame, scale: str, variant: str, extend: float) -> pd.DataFrame:
    """One (scale, variant, extend)'s seed-mean eval curve, by tokens, without the step-0 point."""
    c = curves[(curves["scale"] == scale) & (curves["variant"] == variant) & (curves["extend"] == extend)]
    return c[c["step"] > 0].sort_values("step")


def _single_run(res: RatioResult, curves: pd.DataFrame | None, target: float, d_c: float) -> None:
    """The reference's longest run's seed-mean eval curve, read where it crosses the
    variant's last eval-curve point (the same validation windows as the curve it is read
    on; the final pass averages more windows, so its perplexity is another quantity), or
    the variant's final perplexity when the variant has no curve."""
    if curves is None or curves.empty:
        res.single_run.reason = "no eval curves"
        return
    e = max(res.ref_extends)
    c = _curve(curves, res.scale, res.reference, e)
    if c.empty:
        res.single_run.reason = f"no val/ppl curve for {res.reference} x{e:g}"
        return
    own = _curve(curves, res.scale, res.variant, 1.0)
    on = f"{res.variant}'s last eval point" if len(own) else f"{res.variant}'s final perplexity"
    if len(own):
        target = float(own["mean"].iloc[-1])
    d, direction = curve_crossing(c["step"].to_numpy(float), c["mean"].to_numpy(float), target)
    res.single_run = Estimate(d / d_c, direction is not None, direction)
    res.single_run_source = (
        f"single-run curve estimate: eval curve of {res.reference} x{e:g} (mean of {int(c['n_seeds'].max())} seeds) "
        f"where it reaches {on} ({target:.4g}), read at points before that run's learning rate has decayed"
    )
