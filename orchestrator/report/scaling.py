"""Saturating power laws of final loss vs size, and where a variant's advantage fades.

Fit L(x) = E + A * (x / x0)^(-alpha) to final val loss L = ln(perplexity) (nats/token)
against x = N (non-embedding parameters) or training FLOPs, as in Kaplan et al. 2020 and
Hoffmann et al. 2022 (fit on loss, not perplexity, because loss is what the laws describe).
x0 = geometric mean of x keeps A well conditioned. scipy curve_fit from several starting
points (alpha x E grid) keeps the best; a bootstrap resamples each scale's seeds. The
"advantage" of variant v over the reference is 1 - ppl_v(N) / ppl_ref(N); the predicted
fade-out scale is the smallest N above the smallest measured one where it drops below 1%.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeWarning, curve_fit

N_GRID = np.logspace(4, 16, 2000)


@dataclass
class PowerLawFit:
    """L(x) = E + A (x/x0)^(-alpha) with L in nats/token; rmse over the fitted points."""

    E: float
    A: float
    alpha: float
    x0: float
    rmse: float

    def loss(self, x):
        return self.E + self.A * (np.asarray(x, float) / self.x0) ** (-self.alpha)

    def ppl(self, x):
        return np.exp(self.loss(x))


def _law(x, E, A, alpha):
    return E + A * x ** (-alpha)


def fit_power_law(x: np.ndarray, loss: np.ndarray, *, starts: list[tuple[float, float]] | None = None) -> PowerLawFit | None:
    """Best least-squares fit over several (alpha, E-fraction) starts; None with < 3 distinct x.

    x: shape (n,), positive (parameters or FLOPs); loss: shape (n,), nats/token.
    """
    x, loss = np.asarray(x, float), np.asarray(loss, float)
    ok = np.isfinite(x) & np.isfinite(loss) & (x > 0)
    x, loss = x[ok], loss[ok]
    if len(np.unique(x)) < 3:
        return None
    x0 = float(np.exp(np.log(x).mean()))
    u = x / x0
    lo = float(loss.min())
    best = None
    starts = starts or [(a, e) for a in (0.1, 0.3, 0.7) for e in (0.0, 0.5, 0.9)]
    for alpha0, e_frac in starts:
        e0 = e_frac * lo
        a0 = max(float(np.mean((loss - e0) * u**alpha0)), 1e-6)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                p, _ = curve_fit(
                    _law, u, loss, p0=(e0, a0, alpha0), bounds=([0.0, 0.0, 1e-3], [lo, np.inf, 3.0]), maxfev=5000
                )
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((_law(u, *p) - loss) ** 2))
        if best is None or sse < best[0]:
            best = (sse, p)
    if best is None:
        return None
    sse, (E, A, alpha) = best
    return PowerLawFit(float(E), float(A), float(alpha), x0, float(np.sqrt(sse / len(x))))


def bootstrap_fits(points: pd.DataFrame, x: str, fit: PowerLawFit, n_boot: int, rng: np.random.Generator) -> list[PowerLawFit]:
    """Refit on seed resamples within each scale; points has columns scale, `x`, loss.

    Each draw starts from the full-data fit only (one start, not the grid) to stay cheap.
    """
    xs, ys = points[x].to_numpy(float), points["loss"].to_numpy(float)
    groups = list(points.groupby("scale").indices.values())
    start = [(fit.alpha, fit.E / max(ys.min(), 1e-9))]
    out = []
    for _ in range(n_boot):
        idx = np.concatenate([g[rng.integers(0, len(g), len(g))] for g in groups])
        f = fit_power_law(xs[idx], ys[idx], starts=start)
        if f is not None:
            out.append(f)
    return out


def fade_scale(ref: PowerLawFit, var: PowerLawFit, n_min: float, threshold: float = 0.01) -> float | None:
    """Smallest N >= n_min where 1 - ppl_var(N)/ppl_ref(N) < threshold; None if not below 1e16."""
    grid = N_GRID[N_GRID >= n_min]
    adv = 1.0 - np.exp(var.loss(grid) - ref.loss(grid))
    below = np.nonzero(adv < threshold)[0]
    return float(grid[below[0]]) if len(below) else None


def scaling_analysis(finals: pd.DataFrame, reference: str, *, n_boot: int = 200, rng: np.random.Generator | None = None) -> dict:
    """Fits per variant vs N and vs FLOPs, and the fade-out scale of each variant's advantage.

    finals: curves.run_finals output. Returns {"fits": {variant: {"N": fit|None, "flops": fit|None,
    "n_scales": int}}, "fade": {variant: {"n": float|None, "ci": [lo, hi]|None, "note": str}}}
    with fits as dicts (E, A, alpha, x0, rmse).
    """
    rng = rng or np.random.default_rng(0)
    f = finals[(finals["extend"] == 1.0) & finals["complete"]].copy()
    f["loss"] = np.log(f["final_ppl"])
    fits, objs, boots = {}, {}, {}
    for variant, g in f.groupby("variant"):
        fn = fit_power_law(g["n_params"].to_numpy(), g["loss"].to_numpy())
        fc = fit_power_law(g["final_flops"].to_numpy(), g["loss"].to_numpy())
        n_scales = int(g["scale"].nunique())
        fits[variant] = {"N": None if fn is None else vars(fn), "flops": None if fc is None else vars(fc), "n_scales": n_scales}
        objs[variant] = fn
        if fn is not None and g.groupby("scale").size().max() > 1:
            boots[variant] = bootstrap_fits(g[["scale", "n_params", "loss"]], "n_params", fn, n_boot, rng)
    fade = {}
    ref_fit = objs.get(reference)
    for variant, fit in objs.items():
        if variant == reference:
            continue
        if fit is None or ref_fit is None:
            fade[variant] = {"n": None, "ci": None, "note": "needs >= 3 scales of both variants for a fit"}
            continue
        n_min = float(f["n_params"].min())
        n = fade_scale(ref_fit, fit, n_min)
        entry = {"n": n, "ci": None, "note": "advantage stays >= 1% up to N = 1e16" if n is None else ""}
        rb, vb = boots.get(reference, []), boots.get(variant, [])
        if rb and vb:
            vals = np.array([fade_scale(a, b, n_min) or np.inf for a, b in zip(rb, vb)])
            # inf = "not below 1% within the grid"; it becomes None (shown as > 1e16) in the summary.
            lo, hi = np.quantile(vals, [0.025, 0.975], method="inverted_cdf")
            entry["ci"] = [float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None]
        else:
            entry["note"] = (entry["note"] + "; one seed per scale: no bootstrap interval").strip("; ")
        fade[variant] = entry
    return {"fits": fits, "fade": fade}
