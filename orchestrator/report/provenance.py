"""Code: which commit(s) the study's runs came from (``track.provenance`` tags).

A study resumed or resubmitted from another checkout mixes code, and a dirty checkout's
commit is not the code that ran: the report names each (commit, dirty) with its run count, so
a reader sees both before trusting a comparison. Runs from before provenance was recorded (or
written by other tools) count as ``not recorded``; they never fail the report.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from orchestrator.track.provenance import COMMIT_TAG, DIRTY_TAG, NOT_A_CHECKOUT, SOURCE_TAG

SHORT = 7  # characters of a commit shown in the report (the summary keeps the full sha)


def _column(runs: pd.DataFrame, tag: str) -> pd.Series:
    name = f"tags.{tag}"
    return runs[name] if name in runs.columns else pd.Series(None, index=runs.index, dtype=object)


def code_summary(runs: pd.DataFrame) -> dict[str, Any]:
    """The summary's ``code`` entry from ``query.StudyData.runs``: ``commits`` ([{commit, dirty,
    runs}], most runs first, then by commit), ``not_a_checkout`` (runs whose driver ran
    outside a git checkout) and ``not_recorded`` (runs without provenance tags) counts."""
    commit, dirty, source = _column(runs, COMMIT_TAG), _column(runs, DIRTY_TAG), _column(runs, SOURCE_TAG)
    counts: dict[tuple[str, bool], int] = {}
    outside = missing = 0
    for c, d, s in zip(commit, dirty, source, strict=True):
        if isinstance(c, str) and c:
            key = (c, d == "true")
            counts[key] = counts.get(key, 0) + 1
        elif s == NOT_A_CHECKOUT:
            outside += 1
        else:
            missing += 1
    commits = [{"commit": c, "dirty": d, "runs": n} for (c, d), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {"commits": commits, "not_a_checkout": outside, "not_recorded": missing}


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def code_line(code: dict[str, Any]) -> str:
    """One sentence from ``code_summary``: ``Code: 809a755 (dirty) 6 runs; not recorded: 0 runs``."""
    parts = [f"`{c['commit'][:SHORT]}`" + (" (dirty)" if c["dirty"] else "") + f" {_runs(c['runs'])}" for c in code["commits"]]
    if code.get("not_a_checkout"):
        parts.append(f"not a checkout: {_runs(code['not_a_checkout'])}")
    parts.append(f"not recorded: {_runs(code.get('not_recorded', 0))}")
    return "Code: " + "; ".join(parts) + "."


def merge_codes(codes: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``code_summary`` from several (a several-corpora study's per-corpus reports)."""
    counts: dict[tuple[str, bool], int] = {}
    for code in codes:
        for c in code["commits"]:
            counts[(c["commit"], c["dirty"])] = counts.get((c["commit"], c["dirty"]), 0) + c["runs"]
    return {
        "commits": [{"commit": c, "dirty": d, "runs": n} for (c, d), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))],
        "not_a_checkout": sum(c.get("not_a_checkout", 0) for c in codes),
        "not_recorded": sum(c.get("not_recorded", 0) for c in codes),
    }
