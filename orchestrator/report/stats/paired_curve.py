"""Seed-paired loss difference along training: variant - reference at each eval point.

The verdict tables (verdict.py) pair each variant's final loss with the reference's run of
the same seed. This module does the same at every eval point of the planned (x1) runs, so a
figure can show how the gap develops with tokens. For each seed s with a finished planned run
of both arms (same scale and corpus), at each eval step t (tokens seen) of the variant's run:

    d_s(t) = ln ppl_variant,s(t) - ln ppl_reference,s(t)      (val/ppl, nats/token; < 0: variant better)

The reference's loss at t is read from its own eval curve: exactly where it evaluated at t
too (runs of one scale share eval steps when their token budgets match), else by linear
interpolation in log tokens between its two neighbouring eval points (a FLOP-matched arm
trains other token counts, so its steps can fall between the reference's). It is never
extrapolated: a t outside the reference's evaluated range gives no pair for that seed. The
d_s(t) of one t go through verdict.compare, the same paired t-test the tables print (mean,
interval, p). One more row per (scale, corpus, variant) pairs the final passes
(final/val_ppl): the table's paired difference, at the variant's planned tokens.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from orchestrator.report.stats.curves import PPL
from orchestrator.report.stats.verdict import compare

COLUMNS = ["scale", "corpus", "variant", "tokens", "n_pairs", "dloss", "low", "high", "p_value", "point", "read"]
SAME_STEP, INTERPOLATED, FINAL = "same step", "interpolated", "final pass"


def paired_curves(
    finals: pd.DataFrame, metrics: pd.DataFrame, scales: list[str], variants: list[str], reference: str, level: float = 0.95
) -> pd.DataFrame:
    """Per (scale, corpus, non-reference variant, eval point) the seed-paired loss difference.

    finals: curves.run_finals rows (run_uuid, scale, variant, seed, extend, complete, tokens,
    final_ppl; corpus when tagged); metrics: query_study's metric rows (run_uuid, key, step =
    tokens, value). Only finished planned runs with a final perplexity (the tables' runs).
    Columns: COLUMNS. tokens: the variant's tokens seen at the point; n_pairs: seeds paired
    there; dloss: mean d_s (nats/token); low, high: its `level` paired t interval (NaN with
    fewer than 2 pairs); p_value: two-sided paired t-test; point: "eval" or "final"; read: how
    the reference's loss was read ("same step", "interpolated" when any seed's was, "final
    pass"). Rows in scale order, then variant order, then tokens; empty when nothing pairs.
    """
    f = finals[(finals["extend"] == 1.0) & finals["complete"] & finals["seed"].notna()].copy()
    f["corpus"] = f["corpus"].fillna("").astype(str) if "corpus" in f else ""
    m = metrics[(metrics["key"] == PPL) & metrics["run_uuid"].isin(f["run_uuid"])]
    m = m[np.isfinite(m["value"]) & (m["value"] > 0) & (m["step"] > 0)].sort_values(["run_uuid", "step"], kind="stable")
    m = m.drop_duplicates(["run_uuid", "step"], keep="last")  # a step logged twice (a resumed run): its latest value
    curve = {rid: (g["step"].to_numpy(float), np.log(g["value"].to_numpy(float))) for rid, g in m.groupby("run_uuid", sort=False)}
    rows: list[dict] = []
    for scale in scales:
        for corpus, g in f[f["scale"] == scale].groupby("corpus", sort=True):
            ref = g[g["variant"] == reference]
            for v in variants:
                arm = g[g["variant"] == v]
                if v == reference or arm.empty or ref.empty:
                    continue
                key = {"scale": scale, "corpus": corpus, "variant": v}
                rows += [key | r for r in _eval_rows(arm, ref, curve, level)]
                rows.append(key | _final_row(arm, ref, level))
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out[out["n_pairs"] > 0].reset_index(drop=True)


def _eval_rows(arm: pd.DataFrame, ref: pd.DataFrame, curve: dict, level: float) -> list[dict]:
    """One row per eval step of the variant's runs with at least one paired seed (a seed's first run where it has several)."""
    arm, ref = arm.drop_duplicates("seed"), ref.drop_duplicates("seed")
    ref_run = dict(zip(ref["seed"].astype(int), ref["run_uuid"]))
    at: dict[float, tuple[dict[int, float], dict[int, float], set[bool]]] = {}
    for seed, rid in zip(arm["seed"].astype(int), arm["run_uuid"]):
        if seed not in ref_run or rid not in curve or ref_run[seed] not in curve:
            continue
        (vs, vl), (rs, rl) = curve[rid], curve[ref_run[seed]]
        inside = (vs >= rs[0]) & (vs <= rs[-1])
        read = np.interp(np.log(vs[inside]), np.log(rs), rl)
        exact = np.isin(vs[inside], rs)
        for t, lv, lr, ex in zip(vs[inside], vl[inside], read, exact):
            var_at, ref_at, how = at.setdefault(float(t), ({}, {}, set()))
            var_at[seed], ref_at[seed] = float(lv), float(lr)
            how.add(bool(ex))
    return [
        _row(t, pd.Series(var_at), pd.Series(ref_at), level, "eval", SAME_STEP if how == {True} else INTERPOLATED)
        for t, (var_at, ref_at, how) in sorted(at.items())
    ]


def _final_row(arm: pd.DataFrame, ref: pd.DataFrame, level: float) -> dict:
    """The final passes paired by seed (verdict.paired_differences' numbers), at the variant's median planned tokens."""
    var, against = (np.log(x["final_ppl"].astype(float)).groupby(x["seed"].astype(int)).mean() for x in (arm, ref))
    return _row(float(arm["tokens"].median()), var, against, level, "final", FINAL)


def _row(tokens: float, var: pd.Series, ref: pd.Series, level: float, point: str, read: str) -> dict:
    c = compare(var, ref, level)
    return {
        "tokens": tokens,
        "n_pairs": int(c["n_pairs"]),
        "dloss": c["paired_dloss"],
        "low": c["paired_low"],
        "high": c["paired_high"],
        "p_value": c["p_value"],
        "point": point,
        "read": read,
    }
