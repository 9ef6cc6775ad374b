"""MQAR accuracy against tokens: where each run crosses given accuracies, and the token ratio at one.

Why: a recall task is learned in a jump (accuracy sits at a guess among the values in context,
then rises within a few hundred steps), so a final accuracy says little about how soon an arm
learned it. The currency the paper's sample-efficiency claim uses is tokens; here it is read at
an accuracy instead of a perplexity.

Per run (labelled corpora only, ``val/accuracy`` at every evaluation): the tokens at which the
curve first reaches each threshold, by linear interpolation between the evaluation before and
the first one at or above it (``tokens_to``). A run that never reaches it is censored at its
last evaluation (the tokens are above that); one already there at its first evaluation is
censored there too (at most those tokens). Interpolation error is not in the interval below: on
a logistic jump read at 24 evaluations it is under 1% (tests/orchestrator/report/test_recall.py).

Token ratio at accuracy a (``accuracy_ratio``), seed-paired like the perplexity ratio: seed s
gives r_s = T_ref,s(a) / T_v,s(a), above 1 when the variant gets there on fewer tokens. The
ratio is the geometric mean over the pairs, its interval the t interval on ln r_s with n - 1
degrees of freedom: exact under normal noise of ln r_s (the pairs are independent across
seeds), whatever the seeds share cancelling in the pair; with 2 pairs t_{1, 0.975} = 12.7 makes
it wide, which the table shows rather than hides. A pair with a censored crossing is a bound:
the variant beyond its last evaluation D or the reference by its first one gives r_s < the
ratio at those tokens, the reference beyond its last or the variant by its first r_s > it; when
every bound points one way the geometric mean over pairs is a bound that way too (each r_s is
on that side of its bound), given without an interval; bounds both ways (in one pair, such as
neither arm getting there, or across pairs) give no ratio, and the table says which.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

ACC = "val/accuracy"
THRESHOLDS = (0.5, 0.9)  # the crossings the table gives per run (the paper: "perfect" recall)
RATIO_AT = 0.9  # the accuracy the token ratio is read at
LEVEL = 0.95
CROSSINGS, RATIOS = "accuracy_crossings", "accuracy_ratio"


def tokens_to(tokens: np.ndarray, accuracy: np.ndarray, threshold: float) -> float | None:
    """Tokens at which one run's accuracy curve first reaches ``threshold`` (a fraction).

    tokens: float [n], increasing (the evaluations' tokens seen); accuracy: float [n] in [0, 1].
    Linear interpolation between the evaluation before the first one at or above the threshold
    and that one; the first evaluation itself when it already is (no point before it to
    interpolate from). None when no evaluation reaches it (censored at tokens[-1]).
    Raises ValueError when the arrays differ in length or tokens do not increase.
    """
    t, a = np.asarray(tokens, float), np.asarray(accuracy, float)
    if t.shape != a.shape or t.ndim != 1:
        raise ValueError(f"tokens_to: tokens {t.shape} and accuracy {a.shape} must be 1-D of one length")
    if np.any(np.diff(t) <= 0):
        raise ValueError("tokens_to: tokens must increase")
    above = np.flatnonzero(a >= threshold)
    if not len(above):
        return None
    i = int(above[0])
    if i == 0:
        return float(t[0])
    return float(t[i - 1] + (threshold - a[i - 1]) / (a[i] - a[i - 1]) * (t[i] - t[i - 1]))


def crossing_table(finals: pd.DataFrame, metrics: pd.DataFrame, thresholds=THRESHOLDS) -> pd.DataFrame:
    """One row per finished planned (x1) run with accuracy curves: scale, variant, seed,
    first_tokens and last_tokens (its first and last evaluation), final_accuracy, and
    ``tokens_to_<pct>`` per threshold (NaN: not reached by last_tokens; equal to first_tokens:
    reached by then, so at most that). ``finals``: curves.run_finals; ``metrics``: the study's
    long metric table (run_uuid, key, step = tokens, value)."""
    cols = ["scale", "variant", "seed", "first_tokens", "last_tokens", "final_accuracy", *(crossing_column(a) for a in thresholds)]
    done = finals[(finals["extend"] == 1.0) & (finals["status"] == "finished")]
    acc = metrics[(metrics["key"] == ACC) & metrics["run_uuid"].isin(done["run_uuid"])]
    rows = []
    for rid, g in acc.groupby("run_uuid", sort=False):
        g = g.sort_values("step").drop_duplicates("step", keep="last")
        run = done[done["run_uuid"] == rid].iloc[0]
        t, a = g["step"].to_numpy(float), g["value"].to_numpy(float)
        row: dict[str, Any] = {
            "scale": run["scale"],
            "variant": run["variant"],
            "seed": run["seed"],
            "first_tokens": t[0],
            "last_tokens": t[-1],
        }
        row["final_accuracy"] = run["final_accuracy"]
        for th in thresholds:
            x = tokens_to(t, a, th)
            row[crossing_column(th)] = np.nan if x is None else x
        rows.append(row)
    return pd.DataFrame(rows, columns=cols).sort_values(["scale", "variant", "seed"], kind="stable").reset_index(drop=True)


def accuracy_ratio(cross: pd.DataFrame, scale: str, variant: str, reference: str, at: float = RATIO_AT, level: float = LEVEL) -> dict:
    """The token ratio T_ref(at) / T_variant(at) of one variant at one scale, paired by seed
    (module docstring). ``cross``: crossing_table with a column for ``at``.

    Returns {scale, variant, reference, accuracy, ratio, direction ('' exact, '<' or '>' a
    bound), ci_low, ci_high (None when censored or fewer than 2 pairs), pairs, note}; ratio None
    with a note saying why when there is none."""
    col = crossing_column(at)
    out: dict[str, Any] = {"scale": scale, "variant": variant, "reference": reference, "accuracy": at}
    out.update(ratio=None, direction="", ci_low=None, ci_high=None, pairs=0, note="")
    ref = cross[(cross["scale"] == scale) & (cross["variant"] == reference)].set_index("seed")
    var = cross[(cross["scale"] == scale) & (cross["variant"] == variant)].set_index("seed")
    seeds = sorted(set(ref.index) & set(var.index))
    out["pairs"] = len(seeds)
    if not seeds:
        return {**out, "note": "no seed has both arms' accuracy curves"}
    logs, sides = [], set()
    for s in seeds:
        (tr, ref_side), (tv, var_side) = _crossing(ref.loc[s], col), _crossing(var.loc[s], col)
        # r_s = tr / tv: a reference crossing known only as "at most" bounds r_s from above, one
        # beyond its run from below; for the variant the other way round
        bound = ({"<=": "<", ">": ">"}.get(ref_side), {"<=": ">", ">": "<"}.get(var_side))
        if None not in bound and bound[0] != bound[1]:
            why = "neither arm reached" if ref_side == var_side == ">" else "its bounds point both ways at"
            return {**out, "note": f"seed {s}: {why} {at:.0%}"}
        sides |= {b for b in bound if b is not None}
        logs.append(math.log(tr / tv))
    if len(sides) > 1:
        return {**out, "note": "censored both ways: the seeds' bounds point both ways"}
    out["ratio"] = math.exp(float(np.mean(logs)))
    if sides:
        (out["direction"],) = sides
        return {**out, "note": f"a bound: a seed's crossing of {at:.0%} lies before its first evaluation or after its last"}
    if len(logs) < 2:
        return {**out, "note": "one seed pair: no interval"}
    half = stats.t.ppf((1 + level) / 2, len(logs) - 1) * float(np.std(logs, ddof=1)) / math.sqrt(len(logs))
    out["ci_low"], out["ci_high"] = math.exp(float(np.mean(logs)) - half), math.exp(float(np.mean(logs)) + half)
    return out


def attach(
    tabs: dict[str, pd.DataFrame],
    summary: dict,
    finals: pd.DataFrame,
    metrics: pd.DataFrame,
    reference: str,
    variants: list[str],
    scales: list[str],
) -> None:
    """Add the crossings and the ratios at RATIO_AT (tables ``accuracy_crossings``,
    ``accuracy_ratio``; summary ``accuracy_ratio``) when any run logged accuracy curves."""
    cross = crossing_table(finals, metrics)
    if cross.empty:
        return
    tabs[CROSSINGS] = cross
    ratios = [accuracy_ratio(cross, s, v, reference) for s in scales for v in variants if v != reference]
    tabs[RATIOS] = pd.DataFrame(ratios)
    summary[RATIOS] = ratios


def _crossing(row: pd.Series, col: str) -> tuple[float, str]:
    """One run's tokens to the threshold as (value, side): '=' interpolated between evaluations,
    '<=' reached by its first evaluation (so at most that), '>' never reached (beyond its last)."""
    t = float(row[col])
    if t != t:
        return float(row["last_tokens"]), ">"
    return t, "<=" if t <= float(row["first_tokens"]) else "="


def display_ratio(r: dict) -> str:
    """'1.32x [0.85, 2.05]', '<0.61x', or 'n/a (why)'."""
    if r["ratio"] is None or pd.isna(r["ratio"]):
        return f"n/a ({r['note']})"
    direction = r["direction"] if isinstance(r["direction"], str) else ""  # '' reads back from a CSV as NaN
    head = f"{direction}{r['ratio']:.2f}x"
    return head if r["ci_low"] is None or pd.isna(r["ci_low"]) else f"{head} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def format_tokens(x: float) -> str:
    """Tokens with an SI suffix, 3 significant digits: 5.12M, 640k."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def seed_crossings(cross: pd.DataFrame, threshold: float) -> dict[tuple[str, str], str]:
    """(scale, variant) -> each seed's tokens to ``threshold``, in seed order: '<=512k, 5.12M,
    >12.3M' (``>D``: not reached by its last evaluation D; ``<=D``: reached by its first)."""
    col = crossing_column(threshold)
    mark = {"=": "", "<=": "<=", ">": ">"}

    def cell(row: pd.Series) -> str:
        t, side = _crossing(row, col)
        return mark[side] + format_tokens(t)

    return {k: ", ".join(cell(r) for _, r in g.iterrows()) for k, g in cross.sort_values("seed").groupby(["scale", "variant"], sort=False)}


def crossing_column(threshold: float) -> str:
    """The crossing table's column of one threshold: tokens_to_90pct."""
    return f"tokens_to_{round(threshold * 100):d}pct"
