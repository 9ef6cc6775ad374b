"""The monotone log-log solver: where a reference's final-loss curve reaches a target.

The reference's extend runs (x1, x1.5, x2, ..., each with its own full LR schedule) give a
final perplexity at a few token counts. The curve between them is a monotone (PCHIP, Fritsch
& Carlson 1980) interpolant of log perplexity vs log tokens, after an isotonic fit so that
seed noise cannot make it non-monotone. A target outside the measured range is censored:
the solver returns the range's bound and the side ('>' the longest run never reached it,
'<' the shortest run was already at or below it), never an extrapolation.
"""

from __future__ import annotations

import numpy as np
from scipy.interpolate import PchipInterpolator
from scipy.optimize import isotonic_regression


def monotone_curve(x: np.ndarray, y: np.ndarray) -> PchipInterpolator:
    """The monotone interpolant of knots x (ln tokens, ascending, shape (k,)) and y (ln ppl = loss).

    y is replaced by its isotonic (non-increasing) fit first where seed noise broke monotonicity.
    """
    y = np.asarray(y, float)
    if (np.diff(y) > 0).any():
        y = isotonic_regression(y, increasing=False).x
    return PchipInterpolator(np.asarray(x, float), y)


def solve_tokens(tokens: np.ndarray, ppl: np.ndarray, target: float) -> tuple[float, str | None]:
    """Tokens at which the monotone log-log interpolant of (tokens, ppl) reaches `target`.

    tokens, ppl: shape (k,), one point per extend level (any order, k >= 2, tokens distinct).
    Returns (D*, None) inside the measured range, (max tokens, '>') when even the most tokens
    stay above target, (min tokens, '<') when the fewest tokens are already at or below it.
    """
    d, side = solve_tokens_batch(tokens, np.asarray(ppl, float)[None, :], np.array([target]))
    return float(d[0]), (side[0] or None)


def solve_tokens_batch(tokens: np.ndarray, ppl: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """solve_tokens for many curves at once: ppl shape (n, k), target shape (n,).

    Returns D* shape (n,) and the censoring side shape (n,): '>' , '<' or '' (inside).
    One PCHIP (scipy, all curves as columns) and a vectorised bisection on each curve's cubic
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
