"""Study status from MLflow: one row per run (planned runs not yet started included)."""

from __future__ import annotations

from typing import Any

from orchestrator.track.tracking import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    client_for,
    find_train_runs,
    run_status,
    sqlite_path,
)

STATUS_PLANNED = "planned"  # in the plan, not in MLflow yet (a row of this view only, never a tag)


class StudyNotFound(ValueError):
    """No record of the study in the tracking store (and no spec to list its plan)."""


def study_status(study: str, tracking_uri: str, spec: Any | None = None) -> list[dict[str, Any]]:
    """Rows {run_name, run_id, status, tokens, planned_tokens, val_ppl, note} for a study.

    With the study's spec, planned runs that MLflow does not hold yet appear as ``planned``.
    Reading never creates a store: a missing SQLite file is read as empty.

    Raises:
        StudyNotFound: the store or the experiment does not exist and no spec was given.
    """
    runs: dict[str, Any] = {}
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        if spec is None:
            raise StudyNotFound(f"study {study!r}: no MLflow store at {db} (has it run? else pass --tracking-uri)")
    else:
        client = client_for(tracking_uri)
        exp = client.get_experiment_by_name(study)
        if exp is None and spec is None:
            raise StudyNotFound(f"study {study!r}: no such experiment in the MLflow store")
        runs = find_train_runs(client, exp.experiment_id) if exp is not None else {}
    rows = []
    for run_id, r in runs.items():
        m, t, p = r.data.metrics, r.data.tags, r.data.params
        rows.append({
            "run_name": r.info.run_name, "run_id": run_id, "status": run_status(r),
            "tokens": int(m["tokens"]) if "tokens" in m else None,
            "planned_tokens": int(p["planned_tokens"]) if "planned_tokens" in p else None,
            "val_ppl": m.get("val/ppl"), "note": t.get("failure_reason", "")[:120],
        })
    if spec is not None:
        from orchestrator.plan.planner import plan
        from orchestrator.plan.throughput import throughput_table

        for run in plan(spec, throughput_table(spec)):
            if run.run_id not in runs:
                rows.append({"run_name": run.run_name, "run_id": run.run_id, "status": STATUS_PLANNED, "tokens": None,
                             "planned_tokens": run.tokens, "val_ppl": None, "note": ""})
    order = {STATUS_RUNNING: 0, STATUS_FAILED: 1, STATUS_QUEUED: 2, STATUS_PLANNED: 3, STATUS_FINISHED: 4}
    return sorted(rows, key=lambda r: (order.get(r["status"], 9), r["run_name"]))
