"""Study status from MLflow: one row per run (planned runs not yet started included), with the
leases from the study's storage: who drives the study, who trains each run, heartbeat ages."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.plan.spec import STUDY_NAME_RULE, default_workdir, study_name_ok
from orchestrator.plan.tuning import KIND as KIND_TUNE
from orchestrator.track.lease import DEFAULT_TTL_S, STUDY_LEASE, Holder, dead_here, read_lease, run_lease_name
from orchestrator.track.store_probe import probe_store
from orchestrator.track.tracking import (
    KIND_TRAIN,
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_QUEUED,
    STATUS_RUNNING,
    client_for,
    find_train_runs,
    named_study_uri,
    run_status,
    run_tag,
    sqlite_path,
    study_tracking_uri,
)

STATUS_PLANNED = "planned"  # in the plan, not in MLflow yet (a row of this view only, never a tag)
STATUS_GATED = "gated"  # in the plan, not trained by design: a gated ladder stopped its arm (track.gate_record)


class StudyNotFound(ValueError):
    """No record of the study in the tracking store (and no spec to list its plan)."""


def study_uri(study: str, tracking_uri: str | None = None) -> tuple[str, str]:
    """(study name, tracking URI) of STUDY given as a spec path or a study name: the spec's
    store, else ``tracking_uri``, ``MLFLOW_TRACKING_URI`` or the default work dir's. Raises
    SpecError for a spec that does not validate, StudyNotFound for a name a study cannot have,
    TrackingURIError for a ``tracking_uri`` (or ``MLFLOW_TRACKING_URI``, when it is the one
    used) that MLflow has no store for, StoreUnreachable for a database store that does not
    answer (``track.store_probe``: one bounded attempt, not MLflow's 100 s of retries)."""
    import os

    from orchestrator.plan.spec import load_spec
    from orchestrator.plan.tracking_uri import check_tracking_uri

    if tracking_uri is not None:
        check_tracking_uri(tracking_uri, "--tracking-uri")
    p = Path(study)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        s = load_spec(p)
        name, uri = s.name, tracking_uri or study_tracking_uri(s)
    else:
        if not study_name_ok(study):
            raise StudyNotFound(f"STUDY {study!r} is neither a spec file nor a study name ({STUDY_NAME_RULE})")
        if tracking_uri is None and os.environ.get("MLFLOW_TRACKING_URI"):
            check_tracking_uri(os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI")
        name, uri = study, named_study_uri(study, tracking_uri)
    probe_store(uri)
    return name, uri


def lease_storage(study: str, spec: Any | None = None) -> str:
    """Where the study's leases live: its spec's storage, else the default ``runs/<study>/ray``."""
    return spec.resolved_storage_path if spec is not None else str(default_workdir(study) / "ray")


def _holder(storage: str, name: str) -> Holder | None | str:
    """The lease's live or stale holder, None when free, or why it cannot be read."""
    try:
        return read_lease(storage, name)
    except OSError as e:  # storage not reachable from here (another machine's disk, no credentials)
        return f"unreadable ({type(e).__name__}: {e})"


def describe_holder(h: Holder | None | str) -> str:
    """One line for a lease holder: who and the heartbeat age, noting one past the ttl, or one
    on this machine whose process is gone (a killed driver's: the next driver takes over at
    once, ``lease.dead_here``, so status says so before the ttl runs out)."""
    if h is None or isinstance(h, str):
        return h or ""
    if dead_here(h):
        return h.describe() + " (its process on this machine is gone: dead, the next driver takes over)"
    stale = f" (over {DEFAULT_TTL_S:g} s: presumed dead, the next driver takes over)" if h.age_s() > DEFAULT_TTL_S else ""
    return h.describe() + stale


def study_lease_line(study: str, spec: Any | None = None) -> str:
    """``study lease: held by <holder>, heartbeat N s ago`` or ``study lease: free``."""
    h = _holder(lease_storage(study, spec), STUDY_LEASE)
    return f"study lease: {'held by ' + describe_holder(h) if isinstance(h, Holder) else describe_holder(h) or 'free'}"


def _train_runs(
    study: str, tracking_uri: str, db: Path | None, warn: Callable[[str], None] | None = None, kind: str = KIND_TRAIN
) -> dict[str, Any] | None:
    """The study's training runs (``kind`` tune: its LR-tuning runs) by ``run_id`` tag (None: no such experiment): a SQLite store
    through ``sqlite3`` (no MLflow import: ``track.sqlite_runs``), falling back to MLflow's
    client on a schema that reader does not know; any other store through the client.

    Raises:
        ConnectionError: the client's store did not answer or refused the request."""
    if db is not None:
        import sqlite3

        from orchestrator.track.sqlite_runs import sqlite_runs

        try:
            return sqlite_runs(db, study, kind)
        except sqlite3.Error as e:
            if not _holds_mlflow_tables(db):  # MLflow's client would create them: reading never writes
                raise StudyNotFound(f"{db}: not an MLflow store (no experiments table)") from None
            # a schema that reader does not know: say why this status is slower than usual
            (warn or (lambda _: None))(f"{db}: read through MLflow's client ({type(e).__name__}: {e})")
    from mlflow.exceptions import MlflowException

    client = client_for(tracking_uri)
    try:
        exp = client.get_experiment_by_name(study)
        return None if exp is None else find_train_runs(client, exp.experiment_id, kind)
    except MlflowException as e:  # a server that does not answer or refuses us: exit 1, no traceback
        raise ConnectionError(f"tracking store {tracking_uri}: {e.message}") from e


def _holds_mlflow_tables(db: Path) -> bool:
    """Whether SQLite file ``db`` has MLflow's ``experiments`` table (read-only: never creates one)."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'experiments'").fetchone() is not None
    except sqlite3.Error:  # not a database at all
        return False


def study_status(study: str, tracking_uri: str, spec: Any | None = None, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Rows {run_name, run_id, status, tokens, planned_tokens, val_ppl, final_ppl, note, lease}
    for a study: ``val_ppl`` the latest eval's perplexity, ``final_ppl`` the final pass's over
    the whole val split (``final/val_ppl``; None until the run finishes).

    With the study's spec, planned runs that MLflow does not hold yet appear as ``planned``;
    their ids are computed on the data MLflow's runs were trained on where the data here
    differs (``track.data_match``), and ``warn`` gets one line naming both content hashes.
    ``lease``: who holds the run's lease (the pack that trains it) and its heartbeat age, or ''.
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
        found = _train_runs(study, tracking_uri, db, warn)
        if found is None and spec is None:
            raise StudyNotFound(f"study {study!r}: no such experiment in the MLflow store")
        runs = found or {}
    rows = [_row(study, spec, run_id, r) for run_id, r in runs.items()]
    if spec is not None:
        from orchestrator.track.data_match import plan_against

        planned, notes = plan_against(spec, runs.values())  # ids cover the data, as the runner's do
        for line in notes:
            (warn or (lambda _: None))(line)
        gated = _gated(study, tracking_uri, spec, db)
        renamed = stored_under_other_ids(runs, planned)
        for row in rows:
            if row["run_id"] in renamed:
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"planned here as {renamed[row['run_id']]}"
        if renamed:
            (warn or (lambda _: None))(
                f"{len(renamed)} run(s) in MLflow carry other run ids than this spec plans for them (trained by an "
                "earlier identity of qkstudy's runs, at a tuned LR this command does not resolve, or with other "
                "settings): each is listed once, under its stored id, matched by name (variant, scale, seed, extend, corpus)"
            )
        for run in planned:
            if run.run_id not in runs and run.run_id not in renamed.values():
                why = gated.get((run.corpus_name, run.variant, run.scale))
                rows.append(
                    {
                        "run_name": run.run_name,
                        "run_id": run.run_id,
                        "status": STATUS_PLANNED if why is None else STATUS_GATED,
                        "tokens": None,
                        "planned_tokens": run.tokens,
                        "val_ppl": None,
                        "final_ppl": None,
                        "note": why or "",
                        "lease": "",
                    }
                )
    order = {STATUS_RUNNING: 0, STATUS_FAILED: 1, STATUS_QUEUED: 2, STATUS_PLANNED: 3, STATUS_FINISHED: 4, STATUS_GATED: 5}
    return sorted(rows, key=lambda r: (order.get(r["status"], 9), r["run_name"]))


def stored_under_other_ids(runs: dict[str, Any], planned: list[Any]) -> dict[str, str]:
    """{stored run id: the id the spec plans} for each stored run (``runs``: run id -> MLflow
    run) that no planned id matches but that carries a planned run's name: that run, trained
    under other ids (an earlier identity of runs, a tuned LR this plan does not resolve)."""
    by_name, planned_ids = {r.info.run_name: run_id for run_id, r in runs.items()}, {r.run_id for r in planned}
    return {
        stored: run.run_id
        for run in planned
        if run.run_id not in runs and (stored := by_name.get(run.run_name)) is not None and stored not in planned_ids
    }


def tuning_status(study: str, tracking_uri: str, spec: Any | None = None) -> list[dict[str, Any]]:
    """``study_status`` rows of the study's LR-tuning runs (``plan.tune_plan``), with their
    ``lr``, in run-name order; [] for an untuned study or a store that does not exist yet."""
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        return []
    runs = _train_runs(study, tracking_uri, db, kind=KIND_TUNE) or {}
    rows = [{**_row(study, spec, run_id, r), "lr": r.data.params.get("lr")} for run_id, r in runs.items()]
    return sorted(rows, key=lambda r: r["run_name"])


def _row(study: str, spec: Any | None, run_id: str, r: Any) -> dict[str, Any]:
    """One MLflow run as a status row."""
    m, t, p = r.data.metrics, r.data.tags, r.data.params
    return {
        "run_name": r.info.run_name,
        "run_id": run_id,
        "status": run_status(r),
        "tokens": int(m["tokens"]) if "tokens" in m else None,
        "planned_tokens": int(p["planned_tokens"]) if "planned_tokens" in p else None,
        "val_ppl": m.get("val/ppl"),
        "final_ppl": m.get("final/val_ppl"),
        "note": (run_tag(t, "failure_reason") or "")[:120],
        "lease": describe_holder(_holder(lease_storage(study, spec), run_lease_name(run_id))),
    }


def _gated(study: str, tracking_uri: str, spec: Any, db: Path | None) -> dict[tuple[str, str, str], str]:
    """(corpus, variant, scale) -> the evidence's sentence, for every scale a gated ladder's
    stopped arm skips (``track.gate_record``); {} for an ungated spec or a missing store."""
    if getattr(spec, "gate", None) is None or (db is not None and not db.is_file()):
        return {}
    from orchestrator.track.gate_record import recorded_gates

    return {(e.corpus, e.variant, s): e.sentence() for e in recorded_gates(tracking_uri, study) for s in e.skipped}
