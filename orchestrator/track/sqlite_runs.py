"""A study's runs read straight from an MLflow SQLite store with the stdlib's ``sqlite3``.

Why: ``qkstudy status`` of the embedded store needs each run's tags, params and latest
metrics, and importing MLflow's client (about 1.1 s) plus opening its SQLAlchemy store (about
0.6 s, BENCHMARKS.md, the CLI-latency goal) cost more than the whole command may. The report reads
the same tables in bulk (``orchestrator.report.query``, "SQL path"); this reader is its
row-sized counterpart: ``runs``, ``tags``, ``params`` and ``latest_metrics`` of MLflow 3's
schema, read-only. It returns what ``tracking.find_train_runs`` returns through the client
(the same runs, keyed the same way, with the same fields: tested against it), and raises
``sqlite3.Error`` on a schema it cannot read, so the caller can fall back to the client.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from orchestrator.track.tracking import KIND_TAG, KIND_TRAIN, run_tag


@dataclass(frozen=True)
class StoredRunInfo:
    """The attributes of an MLflow run that status reads (``mlflow.entities.RunInfo``'s names)."""

    run_id: str
    run_name: str
    status: str
    start_time: int | None


@dataclass(frozen=True)
class StoredRunData:
    """Latest metric values (NaN where MLflow stored NaN), tags and params, as ``RunData``."""

    metrics: dict[str, float]
    tags: dict[str, str | None]  # None: a value MLflow stored as NULL
    params: dict[str, str | None]


@dataclass(frozen=True)
class StoredRun:
    """One MLflow run: ``info`` and ``data``, the two fields of ``mlflow.entities.Run`` read here."""

    info: StoredRunInfo
    data: StoredRunData


# MLflow orders NULL start times last; run_uuid breaks ties (SqlAlchemyStore's order clauses).
_RUNS = (
    "SELECT run_uuid, name, status, start_time FROM runs WHERE experiment_id = ? AND lifecycle_stage = 'active' "
    "ORDER BY start_time IS NULL, start_time ASC, run_uuid ASC"
)
_PER_RUN = {  # what fills each field of StoredRunData; joined to the experiment's active runs
    "tags": "SELECT x.run_uuid, x.key, x.value FROM tags x",
    "params": "SELECT x.run_uuid, x.key, x.value FROM params x",
    "metrics": "SELECT x.run_uuid, x.key, x.value, x.is_nan FROM latest_metrics x",
}
_JOIN = " JOIN runs r ON r.run_uuid = x.run_uuid WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active'"
DEFAULT_WORKSPACE = "default"  # MLflow 3's experiments are unique per (workspace, name); the client's default


def _experiment_id(conn: sqlite3.Connection, study: str) -> int | None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(experiments)")}
    where, args = "name = ?", [study]
    if "workspace" in columns:
        where, args = where + " AND workspace = ?", [study, DEFAULT_WORKSPACE]
    row = conn.execute(f"SELECT experiment_id FROM experiments WHERE {where}", args).fetchone()
    return None if row is None else row[0]


def _read(conn: sqlite3.Connection, study: str) -> tuple[list[tuple], dict[str, dict[str, dict[str, object]]]] | None:
    """(active runs, {field: {run uuid: {key: value}}}) of the study's experiment, or None."""
    eid = _experiment_id(conn, study)
    if eid is None:
        return None
    runs = conn.execute(_RUNS, (eid,)).fetchall()
    fields: dict[str, dict[str, dict[str, object]]] = {name: {uuid: {} for uuid, *_ in runs} for name in _PER_RUN}
    for name, select in _PER_RUN.items():
        for uuid, key, value, *nan in conn.execute(select + _JOIN, (eid,)):
            if uuid in fields[name]:
                fields[name][uuid][key] = math.nan if nan and nan[0] else (float(value) if nan else value)
    return runs, fields


def sqlite_runs(db: Path, study: str, kind: str = KIND_TRAIN) -> dict[str, StoredRun] | None:
    """The active runs of experiment ``study`` (MLflow's default workspace) whose
    ``qkstudy.kind`` tag is ``kind``, keyed by their ``run_id`` tag (else MLflow's run id), the
    newest by start time winning: the mapping ``find_train_runs`` builds through the client.
    None when the store has no experiment of that name (whatever its lifecycle stage:
    ``get_experiment_by_name`` finds deleted ones too). One read transaction: a driver that
    creates or updates runs meanwhile is seen before or after, never half.

    Raises:
        sqlite3.Error: the file is not a SQLite database or lacks MLflow's tables or columns.
    """
    with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)) as conn:
        conn.execute("BEGIN")  # one snapshot for every SELECT below
        try:
            found = _read(conn, study)
        finally:
            conn.execute("COMMIT")
    if found is None:
        return None
    runs, fields = found
    out: dict[str, StoredRun] = {}
    for uuid, name, status, start in runs:
        tags = _text(fields["tags"][uuid])
        if tags.get(KIND_TAG) != kind:
            continue
        metrics = {k: float(v) for k, v in fields["metrics"][uuid].items()}  # type: ignore[arg-type]
        data = StoredRunData(metrics, tags, _text(fields["params"][uuid]))
        out[run_tag(tags, "run_id") or uuid] = StoredRun(StoredRunInfo(uuid, name or "", status, start), data)
    return out


def _text(values: dict[str, object]) -> dict[str, str | None]:
    """Tag or param values as MLflow's client gives them: text, or None for a NULL."""
    return {k: None if v is None else str(v) for k, v in values.items()}
