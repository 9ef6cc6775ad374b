"""The tables ``qkstudy`` prints (rich), kept apart from the command wiring in ``cli.py``.

Each function takes what a stage returned and gives back something ``Console.print`` shows;
none of them computes a number (device-hours come from ``orchestrator.plan.throughput``).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from orchestrator.plan.throughput import ThroughputTable, device_hours
from orchestrator.track.tracking import redact_uri


def plan_table(study: Any, runs: list[Any], throughput: ThroughputTable) -> tuple[Table, str]:
    """The plan (one row per run, device-hours where the throughput is known) and its total line."""
    hours = {r.run_id: device_hours(r, throughput) for r in runs}
    t = Table(title=f"{study.name}: {len(runs)} runs, budget mode {study.budget.mode} (N = non-embedding parameters)")
    cols = ["run_id", "variant", "scale", "seed", "extend", "N", "N total", "FLOPs/token", "tokens", "steps", "total FLOPs",
            "est. device-h"]
    for c in cols:
        t.add_column(c, justify="right" if c not in ("run_id", "variant", "scale") else "left")
    for r in runs:
        h = hours[r.run_id]
        t.add_row(r.run_id, r.variant, r.scale, str(r.seed), f"{r.extend:g}", f"{r.n_params:,}", f"{r.n_params_total:,}",
                  f"{r.flops_per_token:,}", f"{r.tokens:,}", f"{r.steps:,}", f"{r.total_flops:.3e}",
                  f"{h:.2f}" if h is not None else "-")
    known = [h for h in hours.values() if h is not None]
    source = "the spec" if study.budget.throughput else "calibration"
    est = (f", {sum(known):,.1f} device-hours (throughput from {source})" if len(known) == len(runs)
           else " (device-hours: run `qkstudy calibrate SPEC` or declare budget.throughput)")
    return t, f"total: {sum(r.tokens for r in runs):,} tokens, {sum(r.total_flops for r in runs):.3e} FLOPs" + est


def calibration_table(study: Any, table: ThroughputTable) -> Table:
    """Measured tokens/s: one row per scale, one column per variant."""
    t = Table(title=f"{study.name}: tokens/s per run ({study.resources.workers} worker(s))")
    t.add_column("scale")
    for v in study.variants:
        t.add_column(v.name, justify="right")
    for scale, row in table.items():
        t.add_row(scale, *[f"{row[v.name]:,.0f}" for v in study.variants])
    return t


def status_table(name: str, uri: str, rows: list[dict[str, Any]]) -> Table:
    """``study_status`` rows, under a title naming the (redacted) tracking URI."""
    t = Table(title=f"{name}: {len(rows)} runs ({redact_uri(uri)})")
    for c in ("run", "run_id", "status", "tokens", "planned", "val ppl", "note"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["run_name"], r["run_id"], r["status"], f"{r['tokens']:,}" if r["tokens"] is not None else "-",
                  f"{r['planned_tokens']:,}" if r["planned_tokens"] else "-",
                  f"{r['val_ppl']:.2f}" if r["val_ppl"] is not None else "-", r["note"])
    return t
