"""Where a study's worker time went: optimizer steps against everything else.

Why: a study's cost is what a researcher pays for an answer, and time outside optimizer steps
(start-up, evaluations, checkpoints, logging) buys no training. Each finished run logs its
split once, at its last step (``run.worker.loop.RunLoop.time_split``: ``time/elapsed_s`` from the
worker loop's start and the watchdog's exclusive section totals ``time/{startup,step,eval,diag,
checkpoint}_s``; earlier attempts' figures as of their last checkpoint added). Attention
diagnostics (``time/diag_s``, logged since they got a cadence of their own) count as evaluation
here, as they did inside ``time/eval_s`` before, so older stores' tables read the same. Here they are
summed per variant and over the study. Not in it: the driver's own start-up (Ray, data
preparation), each pack's Ray Train worker-group start, the gaps between runs, failed runs,
and what an attempt trained after its last checkpoint before it died. A store from before the
split existed says so and gets no table; finished runs without a split are counted and said.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from orchestrator.report.parts.base import PartInput, Section

TABLE = "time_split"
SECTIONS = ("startup", "step", "eval", "checkpoint")
KEYS = {"elapsed": "time/elapsed_s", **{s: f"time/{s}_s" for s in SECTIONS}, "diag": "time/diag_s"}
COLUMNS = ["variant", "runs", "elapsed_s", *(f"{s}_s" for s in SECTIONS), "other_s", "outside_steps"]
GOAL = 0.05  # at most 5% of a run's wall-clock outside optimizer steps (BENCHMARKS.md)
NOT_RECORDED = "time split not recorded"


def time_split_table(runs: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame | None:
    """One row per variant and an ``all`` row: finished runs that logged a split (``runs``),
    their summed seconds (``elapsed_s``, ``<section>_s``; ``other_s`` = elapsed minus the
    sections: logging and the loop) and ``outside_steps`` = 1 - step_s / elapsed_s (a
    fraction). ``runs``/``metrics``: ``query.StudyData``'s frames. None when no run logged one."""
    last = (
        metrics[metrics["key"].isin(KEYS.values())]
        .sort_values(["step", "timestamp"], kind="stable")
        .groupby(["run_uuid", "key"])["value"]
        .last()
        .unstack()
    )
    if last.empty or KEYS["elapsed"] not in last:
        return None
    last = last.dropna(subset=[KEYS["elapsed"]]).reindex(columns=list(KEYS.values()), fill_value=0.0).fillna(0.0)
    last = last.join(runs.set_index("run_uuid")["variant"], how="inner")
    groups = [(str(v), g) for v, g in last.groupby("variant", sort=True)] + [("all", last)]
    rows = []
    for name, g in groups:
        row: dict[str, Any] = {"variant": name, "runs": len(g), "elapsed_s": float(g[KEYS["elapsed"]].sum())}
        for s in SECTIONS:
            row[f"{s}_s"] = float(g[KEYS[s]].sum())
        row["eval_s"] += float(g[KEYS["diag"]].sum())  # diagnostics are part of an evaluation
        row["other_s"] = row["elapsed_s"] - sum(row[f"{s}_s"] for s in SECTIONS)
        row["outside_steps"] = 1.0 - row["step_s"] / row["elapsed_s"] if row["elapsed_s"] > 0 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def summary_entry(table: pd.DataFrame | None, finished: int) -> dict[str, Any]:
    """summary.json's ``time_split``: recorded, ``finished`` (finished training runs), and for
    the study (the ``all`` row) runs with a split, the seconds per part, ``outside_steps`` and
    ``meets_goal`` (outside steps <= ``GOAL``)."""
    if table is None:
        return {"recorded": False, "finished": finished, "note": NOT_RECORDED}
    total = table[table["variant"] == "all"].iloc[0].to_dict()
    return {
        "recorded": True,
        "finished": finished,
        **{k: total[k] for k in COLUMNS[1:]},
        "goal": GOAL,
        "meets_goal": bool(total["outside_steps"] <= GOAL),
    }


def section_text(entry: dict[str, Any]) -> list[str]:
    """The section's sentences: the share outside steps, its parts, and what is not counted."""
    if not entry["recorded"]:
        why = (
            "no finished training run logged one (runs from before it existed; each finished run logs `time/*_s` at its last step)"
            if entry.get("finished")
            else "no training run finished"
        )
        return [f"{NOT_RECORDED.capitalize()}: {why}."]
    e = entry["elapsed_s"]
    parts = ", ".join(
        f"{name} {entry[f'{k}_s'] / e:.1%}"
        for k, name in (
            ("startup", "start-up"),
            ("eval", "evaluation"),
            ("checkpoint", "checkpoints and final weights"),
            ("other", "logging and the loop"),
        )
    )
    verdict = "within" if entry["meets_goal"] else "over"
    plural = "s" if entry["finished"] != 1 else ""
    runs = (
        f"{entry['runs']} finished training run{plural}"
        if entry["runs"] == entry["finished"]
        else f"{entry['runs']} of {entry['finished']} finished training run{plural} (the others logged no split)"
    )
    return [
        f"{runs} spent {e:,.1f} seconds (rank 0's wall-clock), {1 - entry['outside_steps']:.1%} of "
        f"them in optimizer steps: {entry['outside_steps']:.1%} outside steps ({parts}), {verdict} the "
        f"{GOAL:.0%} goal.",
        "Not counted: the driver's start-up (Ray, data preparation), each worker group's start, the gaps between "
        "runs, tuning and failed runs, and what an attempt trained after its last checkpoint before it died.",
    ]


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the report prints it (seconds to 0.1 s, the share as a percentage)."""
    out = table.copy()
    for c in COLUMNS[2:-1]:
        out[c] = out[c].map(lambda x: f"{x:,.1f}")
    out["outside_steps"] = table["outside_steps"].map(lambda x: "—" if pd.isna(x) else f"{x:.1%}")
    return out.rename(
        columns={
            "elapsed_s": "elapsed (s)",
            "startup_s": "start-up (s)",
            "step_s": "steps (s)",
            "eval_s": "eval (s)",
            "checkpoint_s": "checkpoint (s)",
            "other_s": "other (s)",
            "outside_steps": "outside steps",
        }
    )


def attach(summary: dict, tabs: dict[str, pd.DataFrame], runs: pd.DataFrame, metrics: pd.DataFrame) -> None:
    """Add ``summary["time_split"]`` and, when recorded, the ``time_split`` table."""
    finished = runs[runs["status"] == "finished"] if "status" in runs else runs
    table = time_split_table(finished, metrics)
    summary["time_split"] = summary_entry(table, len(finished))
    if table is not None:
        tabs[TABLE] = table


class TimeSplitPart:
    """Worker seconds in and outside optimizer steps (``attach``), read after the cost section."""

    name, after = TABLE, "cost"

    def build(self, given: PartInput) -> None:
        """Add the split of the report's runs (``attach``)."""
        attach(given.summary, given.tables, given.data.runs, given.data.metrics)

    def section(self, summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
        """ "Where the time went", or that the runs recorded no split."""
        entry = summary.get("time_split") or {"recorded": False}
        return Section("Where the time went", section_text(entry), display(tables[TABLE]) if TABLE in tables else None)


PART = TimeSplitPart()
