"""Scaling fits of final loss vs size that know their limits, and where an advantage ends.

Law: L(x) = E + A (x / x0)^(-alpha), fitted (scipy curve_fit from an alpha x E grid of
starts) to final val loss L = ln perplexity (nats/token) of every finished planned run
against x = N (non-embedding parameters) or training FLOPs, as in Kaplan et al. 2020 and
Hoffmann et al. 2022; x0 = geometric mean of x keeps A well conditioned. A fit is made only
where the data can determine it, else refused with the reason (and never drawn):

- at least two more distinct scales than the law has parameters (5 for 3; 4 when the
  exponent is fixed by the caller, which the report then says): with one spare scale a
  3-parameter law passes through almost any four points;
- the seed-mean loss falls with x from every scale to the next (bigger models that got
  fewer steps can have higher loss: no power law in x describes that);
- the best fit is not on a parameter bound (alpha in [1e-3, 3], E in [0, min loss], A >= 0):
  a fit on a bound is the optimiser running out of room, not an estimate.

Prediction interval (vs N): at each measured scale, the 95% interval of the seed mean of that
scale's seeds, the regression prediction interval fit(N) +- t_dof sqrt(var_fit + s^2 / n):
s^2 = the runs' residual variance about the fit (SSE / (runs - parameters): seed noise and lack
of fit), var_fit the variance of the fitted curve at N over a parametric bootstrap (new runs =
fit + Normal(0, s^2), each refitted from the fit's start; OLMo-core's ladder analysis
bootstraps its fits the same way), s^2 / n the new seed mean's own noise, t with the residual
degrees of freedom (the uncertainty of s itself). Its coverage is simulated in
tests/orchestrator/report/test_fit_coverage.py (PI_COVERAGE).

Backtest: the law fitted to every scale but the largest (allowed with one spare scale, and
said so) predicts the largest; the report gives the prediction, its interval, the seed mean
observed there and the error.

Crossover: the N where a variant's advantage 1 - ppl_v(N) / ppl_ref(N) reaches zero, from
the two accepted fits, searched from the smallest measured N to CROSSOVER_LIMIT times the
largest: beyond the largest measured N it is labelled an extrapolation, beyond the limit it is
refused (not printed). It is predicted only where the variant is better at the smallest
measured scale (seed means), else "no advantage at the smallest measured scale". Its interval
is a percentile bootstrap over seeds, resampled jointly for the variant and the reference (the
same seeds at each scale: the pairing) where their seeds match; draws whose refits are
refused are counted and reported.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import OptimizeWarning, curve_fit

ALPHA_BOUNDS = (1e-3, 3.0)
CROSSOVER_LIMIT = 10.0  # a crossover past this many times the largest measured N is refused
SPARE_SCALES = 2  # a fit needs this many more distinct scales than the law has parameters
PI_DRAWS = 200  # parametric bootstrap draws of a prediction interval
# Measured coverage of the nominal 95% prediction interval (test_fit_coverage.py: 100
# repetitions of a 5-rung law, 2 or 3 seeds per rung, seed noise 0.01 nats; in-sample: a fresh
# seed mean at each of the 5 measured rungs, held-out: the backtest's largest rung):
# (where, seeds) -> fraction of intervals holding the seed mean.
PI_COVERAGE: dict[tuple[str, int], float] = {("in-sample", 2): 0.94, ("in-sample", 3): 0.944, ("held-out", 2): 0.94, ("held-out", 3): 0.96}
AXES = {"N": ("n_params", "N"), "flops": ("final_flops", "training FLOPs")}


@dataclass
class PowerLawFit:
    """L(x) = E + A (x/x0)^(-alpha) with L in nats/token; rmse over the fitted points.

    bound: which parameter the fit sits on a bound of ("alpha = 0.001 (lower)"), else None.
    """

    E: float
    A: float
    alpha: float
    x0: float
    rmse: float
    bound: str | None = None

    def loss(self, x):
        return self.E + self.A * (np.asarray(x, float) / self.x0) ** (-self.alpha)

    def ppl(self, x):
        return np.exp(self.loss(x))


def _law(x, E, A, alpha):
    return E + A * x ** (-alpha)


def fit_power_law(
    x: np.ndarray, loss: np.ndarray, *, alpha: float | None = None, starts: list[tuple[float, float]] | None = None
) -> PowerLawFit | None:
    """Best least-squares fit over several (alpha, E-fraction) starts.

    x: shape (n,), positive (parameters or FLOPs); loss: shape (n,), nats/token. alpha: a
    fixed exponent (then only E and A are fitted). None when x has no more distinct values
    than the law has free parameters, or no start converges. The result's `bound` says
    whether it sits on a parameter bound.
    """
    x, loss = np.asarray(x, float), np.asarray(loss, float)
    ok = np.isfinite(x) & np.isfinite(loss) & (x > 0)
    x, loss = x[ok], loss[ok]
    if len(np.unique(x)) <= (2 if alpha is not None else 3):  # no residual degree of freedom at all
        return None
    x0 = float(np.exp(np.log(x).mean()))
    u, lo = x / x0, float(loss.min())
    best = None
    for alpha0, e_frac in starts or [(a, e) for a in (0.1, 0.3, 0.7) for e in (0.0, 0.5, 0.9)]:
        a_use = alpha if alpha is not None else alpha0
        e0 = e_frac * lo
        p0 = [e0, max(float(np.mean((loss - e0) * u**a_use)), 1e-6)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                if alpha is not None:
                    p, _ = curve_fit(lambda t, e, a: _law(t, e, a, alpha), u, loss, p0=p0, bounds=([0.0, 0.0], [lo, np.inf]))
                    p = (*p, alpha)
                else:
                    p, _ = curve_fit(
                        _law, u, loss, p0=(*p0, alpha0), bounds=([0.0, 0.0, ALPHA_BOUNDS[0]], [lo, np.inf, ALPHA_BOUNDS[1]]), maxfev=5000
                    )
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((_law(u, *p) - loss) ** 2))
        if best is None or sse < best[0]:
            best = (sse, p)
    if best is None:
        return None
    sse, (E, A, a_fit) = best
    return PowerLawFit(float(E), float(A), float(a_fit), x0, float(np.sqrt(sse / len(x))), _on_bound(E, A, a_fit, lo, alpha))


def _on_bound(E: float, A: float, alpha: float, lo: float, fixed: float | None) -> str | None:
    tol = 1e-4
    checks = [("E", E, 0.0, "lower"), ("E", E, lo, "upper"), ("A", A, 0.0, "lower")]
    if fixed is None:
        checks += [("alpha", alpha, ALPHA_BOUNDS[0], "lower"), ("alpha", alpha, ALPHA_BOUNDS[1], "upper")]
    for name, value, bound, side in checks:
        if abs(value - bound) <= tol * max(1.0, abs(bound)):
            return f"{name} = {bound:g} ({side})"
    return None


def refusal(points: pd.DataFrame, x: str, label: str, fixed_alpha: float | None, spare: int = SPARE_SCALES) -> str | None:
    """Why no law can be fitted to points (columns scale, `x`, loss), or None.

    Checks the number of distinct scales against the law's parameters (at least `spare`
    more) and that the seed-mean loss falls from every scale to the next in x; every failed
    check is named ("; ").
    """
    pts = points[np.isfinite(points[x]) & (points[x] > 0)]
    if pts.empty:
        return f"no {label} logged for its runs"
    means = pts.groupby("scale")[[x, "loss"]].mean().sort_values(x)
    n_par, k = (2 if fixed_alpha is not None else 3), len(means)
    why = []
    if k < n_par + spare:
        why.append(
            f"{k} scale{'s' if k != 1 else ''} for a {n_par}-parameter law: a fit needs at least {n_par + spare} distinct "
            "scales" + ("" if fixed_alpha is not None else ", or a fixed exponent")
        )
    rise = np.nonzero(np.diff(means["loss"].to_numpy()) >= 0)[0]
    if len(rise):
        a, b = means.iloc[rise[0]], means.iloc[rise[0] + 1]
        why.append(
            f"loss does not fall with {label}: seed-mean loss {a['loss']:.3f} nats at {label} = {a[x]:.3g} "
            f"rises to {b['loss']:.3f} at {b[x]:.3g}"
        )
    return "; ".join(why) or None


def fit_axis(
    points: pd.DataFrame, x: str, label: str, fixed_alpha: float | None = None, spare: int = SPARE_SCALES
) -> tuple[PowerLawFit | None, str | None]:
    """(fit, None) when a law is supported by points (columns scale, `x`, loss), else (None, reason)."""
    reason = refusal(points, x, label, fixed_alpha, spare)
    if reason:
        return None, reason
    fit = fit_power_law(points[x].to_numpy(), points["loss"].to_numpy(), alpha=fixed_alpha)
    if fit is None:
        return None, "no start of the least-squares fit converged"
    if fit.bound:
        return None, f"the best fit sits on the parameter bound {fit.bound}"
    return fit, None


def prediction_interval(
    pts: pd.DataFrame, fit: PowerLawFit, fixed_alpha: float | None, at: np.ndarray, n_new: np.ndarray, rng: np.random.Generator,
    draws: int = PI_DRAWS, level: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, float] | None:  # fmt: skip
    """(low, high, fraction of refused refits) of the `level` prediction interval of the seed
    mean of n_new[i] new runs at N = at[i]: fit(at) +- t_dof sqrt(var_fit + s^2 / n_new), the
    regression prediction interval with the fit's variance var_fit from a parametric bootstrap
    (module docstring). pts: the fitted runs (columns n_params, loss in nats); at, n_new: shape
    (k,). None when the runs leave no residual degree of freedom or most refits are refused."""
    x, y = pts["n_params"].to_numpy(float), pts["loss"].to_numpy(float)
    dof = len(x) - (3 if fixed_alpha is None else 2)
    if dof < 1:
        return None
    s2 = float(np.sum((y - fit.loss(x)) ** 2) / dof)
    at, n_new = np.asarray(at, float), np.asarray(n_new, float)
    preds, refused = [], 0
    for _ in range(draws):
        # a refit on a bound still counts: dropping those draws would trim the tails the interval is about
        f = _refit(pts.assign(loss=fit.loss(x) + rng.normal(0.0, np.sqrt(s2), len(x))), fit, fixed_alpha, keep_bound=True)
        if f is None:
            refused += 1
            continue
        preds.append(f.loss(at))
    if len(preds) < draws // 2:
        return None
    half = stats.t.ppf(0.5 + level / 2, dof) * np.sqrt(np.var(np.array(preds), axis=0, ddof=1) + s2 / n_new)
    centre = fit.loss(at)
    return centre - half, centre + half, refused / draws


def _predict_scales(g: pd.DataFrame, fit: PowerLawFit, fixed_alpha: float | None, rng: np.random.Generator) -> list[dict]:
    """Per measured scale: N, seeds, observed seed-mean loss, the fit's loss and its prediction interval."""
    per = g.groupby("scale").agg(n_params=("n_params", "median"), loss=("loss", "mean"), n_seeds=("loss", "size")).sort_values("n_params")
    pi = prediction_interval(g, fit, fixed_alpha, per["n_params"].to_numpy(), per["n_seeds"].to_numpy(), rng)
    return [
        {
            "scale": str(sc),
            "n_params": float(r.n_params),
            "n_seeds": int(r.n_seeds),
            "observed": float(r.loss),
            "predicted": float(fit.loss(r.n_params)),
            "low": None if pi is None else float(pi[0][i]),
            "high": None if pi is None else float(pi[1][i]),
        }  # fmt: skip
        for i, (sc, r) in enumerate(per.iterrows())
    ]


def backtest(g: pd.DataFrame, fixed_alpha: float | None, rng: np.random.Generator, axis: str = "N") -> dict:
    """Fit every scale but the largest (one spare scale allowed), predict the largest.

    g: one variant's finished planned runs (columns scale, loss and the ``axis``'s column of
    ``AXES``: n_params for N, final_flops for training FLOPs). Returns held_out (scale),
    n_params (the held-out scale's x on ``axis``: N, or FLOPs), n_seeds, predicted, low, high
    (prediction interval of its seed mean), observed (its seed mean), error (observed -
    predicted, nats), covered, n_fit_scales, and reason (None, or why no backtest).
    """
    col, label = AXES[axis]
    g = g.assign(n_params=g[col])  # the fit and its prediction interval read x from n_params
    g = g[np.isfinite(g["n_params"]) & (g["n_params"] > 0)]  # as refusal() reads them
    order = g.groupby("scale")["n_params"].median().sort_values()
    if len(order) < 2:  # e.g. no run logged its FLOPs
        return {"held_out": None, "n_fit_scales": 0, "reason": f"{len(order)} scale(s) with {label} logged: nothing to hold out"}
    largest = order.index[-1]
    train, held = g[g["scale"] != largest], g[g["scale"] == largest]
    fit, reason = fit_axis(train, "n_params", label, fixed_alpha, spare=1)
    out: dict[str, Any] = {"held_out": str(largest), "n_fit_scales": int(train["scale"].nunique()), "reason": reason}
    if fit is None:
        return out
    x, n = float(order.iloc[-1]), len(held)
    pi = prediction_interval(train, fit, fixed_alpha, np.array([x]), np.array([n]), rng)
    observed, predicted = float(held["loss"].mean()), float(fit.loss(x))
    low = high = covered = None
    if pi is not None:
        low, high = float(pi[0][0]), float(pi[1][0])
        covered = bool(low <= observed <= high)
    return out | dict(
        n_params=x, n_seeds=n, predicted=predicted, low=low, high=high, observed=observed, error=observed - predicted, covered=covered
    )


def crossover_scale(ref: PowerLawFit, var: PowerLawFit, n_min: float, n_max: float) -> float | None:
    """Smallest N in [n_min, n_max] where var's loss reaches ref's (the advantage reaches zero).

    n_min when var is not better there already; None when it stays better up to n_max. The
    crossing is refined by linear interpolation in ln N between grid points.
    """
    grid = np.logspace(np.log10(n_min), np.log10(n_max), 2000)
    gap = var.loss(grid) - ref.loss(grid)
    if gap[0] >= 0:
        return float(n_min)
    up = np.nonzero(gap >= 0)[0]
    if not len(up):
        return None
    i = int(up[0])
    u = -gap[i - 1] / (gap[i] - gap[i - 1])
    return float(np.exp(np.log(grid[i - 1]) + u * (np.log(grid[i]) - np.log(grid[i - 1]))))


def scaling_analysis(
    finals: pd.DataFrame, reference: str, *, n_boot: int = 200, rng: np.random.Generator | None = None, fixed_alpha: float | None = None
) -> dict:
    """Fits per variant vs N and vs FLOPs (or their refusals), and each variant's crossover.

    finals: curves.run_finals output. Returns {"fixed_alpha": fixed_alpha, "fits": {variant:
    {"n_scales": int, "N": {"fit": dict | None, "reason": str | None}, "flops": {...}}},
    "crossover": {variant: {"n": float | None, "ci": [lo, hi] | None, "note": str,
    "failed_draws": float | None, "extrapolation": bool}}}; fit dicts have E, A, alpha, x0,
    rmse, bound. An accepted N fit also has "prediction" (per measured scale: observed and
    predicted seed-mean loss with its prediction interval, _predict_scales) and every variant a
    "backtest" vs N and a "backtest_flops" vs training FLOPs (backtest(), or {"reason": ...}).
    """
    rng = rng or np.random.default_rng(0)
    f = finals[(finals["extend"] == 1.0) & finals["complete"]].copy()
    f["loss"] = np.log(f["final_ppl"])
    fits: dict[str, dict[str, Any]] = {}
    objs: dict[str, tuple[PowerLawFit | None, str | None]] = {}
    for variant, g in f.groupby("variant"):
        fits[variant] = {"n_scales": int(g["scale"].nunique())}
        for axis, (col, label) in AXES.items():
            fit, reason = fit_axis(g, col, label, fixed_alpha)
            fits[variant][axis] = {"fit": None if fit is None else vars(fit), "reason": reason}
            if axis == "N":
                objs[variant] = (fit, reason)
        sized = g[np.isfinite(g["n_params"])]
        if (n_fit := objs[variant][0]) is not None:
            fits[variant]["N"]["prediction"] = _predict_scales(sized, n_fit, fixed_alpha, rng)
        n_par, k = 3 if fixed_alpha is None else 2, sized["scale"].nunique()
        for key, axis in (("backtest", "N"), ("backtest_flops", "flops")):
            fits[variant][key] = (
                # the FLOP backtest draws from a copy: the N path's stream (PI_COVERAGE's simulation) is unchanged
                backtest(sized, fixed_alpha, rng if axis == "N" else copy.deepcopy(rng), axis)
                if k >= n_par + SPARE_SCALES
                else {"reason": f"{k} scales: a backtest holds out the largest and fits {n_par + 1} or more others"}
            )
    cross = {}
    for variant in objs:
        if variant != reference and reference in objs:
            cross[variant] = _crossover(f, variant, reference, objs, n_boot, rng, fixed_alpha)
    return {"fixed_alpha": fixed_alpha, "fits": fits, "crossover": cross}


def _crossover(
    f: pd.DataFrame, variant: str, reference: str, objs: dict, n_boot: int, rng: np.random.Generator, fixed_alpha: float | None
) -> dict:
    """The crossover entry of one variant (see scaling_analysis)."""
    out: dict = {"n": None, "ci": None, "note": "", "failed_draws": None, "extrapolation": False}
    both = f[f["variant"].isin([variant, reference]) & np.isfinite(f["n_params"])]
    means = both.groupby(["scale", "variant"])[["n_params", "final_ppl"]].mean().unstack("variant").dropna()
    if means.empty:
        out["note"] = "no scale with N logged for both variants"
        return out
    first = means.sort_values(("n_params", reference)).iloc[0]
    n_min, n_max = float(first[("n_params", reference)]), float(both["n_params"].max())
    pv, pr = first[("final_ppl", variant)], first[("final_ppl", reference)]
    if pv >= pr:
        out["note"] = f"no advantage at the smallest measured scale (N = {n_min:.3g}: ppl {pv:.2f} vs {reference} {pr:.2f})"
        return out
    for who in (reference, variant):
        if objs[who][0] is None:
            out["note"] = f"no crossover prediction: the {who} fit vs N is refused: {objs[who][1]}"
            return out
    ref_fit, var_fit = objs[reference][0], objs[variant][0]
    out["n"] = crossover_scale(ref_fit, var_fit, n_min, n_max * CROSSOVER_LIMIT)
    out["extrapolation"] = out["n"] is not None and out["n"] > n_max
    if out["n"] is None:
        out["note"] = (
            f"refused: the fits do not cross within {CROSSOVER_LIMIT:g}x the largest measured N ({n_max * CROSSOVER_LIMIT:.3g}); "
            "a crossover further out is not estimated"
        )
    elif out["extrapolation"]:
        out["note"] = f"an extrapolation: beyond the largest measured N ({n_max:.3g})"
    draws, failed, note = _boot_crossovers(
        both, variant, reference, (ref_fit, var_fit), n_boot, rng, fixed_alpha, (n_min, n_max * CROSSOVER_LIMIT)
    )
    out["failed_draws"] = failed
    if note:
        out["note"] = "; ".join(filter(None, [out["note"], note]))
    if len(draws) >= max(10, n_boot // 2):
        lo, hi = np.quantile(draws, [0.025, 0.975], method="inverted_cdf")
        out["ci"] = [float(lo), float(hi) if np.isfinite(hi) else None]  # None: beyond the searched span
    return out


def _boot_crossovers(
    both: pd.DataFrame,
    variant: str,
    reference: str,
    fits: tuple[PowerLawFit, PowerLawFit],
    n_boot: int,
    rng: np.random.Generator,
    fixed_alpha: float | None,
    span: tuple[float, float],
) -> tuple[np.ndarray, float | None, str]:
    """Crossover of n_boot seed resamples (inf where the refits do not cross within span).

    Returns (crossovers of the draws whose two refits are accepted, fraction refused, note).
    """
    per_scale = []
    paired = True
    for _, g in both.groupby("scale"):
        r = g[g["variant"] == reference].set_index("seed")
        v = g[g["variant"] == variant].set_index("seed")
        common = r.index.intersection(v.index)
        paired &= len(common) == len(r) == len(v)
        per_scale.append((r, v, common))
    if min(min(len(r), len(v)) for r, v, _ in per_scale) < 2:
        return np.array([]), None, "one seed per scale: no bootstrap interval"
    out, refused = [], 0
    for _ in range(n_boot):
        pts: dict[str, list[pd.DataFrame]] = {reference: [], variant: []}
        for r, v, common in per_scale:
            if paired:
                pick = common[rng.integers(0, len(common), len(common))]
                rs, vs = r.loc[pick], v.loc[pick]
            else:
                rs, vs = r.iloc[rng.integers(0, len(r), len(r))], v.iloc[rng.integers(0, len(v), len(v))]
            pts[reference].append(rs)
            pts[variant].append(vs)
        refit = [_refit(pd.concat(pts[w]), fit, fixed_alpha) for w, fit in ((reference, fits[0]), (variant, fits[1]))]
        if refit[0] is None or refit[1] is None:
            refused += 1
            continue
        n = crossover_scale(refit[0], refit[1], *span)
        out.append(np.inf if n is None else n)
    note = "" if paired else "seeds do not pair at every scale: resampled independently"
    return np.array(out), refused / n_boot, note


def _refit(pts: pd.DataFrame, fit: PowerLawFit, fixed_alpha: float | None, keep_bound: bool = False) -> PowerLawFit | None:
    """One bootstrap refit from the full-data fit's start; None when refused (no fit, or on a bound unless keep_bound)."""
    start = [(fit.alpha, min(fit.E / max(float(pts["loss"].min()), 1e-9), 0.99))]
    f = fit_power_law(pts["n_params"].to_numpy(), pts["loss"].to_numpy(), alpha=fixed_alpha, starts=start)
    return None if f is None or (f.bound and not keep_bound) else f
