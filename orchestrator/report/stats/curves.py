"""Per-run final numbers and seed-aggregated curves (val perplexity vs tokens, FLOPs, seconds).

A run's final perplexity is its `final/val_ppl` metric (the full validation pass at its
planned tokens); a run without it, or not finished, has no final value and is listed as
incomplete by the report. Curves average the seeds of one (scale, variant, extend) group at
equal steps (same plan = same eval steps); the spread is the seeds' standard deviation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PPL = "val/ppl"
WALL = "time/wall_s"
FINAL_PPL = "final/val_ppl"
FINAL_ACC = "final/val_accuracy"  # MQAR corpora: argmax = target on labelled positions (DESIGN.md)
GROUP = ["scale", "variant", "extend"]


def last_value(metrics: pd.DataFrame, key: str) -> pd.Series:
    """Last value (highest step, then latest timestamp) of `key` per run_uuid."""
    m = metrics[metrics["key"] == key]
    return m.drop_duplicates("run_uuid", keep="last").set_index("run_uuid")["value"]


def run_finals(runs: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per run with its final numbers.

    Adds to the run table: tokens (planned tokens, else last step), final_ppl (NaN when the run
    is not finished or lacks final/val_ppl), final_wall_s (seconds, last time/wall_s),
    final_flops (tokens x flops_per_token, training FLOPs), complete (bool), final_accuracy
    (final/val_accuracy of a finished run, NaN where not logged).
    Requires metrics sorted by run_uuid, key, step (as query_study returns them).
    """
    out = runs.copy()
    idx = out["run_uuid"]
    final = last_value(metrics, FINAL_PPL).reindex(idx).to_numpy()
    last_step = metrics.groupby("run_uuid")["step"].max()
    out["tokens"] = out["planned_tokens"].fillna(last_step.reindex(idx).astype(float).set_axis(out.index))
    out["final_wall_s"] = last_value(metrics, WALL).reindex(idx).to_numpy()
    out["final_flops"] = out["tokens"] * out["flops_per_token"]
    out["complete"] = (out["status"] == "finished") & np.isfinite(final)
    out["final_ppl"] = np.where(out["complete"], final, np.nan)
    acc = last_value(metrics, FINAL_ACC).reindex(idx).to_numpy()
    out["final_accuracy"] = np.where(out["status"] == "finished", acc, np.nan)
    return out


def curve_stats(runs: pd.DataFrame, metrics: pd.DataFrame, key: str = PPL) -> pd.DataFrame:
    """Seed mean and std of metric `key` per (scale, variant, extend, step) over finished runs.

    Columns: scale, variant, extend, step (tokens), mean, std (ddof=1, NaN for one seed),
    n_seeds, flops (step x flops_per_token, mean), wall_s (mean seconds at that step, from
    time/wall_s interpolated per run in tokens).
    """
    done = runs[runs["status"] == "finished"]
    m = metrics[metrics["key"] == key].merge(done[["run_uuid", *GROUP, "flops_per_token"]], on="run_uuid")
    if m.empty:
        return pd.DataFrame(columns=[*GROUP, "step", "mean", "std", "n_seeds", "flops", "wall_s"])
    wall = metrics[(metrics["key"] == WALL) & metrics["run_uuid"].isin(done["run_uuid"])]
    m["wall_s"] = _interp_per_run(m, wall)
    m["flops"] = m["step"] * m["flops_per_token"]
    g = m.groupby([*GROUP, "step"], sort=True, observed=True)
    out = g.agg(mean=("value", "mean"), std=("value", "std"), n_seeds=("value", "size"), flops=("flops", "mean"), wall_s=("wall_s", "mean"))
    return out.reset_index()


def _interp_per_run(points: pd.DataFrame, wall: pd.DataFrame) -> np.ndarray:
    """time/wall_s of each row of `points` at its step, by linear interpolation within its run."""
    out = np.full(len(points), np.nan)
    if wall.empty:
        return out
    wall_groups = {rid: (g["step"].to_numpy(float), g["value"].to_numpy(float)) for rid, g in wall.groupby("run_uuid", sort=False)}
    steps = points["step"].to_numpy(float)
    for rid, rows in points.groupby("run_uuid", sort=False).indices.items():
        w = wall_groups.get(rid)
        if w is not None and len(w[0]):
            out[rows] = np.interp(steps[rows], w[0], w[1], left=np.nan, right=np.nan)
    return out


def seed_std(finals: pd.DataFrame) -> pd.DataFrame:
    """Seed standard deviation (ddof=1) of final perplexity per scale and variant, planned runs only.

    Columns: scale, variant, mean, std, n_seeds. std is NaN with one seed.
    """
    f = finals[(finals["extend"] == 1.0) & finals["complete"]]
    g = f.groupby(["scale", "variant"], sort=True)["final_ppl"]
    return g.agg(mean="mean", std="std", n_seeds="size").reset_index()


def _planned_complete(finals: pd.DataFrame) -> pd.DataFrame:
    return finals[(finals["extend"] == 1.0) & finals["complete"]]


def accuracy_table(finals: pd.DataFrame) -> pd.DataFrame:
    """MQAR accuracy (final/val_accuracy, fraction of labelled positions right) of the planned
    (x1) finished runs per scale and variant. Columns: scale, variant, mean, std (ddof=1, NaN
    with one seed), n_seeds. Empty when no run logged it."""
    f = finals[(finals["extend"] == 1.0) & np.isfinite(finals["final_accuracy"])]
    g = f.groupby(["scale", "variant"], sort=True)["final_accuracy"]
    return g.agg(mean="mean", std="std", n_seeds="size").reset_index()


def paired_cost(finals: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Training wall-clock of each variant's planned (x1) runs against the reference's run of
    the same scale and seed: same corpus, seed and (FLOP-matched studies) FLOP budget.

    time/wall_s counts the seconds of training steps only (evals and checkpoints excluded).
    Columns: scale, variant, wall_s (seed mean, seconds), wall_ratio and wall_ratio_std (run
    over the reference's run: mean and std over seeds), time_per_token_ratio and
    time_per_token_ratio_std (seconds per token over the reference's), n_pairs.
    """
    f = _planned_complete(finals)
    f = f[np.isfinite(f["final_wall_s"]) & (f["final_wall_s"] > 0)]
    ref = f[f["variant"] == reference][["scale", "seed", "final_wall_s", "tokens"]]
    m = f.merge(ref.rename(columns={"final_wall_s": "ref_wall_s", "tokens": "ref_tokens"}), on=["scale", "seed"])
    m["wall_ratio"] = m["final_wall_s"] / m["ref_wall_s"]
    m["tpt_ratio"] = (m["final_wall_s"] / m["tokens"]) / (m["ref_wall_s"] / m["ref_tokens"])
    g = m.groupby(["scale", "variant"], sort=True)
    return g.agg(
        wall_s=("final_wall_s", "mean"),
        wall_ratio=("wall_ratio", "mean"),
        wall_ratio_std=("wall_ratio", "std"),
        time_per_token_ratio=("tpt_ratio", "mean"),
        time_per_token_ratio_std=("tpt_ratio", "std"),
        n_pairs=("wall_ratio", "size"),
    ).reset_index()


ATTENTION_KEYS = {"effective_rank": "attn/effective_rank", "entropy": "attn/entropy"}


def final_attention(finals: pd.DataFrame, metrics: pd.DataFrame, keys: dict[str, str] | None = None) -> pd.DataFrame:
    """Attention diagnostics at the last eval of each planned (x1) finished run, over seeds.

    Columns: scale, variant, then for each name in ``keys`` (column -> metric key, see
    model.diagnostics) its seed mean and ``<name>_std``; n_seeds. Metrics never logged give NaN.
    """
    f = _planned_complete(finals)[["run_uuid", "scale", "variant"]].copy()
    agg: dict[str, tuple[str, str]] = {}
    for name, key in (keys or ATTENTION_KEYS).items():
        f[name] = last_value(metrics, key).reindex(f["run_uuid"]).to_numpy()
        agg[name], agg[f"{name}_std"] = (name, "mean"), (name, "std")
    return f.groupby(["scale", "variant"], sort=True).agg(**agg, n_seeds=("run_uuid", "size")).reset_index()
