"""The report's tables (one CSV each): final perplexity, token ratio, run problems.

Every table is sorted by scale (by N) then variant (reference first). Numbers come from
curves.py (finals), ratio.py (token ratios) and verdict.py (paired differences); nothing
here computes a statistic of its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from orchestrator.report.stats.paper import paper_ppl

FINAL_COLUMNS = [
    "scale",
    "variant",
    "n_params",
    "n_params_total",
    "tokens",
    "mean_ppl",
    "std",
    "n_seeds",
    "change_vs_reference_pct",
    "paired_change_pct",
    "paired_change_low",
    "paired_change_high",
    "paper_ppl",
    "paper_change_pct",
]
RATIO_COLUMNS = [
    "scale",
    "variant",
    "token_ratio",
    "interval_95",
    "single_run_estimate",
    "single_run_flag",
    "flop_ratio",
    "wall_ratio",
    "value",
    "censored",
    "ci_low",
    "ci_high",
    "interval_method",
    "target_ppl",
    "target_tokens",
    "reference_extends",
    "note",
]
ISSUE_COLUMNS = ["problem", "run_name", "variant", "scale", "seed", "extend", "detail"]


def in_order(df: pd.DataFrame, scales: list[str], variants: list[str]) -> pd.DataFrame:
    """Rows sorted by scale (by N) then variant (reference first), as every other table."""
    key = {(s, v): (i, j) for i, s in enumerate(scales) for j, v in enumerate(variants)}
    return df.iloc[sorted(range(len(df)), key=lambda i: key.get((df["scale"].iat[i], df["variant"].iat[i]), (1e9, 1e9)))].reset_index(
        drop=True
    )


def final_table(finals: pd.DataFrame, scales: list[str], variants: list[str], reference: str, paired: pd.DataFrame) -> pd.DataFrame:
    """Final val ppl per scale x variant (planned runs): seed mean and std, the change of the
    seed mean vs the reference, the seed-paired change with its interval (verdict.py, in
    percent of perplexity), and the paper's numbers beside."""
    f = finals[(finals["extend"] == 1.0) & finals["complete"]]
    g = f.groupby(["scale", "variant"]).agg(
        n_params=("n_params", "median"),
        n_params_total=("n_params_total", "median"),
        tokens=("tokens", "mean"),
        mean_ppl=("final_ppl", "mean"),
        std=("final_ppl", "std"),
        n_seeds=("final_ppl", "size"),
    )
    pair = paired.set_index(["scale", "variant"]) if len(paired) else None
    rows = []
    for s in scales:
        ref = g.loc[(s, reference), "mean_ppl"] if (s, reference) in g.index else np.nan
        pref = paper_ppl(s, reference)
        for v in variants:
            if (s, v) not in g.index:
                continue
            r, p = g.loc[(s, v)], paper_ppl(s, v)
            pr = pair.loc[(s, v)] if pair is not None and (s, v) in pair.index else None
            rows.append(
                {
                    "scale": s,
                    "variant": v,
                    "n_params": r["n_params"],
                    "n_params_total": r["n_params_total"],
                    "tokens": r["tokens"],
                    "mean_ppl": r["mean_ppl"],
                    "std": r["std"],
                    "n_seeds": int(r["n_seeds"]),
                    "change_vs_reference_pct": 100.0 * (r["mean_ppl"] / ref - 1.0) if np.isfinite(ref) else np.nan,
                    "paired_change_pct": np.nan if pr is None else pr["paired_ppl_pct"],
                    "paired_change_low": np.nan if pr is None else pr["paired_ppl_pct_low"],
                    "paired_change_high": np.nan if pr is None else pr["paired_ppl_pct_high"],
                    "paper_ppl": None if p is None else (f"{p[0]:g}" if p[0] == p[1] else f"{p[0]:g}-{p[1]:g}"),
                    "paper_change_pct": None if (p is None or pref is None) else 100.0 * (sum(p) / sum(pref) - 1.0),
                }
            )
    return pd.DataFrame(rows, columns=FINAL_COLUMNS)


def ratio_table(ratios: list[dict]) -> pd.DataFrame:
    """One row per (scale, variant) token ratio (ratio.RatioResult.to_dict entries)."""
    return pd.DataFrame(
        [
            {
                "scale": r["scale"],
                "variant": r["variant"],
                "token_ratio": r["token_ratio"]["display"],
                "interval_95": r["interval_display"],
                "single_run_estimate": r["single_run"]["display"],
                "single_run_flag": r["single_run_flag"] or "",
                "flop_ratio": r["flop_ratio"]["display"],
                "wall_ratio": r["wall_ratio"]["display"],
                "value": r["token_ratio"]["value"],
                "censored": r["token_ratio"]["censored"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
                "interval_method": r["ci_method"] or "",
                "target_ppl": r["target_ppl"],
                "target_tokens": r["target_tokens"],
                "reference_extends": " ".join(f"x{e:g}" for e in r["ref_extends"]),
                "note": r["token_ratio"]["reason"] or r["ci_note"] or "",
            }
            for r in ratios
        ],
        columns=RATIO_COLUMNS,
    )


def run_status(finals: pd.DataFrame, expected) -> dict:
    """Failed, incomplete (running, or finished without final/val_ppl) and missing runs.

    expected: planned runs (dicts with variant, scale, seed, extend, optionally flops: its training
    FLOPs) or None for the grid the runs present imply (inferred_grid). Returns counts, the three
    lists and their "table", and "planned_flops" (the plan's total when every run gives flops, else
    None; each missing run then carries its own).
    """
    recs = finals.to_dict(orient="records")
    failed = [_issue(r, "failed") for r in recs if r["status"] == "failed"]
    incomplete = [
        _issue(r, "incomplete") | {"detail": f"status {r['status']}" + ("" if r["status"] != "finished" else ", no final/val_ppl")}
        for r in recs
        if r["status"] != "failed" and not r["complete"]
    ]
    expected_from = "inferred grid (variants x scales x seeds, reference extend levels)" if expected is None else "plan"
    present = {(r["variant"], r["scale"], None if pd.isna(r["seed"]) else int(r["seed"]), float(r["extend"])) for r in recs}
    if expected is None:
        grid = inferred_grid(finals)
    else:
        grid = {(e["variant"], e["scale"], int(e["seed"]), float(e.get("extend", 1.0))) for e in expected}
    missing = [
        {"problem": "missing", "run_name": "", "variant": v, "scale": s, "seed": sd, "extend": e, "detail": "planned but no MLflow run"}
        for v, s, sd, e in sorted(grid - present, key=lambda k: (k[1], k[0], k[3], k[2]))
    ]
    # A plan that gives each run's training FLOPs: what a missing (or gated) run would have cost.
    flops = {(e["variant"], e["scale"], int(e["seed"]), float(e.get("extend", 1.0))): e["flops"] for e in expected or [] if "flops" in e}
    for m in missing:
        if (key := (m["variant"], m["scale"], m["seed"], m["extend"])) in flops:
            m["flops"] = flops[key]
    return {
        "planned_flops": float(sum(flops.values())) if expected and len(flops) == len(expected) else None,
        "total": len(recs),
        "finished": int(finals["complete"].sum()),
        "failed": failed,
        "incomplete": incomplete,
        "missing": missing,
        "expected_from": expected_from,
        "table": pd.DataFrame(failed + incomplete + missing, columns=ISSUE_COLUMNS),
    }


def _issue(r: dict, problem: str) -> dict:
    seed = r.get("seed")
    return {
        "problem": problem,
        "run_name": r.get("run_name") or "",
        "variant": r.get("variant"),
        "scale": r.get("scale"),
        "seed": None if seed is None or pd.isna(seed) else int(seed),
        "extend": float(r.get("extend", 1.0)),
        "detail": r.get("failure_reason") if isinstance(r.get("failure_reason"), str) else "",
    }


def inferred_grid(finals: pd.DataFrame) -> set[tuple]:
    """The plan as the runs present imply it.

    Planned runs (x1): every variant x scale x seed seen at x1. Extend runs: each variant's
    extend levels x every scale x the seeds seen in that variant's extend runs (a study may
    extend only some seeds).
    """
    scales = finals["scale"].dropna().unique()

    def ints(s):
        return {int(v) for v in s.dropna()}

    x1_seeds = ints(finals.loc[finals["extend"] == 1.0, "seed"])
    grid = set()
    for v, g in finals.groupby("variant"):
        grid |= {(v, s, sd, 1.0) for s in scales for sd in x1_seeds}
        ext = g[g["extend"] != 1.0]
        ext_seeds = ints(ext["seed"])
        for e in set(ext["extend"]):
            grid |= {(v, s, sd, float(e)) for s in scales for sd in ext_seeds}
    return grid
