"""The report's tuning table: tuning val loss per learning rate, per variant and scale.

Why: a study with ``tune:`` trains every (variant, scale) at the grid's argmin of tuning
val loss (``orchestrator.plan.tuning.choose_lr``); the report shows the grid it chose from,
the chosen LR, and flags a best LR at an end of the grid (the optimum may lie outside it).
The choice is recomputed here from the tuning runs MLflow holds (kind ``tune``) with the
same function the runner used, so the table and the trained LRs cannot disagree.
"""

from __future__ import annotations

import math

import pandas as pd

from orchestrator.plan.tuning import KIND, TuningResult, choose_lr
from orchestrator.track.tracking import client_for, find_train_runs, run_status

TABLE = "tuning"


def tuning_results(tracking_uri: str, experiment_id: str) -> list[TuningResult]:
    """Every tuning run of the experiment as a `TuningResult` (lr from its ``lr`` param, val
    loss from ``final/val_loss``, status from its tag)."""
    client = client_for(tracking_uri)
    out = []
    for rec in find_train_runs(client, experiment_id, KIND).values():
        t, p = rec.data.tags, rec.data.params
        out.append(
            TuningResult(
                t.get("variant", ""),
                t.get("scale", ""),
                float(p["lr"]),
                int(t.get("seed", 0)),
                rec.data.metrics.get("final/val_loss"),
                run_status(rec),
            )
        )
    return out


def tuning_table(results: list[TuningResult]) -> pd.DataFrame:
    """One row per (variant, scale): ``lr <g>`` columns with the mean tuning val loss over
    seeds (nats/token; inf: a seed failed or diverged; NaN: no result), ``chosen_lr``,
    ``edge`` (``lowest`` / ``highest`` / ``only`` or empty) and ``seeds``. Empty without results."""
    if not results:
        return pd.DataFrame()
    grid = sorted({r.lr for r in results})
    seeds = sorted({r.seed for r in results})
    rows = []
    for (variant, scale), c in sorted(choose_lr(results, grid, seeds).items()):
        row: dict[str, object] = {"variant": variant, "scale": scale}
        row.update({f"lr {g:g}": c.table[g] for g in grid})
        row.update({"chosen_lr": c.lr, "edge": c.edge or "", "seeds": len(seeds), "missing": len(c.missing)})
        rows.append(row)
    return pd.DataFrame(rows)


def tuning_tables(tracking_uri: str, experiment_id: str) -> dict[str, pd.DataFrame]:
    """``{"tuning": table}`` when the study has tuning runs, else ``{}`` (build.py merges it
    into the report's tables)."""
    table = tuning_table(tuning_results(tracking_uri, experiment_id))
    return {TABLE: table} if len(table) else {}


def section_text(table: pd.DataFrame) -> list[str]:
    """The section's sentences: what the numbers are, and every arm whose best LR is at an
    end of the grid."""
    text = [
        "Final `final/val_loss` (nats/token) of the short tuning runs, mean over tuning seeds, per peak "
        "learning rate; each (variant, scale) trained its main runs at `chosen_lr`, the grid's argmin "
        "(inf: a seed failed or diverged)."
    ]
    for _, r in table.iterrows():
        if r["edge"] in ("lowest", "highest"):
            text.append(
                f"`{r['variant']}` @ {r['scale']}: the best LR {r['chosen_lr']:g} is the {r['edge']} of the grid; "
                "the optimum may lie outside it (widen the grid)."
            )
        if r["missing"]:
            text.append(f"`{r['variant']}` @ {r['scale']}: {r['missing']} tuning run(s) without a result.")
    return text


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the report prints it (losses to 4 decimals, '—' for no result)."""

    def f(x: object) -> str:
        return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, ".4f") if isinstance(x, float) else str(x)

    out = table.drop(columns=["missing"]).copy()
    for col in [c for c in out.columns if c.startswith("lr ")]:
        out[col] = out[col].map(f)
    out["chosen_lr"] = out["chosen_lr"].map(lambda x: "—" if x is None or x != x else format(x, "g"))
    return out
