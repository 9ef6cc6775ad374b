"""Start-up: where each run's seconds before its first optimizer step went.

Why: a short study's wall-clock is mostly start-up (Ray, Ray Train's worker group, the
DeepSpeed engine), and what is not shown is not cut. Each attempt of a run logs its timeline at
its first optimizer step (``track.timeline``: ``startup/<section>_s`` and ``startup/total_s``).
Here the first attempt of each finished run counts (the earliest ``startup/total_s``), split by
where its timeline began: at the command (a run that opened its worker group) or in the worker
(a later run of its worker group, timed from where the previous run ended, or a run whose worker
group restarted before its first step, timed from the restart). A store from before the
timeline existed gets no section.
"""

from __future__ import annotations

import pandas as pd

from orchestrator.report.parts.base import PartInput, Section
from orchestrator.track.timeline import PREFIX, SECTIONS, TOTAL

TABLE = "startup"
COLUMNS = ["runs_from", "section", "runs", "median_s", "max_s"]
FIRST, LATER = "the command", "the worker (a previous run or a restart)"


def startup_table(runs: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame | None:
    """Rows (``COLUMNS``) per kind of run (``runs_from``: ``FIRST`` for a run that opened its
    worker group, ``LATER`` for one that followed another in it) and section, in ``SECTIONS``
    order then ``total``: how many runs logged it, its median and max seconds. ``runs`` /
    ``metrics``: ``query.StudyData``'s frames. None when no run logged a timeline."""
    m = metrics[metrics["key"].str.startswith(PREFIX) & metrics["run_uuid"].isin(runs["run_uuid"])]
    if m.empty or TOTAL not in set(m["key"]):
        return None
    # the first attempt: the timeline logged at the run's earliest step
    first_step = m[m["key"] == TOTAL].groupby("run_uuid")["step"].min()
    m = m[m["step"] == m["run_uuid"].map(first_step)]
    wide = m.sort_values("timestamp", kind="stable").groupby(["run_uuid", "key"])["value"].first().unstack()
    opened = f"{PREFIX}trainer_s"
    kind = wide[opened].notna() if opened in wide else pd.Series(False, index=wide.index)
    order = [f"{PREFIX}{s}_s" for s in SECTIONS] + sorted(set(wide.columns) - {f"{PREFIX}{s}_s" for s in SECTIONS} - {TOTAL}) + [TOTAL]
    rows = []
    for label, group in ((FIRST, wide[kind]), (LATER, wide[~kind])):
        for key in order:
            if key not in group or group[key].isna().all():
                continue
            col = group[key].dropna()
            section = "total" if key == TOTAL else key[len(PREFIX) : -2]
            rows.append({"runs_from": label, "section": section, "runs": len(col), "median_s": col.median(), "max_s": col.max()})
    return pd.DataFrame(rows, columns=COLUMNS)


def section_text(table: pd.DataFrame) -> list[str]:
    """The section's sentences: the median time to the first step per kind of run, and the largest part."""
    out = []
    for label in (FIRST, LATER):
        g = table[table["runs_from"] == label]
        if g.empty:
            continue
        total = g[g["section"] == "total"].iloc[0]
        parts = g[g["section"] != "total"]
        big = parts.loc[parts["median_s"].idxmax()]
        out.append(
            f"{int(total['runs'])} run(s) timed from {label}: first optimizer step after {total['median_s']:.1f} s "
            f"(median; max {total['max_s']:.1f} s), the largest part {big['section']} ({big['median_s']:.1f} s: "
            f"{SECTIONS.get(str(big['section']), big['section'])})."
        )
    return out + ["Each run's first attempt counts; on a multi-node cluster a section that crosses machines includes their clock offset."]


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the report prints it (seconds to 0.01 s)."""
    out = table.copy()
    for c in ("median_s", "max_s"):
        out[c] = out[c].map(lambda x: f"{x:,.2f}")
    return out.rename(columns={"runs_from": "timed from", "median_s": "median (s)", "max_s": "max (s)"})


def attach(summary: dict, tabs: dict[str, pd.DataFrame], runs: pd.DataFrame, metrics: pd.DataFrame) -> None:
    """Add ``summary["startup"]`` (per kind of run: runs and median / max seconds to the first
    step) and the ``startup`` table, when any finished run logged a timeline."""
    finished = runs[runs["status"] == "finished"] if "status" in runs else runs
    table = startup_table(finished, metrics)
    if table is None:
        return
    totals = table[table["section"] == "total"]
    summary["startup"] = {r.runs_from: {"runs": int(r.runs), "median_s": r.median_s, "max_s": r.max_s} for r in totals.itertuples()}
    tabs[TABLE] = table


class StartupPart:
    """Seconds to each run's first optimizer step (``attach``), read after the time split."""

    name, after = TABLE, "time_split"

    def build(self, given: PartInput) -> None:
        """Add the start-up of the report's runs (``attach``)."""
        attach(given.summary, given.tables, given.data.runs, given.data.metrics)

    def section(self, summary: dict, tables: dict[str, pd.DataFrame]) -> Section | None:
        """ "Start-up"; None when no run logged a timeline."""
        if TABLE not in tables:
            return None
        return Section("Start-up", section_text(tables[TABLE]), display(tables[TABLE]))


PART = StartupPart()
