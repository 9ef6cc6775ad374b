"""Verdicts in every currency: two arms compared at equal tokens, equal model FLOPs and equal
wall-clock, paired by seed, and the split of a difference into quality per token and cost per token.

A study's budget matches one currency (``budget.mode``): a FLOP-matched arm whose QK
transform costs 2.6% more FLOPs per token trains 2.4% fewer tokens, so its equal-FLOP
difference mixes what it does with a token (quality per token) with what a token costs it.
Each currency c gives a run a cost per token kappa_c (1 for tokens, flops_per_token for model
FLOPs, the run's own seconds per training token for wall-clock: time/wall_s at its last point
over its tokens, measured on the study's hardware). For seed s, arm a (D_a tokens) and arm b:

    C_s = min(kappa_a D_a, kappa_b D_b)        the budget both reached
    L_x,s(C_s) = final loss of x               when x spent exactly C_s
               = L_x,final + l_x(C_s / kappa_x) - l_x(D_x)   when x spent more

where l_x is x's own eval curve (ln val/ppl against ln tokens, linear interpolation between
eval points) of that run: the arm that spent more is read earlier on its own curve, never
extrapolated past it, and anchored on its final pass (the final pass averages more
validation windows than a curve point, so only the curve's change is used). A point read
before the run's learning rate has decayed is higher than a run planned for that budget
would reach: the row says at which fraction of its tokens it was read. The pairs
d_s = L_a,s - L_b,s go through the paired t-test (verdict.compare).

Which currency the budget matched is read from the runs themselves: the currency in which
every seed pair of every arm with the reference spent the same budget within MATCH_TOL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from orchestrator.report.stats.curves import PPL
from orchestrator.report.stats.verdict import compare

CURRENCIES = {"tokens": "equal tokens", "flops": "equal model FLOPs", "wall_s": "equal wall-clock"}
MATCH_TOL = 0.01  # relative: budgets this close count as matched
FINAL_TOL = 1e-3  # a budget this close to the run's own (a FLOP-matched step rounding) is its final pass
EARLY_READ = 0.95  # a read before this fraction of a run's tokens is flagged: its learning rate had not decayed

COLUMNS = [
    "scale",
    "variant",
    "against",
    "currency",
    "matched",
    "n_pairs",
    "paired_dloss",
    "paired_low",
    "paired_high",
    "p_value",
    "paired_ppl_pct",
    "verdict",
    "read",
    "note",
]


@dataclass
class _Run:
    """One finished planned (x1) run: its tokens, final loss (nats), costs per token and curve."""

    tokens: float
    loss: float
    kappa: dict[str, float]
    steps: np.ndarray  # eval points, tokens, shape (k,)
    curve: np.ndarray  # ln val/ppl at steps, shape (k,)

    def loss_at(self, budget: float, currency: str) -> tuple[float | None, float]:
        """(loss at `budget` in `currency`, fraction of its tokens read at); None before its first eval point."""
        t = budget / self.kappa[currency]
        frac = t / self.tokens
        if frac >= 1 - FINAL_TOL:
            return self.loss, 1.0
        if not len(self.steps) or t < self.steps[0]:
            return None, frac
        x = np.log(self.steps)
        shift = np.interp(np.log(t), x, self.curve) - np.interp(np.log(self.tokens), x, self.curve)
        return self.loss + float(shift), frac


def _runs(finals: pd.DataFrame, metrics: pd.DataFrame) -> dict[tuple[str, str], dict[int, _Run]]:
    """(scale, variant) -> seed -> _Run of every finished x1 run with a seed."""
    f = finals[(finals["extend"] == 1.0) & finals["complete"] & finals["seed"].notna()]
    curves = metrics[(metrics["key"] == PPL) & metrics["run_uuid"].isin(f["run_uuid"]) & (metrics["step"] > 0)]
    by_run = {rid: (g["step"].to_numpy(float), np.log(g["value"].to_numpy(float))) for rid, g in curves.groupby("run_uuid", sort=False)}
    out: dict[tuple[str, str], dict[int, _Run]] = {}
    for r in f.itertuples():
        wall = float(r.final_wall_s) if pd.notna(r.final_wall_s) and r.final_wall_s > 0 else np.nan
        kappa = {"tokens": 1.0, "flops": float(r.flops_per_token), "wall_s": wall / float(r.tokens)}
        steps, curve = by_run.get(r.run_uuid, (np.array([]), np.array([])))
        order = np.argsort(steps)
        out.setdefault((r.scale, r.variant), {})[int(r.seed)] = _Run(
            float(r.tokens), float(np.log(r.final_ppl)), kappa, steps[order], curve[order]
        )
    return out


def matched_currency(finals: pd.DataFrame, reference: str, metrics: pd.DataFrame | None = None) -> str | None:
    """The currency (CURRENCIES key) in which every planned run spent its seed's reference run's
    budget within MATCH_TOL, checked in the order tokens, FLOPs, wall-clock; None when none did
    (or no arm pairs with the reference)."""
    runs = _runs(finals, metrics if metrics is not None else pd.DataFrame(columns=["run_uuid", "key", "step", "value"]))
    pairs = [
        (run, ref[seed])
        for (scale, variant), by_seed in runs.items()
        if variant != reference and (ref := runs.get((scale, reference)))
        for seed, run in by_seed.items()
        if seed in ref
    ]
    if not pairs:
        return None
    for c in CURRENCIES:
        spent = [(a.kappa[c] * a.tokens, b.kappa[c] * b.tokens) for a, b in pairs]
        if all(np.isfinite(x) and np.isfinite(y) and abs(x / y - 1) <= MATCH_TOL for x, y in spent):
            return c
    return None


def with_defaults(contrasts: list[tuple[str, str]], variants: list[str], reference: str) -> list[tuple[str, str]]:
    """Each non-reference variant against the reference, then the named contrasts not among
    them (a pair and its reverse are one contrast: the first spelling wins)."""
    out: list[tuple[str, str]] = []
    for a, b in [(v, reference) for v in variants if v != reference] + list(contrasts):
        if (a, b) not in out and (b, a) not in out:
            out.append((a, b))
    return out


def contrast_table(
    finals: pd.DataFrame,
    metrics: pd.DataFrame,
    scales: list[str],
    contrasts: list[tuple[str, str]],
    matched: str | None,
    level: float = 0.95,
) -> pd.DataFrame:
    """One row per (scale, contrast (variant, against), currency) with seed pairs of both.

    finals: curves.run_finals output; metrics: the study's metric points (val/ppl curves).
    Columns: COLUMNS (dloss = variant - against, nats/token, at the budget both reached; read:
    which arm was read on its own curve and at what fraction of its tokens; note: why a
    currency has no verdict, or seeds without a partner).
    """
    runs = _runs(finals, metrics)
    rows = []
    for s in scales:
        for a, b in contrasts:
            ra, rb = runs.get((s, a)), runs.get((s, b))
            if not ra or not rb:
                continue
            for c in CURRENCIES:
                rows.append({"scale": s, "variant": a, "against": b, "currency": c, "matched": c == matched} | _compare(ra, rb, c, level))
    return pd.DataFrame(rows, columns=COLUMNS)


def _compare(ra: dict[int, _Run], rb: dict[int, _Run], currency: str, level: float) -> dict:
    seeds = sorted(set(ra) & set(rb))
    la, lb, reads, early = {}, {}, [], []
    for s in seeds:
        a, b = ra[s], rb[s]
        budgets = (a.kappa[currency] * a.tokens, b.kappa[currency] * b.tokens)
        if not all(np.isfinite(budgets)):
            return _no_verdict(len(seeds), "time/wall_s missing: no wall-clock cost per token" if currency == "wall_s" else "cost missing")
        common = min(budgets)
        (xa, fa), (xb, fb) = a.loss_at(common, currency), b.loss_at(common, currency)
        for who, x, frac in (("variant", xa, fa), ("against", xb, fb)):
            if x is None:
                return _no_verdict(len(seeds), f"the {who} arm's curve starts after {frac:.0%} of its tokens: not read before it")
            if frac < 1:
                reads.append((who, frac))
                early += [frac] if frac < EARLY_READ else []
        la[s], lb[s] = xa, xb
    out = compare(pd.Series(la), pd.Series(lb), level)
    read = "both at their final pass"
    if reads:
        names = sorted({w for w, _ in reads})
        lo, hi = min(f for _, f in reads), max(f for _, f in reads)
        span = f"{lo:.1%}" if np.isclose(lo, hi, atol=5e-4) else f"{lo:.1%}-{hi:.1%}"
        read = f"{' and '.join(names)} read on its own eval curve at {span} of its tokens"
    note = out.pop("note")
    if early:
        # a run planned for the budget would end between its curve read and its final pass
        bound = float(np.mean([ra[s].loss - rb[s].loss for s in seeds]))
        note = "; ".join(
            filter(None, [note, f"read at {min(early):.1%} of a run's tokens, before its learning rate decayed: the read arm is "
                          f"disadvantaged; with it at its final pass Δ would be {bound:+.4f} (the truth lies between)"])
        )  # fmt: skip
    return {k: out[k] for k in ("n_pairs", "paired_dloss", "paired_low", "paired_high", "p_value", "paired_ppl_pct", "verdict")} | {
        "read": read,
        "note": note,
    }


def _no_verdict(n: int, why: str) -> dict:
    nan = np.nan
    return dict(
        n_pairs=n,
        paired_dloss=nan,
        paired_low=nan,
        paired_high=nan,
        p_value=nan,
        paired_ppl_pct=nan,
        verdict="no verdict",
        read="",
        note=why,
    )


def decomposition(table: pd.DataFrame, finals: pd.DataFrame) -> pd.DataFrame:
    """Per (scale, variant, against): the equal-FLOP (and equal-wall-clock) difference split
    into quality per token (the equal-token difference) and cost per token (the rest).

    Columns: scale, variant, against, cost_ratio_flops (seed-mean flops_per_token of variant
    over against), dloss_tokens, dloss_flops, cost_part_flops (= dloss_flops - dloss_tokens,
    nats: the loss the extra cost per token accounts for), dloss_wall_s, cost_part_wall_s.
    """
    t = table.set_index(["scale", "variant", "against", "currency"])["paired_dloss"]
    fpt = finals[finals["extend"] == 1.0].groupby(["scale", "variant"])["flops_per_token"].mean()
    rows = []
    for s, a, b in table[["scale", "variant", "against"]].drop_duplicates().itertuples(index=False):
        tok = t.get((s, a, b, "tokens"), np.nan)
        row = {
            "scale": s,
            "variant": a,
            "against": b,
            "cost_ratio_flops": fpt.get((s, a), np.nan) / fpt.get((s, b), np.nan),
            "dloss_tokens": tok,
        }
        for c in ("flops", "wall_s"):
            row[f"dloss_{c}"] = d = t.get((s, a, b, c), np.nan)
            row[f"cost_part_{c}"] = d - tok
        rows.append(row)
    cols = [
        "scale",
        "variant",
        "against",
        "cost_ratio_flops",
        "dloss_tokens",
        "dloss_flops",
        "cost_part_flops",
        "dloss_wall_s",
        "cost_part_wall_s",
    ]
    return pd.DataFrame(rows, columns=cols)
