"""Matching a study's planned runs to their MLflow records, before anything trains.

A planned run is found again by its ``run_id`` tag. Its id covers the corpus's content hash
(``orchestrator.plan.planner``), so a run trained on other data is another run: its record
stays in MLflow, its kind becomes ``superseded`` (tags ``superseded_by``, ``superseded_reason``),
which takes it out of the study's data (report, status) without touching its metrics, and
it is never resumed or retried. The same holds for a record whose configuration (or
``IDENTITY_VERSION``) changed: the one with the same (corpus, variant, scale, seed, extend)
in the new plan replaces it.

``finished_before_ray`` answers a re-run of a finished study from MLflow alone, so the
driver returns without starting Ray.
"""

from __future__ import annotations

from typing import Any

from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient
from rich.console import Console

from orchestrator.plan.contract import RunSpec
from orchestrator.track.tracking import (
    KIND_SUPERSEDED,
    KIND_TAG,
    KIND_TRAIN,
    STATUS_FINISHED,
    client_for,
    ensure_experiment,
    find_train_runs,
    run_status,
    run_tag,
    sqlite_path,
    tag,
)


def _slot(tags: dict[str, str]) -> tuple[str, ...]:
    """What a run stands for in a study, whatever its id: (corpus, variant, scale, seed, extend)."""
    return tuple(run_tag(tags, k) or "" for k in ("corpus", "variant", "scale", "seed", "extend"))


def _run_slot(run: RunSpec) -> tuple[str, ...]:
    return run.corpus_name, run.variant, run.scale, str(run.seed), run.extend_tag


def finished_on(record: Any, data_hash: str | None) -> bool:
    """True when the MLflow ``record`` (or None) is finished and was trained on ``data_hash``."""
    return record is not None and run_status(record) == STATUS_FINISHED and record.data.params.get("data_hash") == data_hash


def finished_before_ray(runs: list[RunSpec], study_name: str, tracking_uri: str) -> bool:
    """True when MLflow already holds every run of ``runs`` finished on the data it was planned
    with (its ``data_hash``). Reads only: never creates a store or an experiment. False when
    any run was planned without a data hash (then only the prepared data can tell)."""
    if not runs or any(r.data_hash is None for r in runs):
        return False
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        return False
    client = client_for(tracking_uri)
    exp = client.get_experiment_by_name(study_name)
    if exp is None or exp.lifecycle_stage != "active":
        return False
    existing = find_train_runs(client, exp.experiment_id, runs_kind(runs))
    return all(finished_on(existing.get(r.run_id), r.data_hash) for r in runs)


def mark_superseded(client: MlflowClient, mlflow_run_id: str, by: str, reason: str) -> None:
    """Take a run out of the study's data, keeping its record and metrics (module docstring)."""
    client.log_batch(
        mlflow_run_id,
        tags=[RunTag(KIND_TAG, KIND_SUPERSEDED), RunTag(tag("superseded_by"), by), RunTag(tag("superseded_reason"), reason[:5000])],
    )


def supersede_replaced(
    client: MlflowClient, existing: dict[str, Any], runs: list[RunSpec], datasets: dict[str, dict[str, Any]], console: Console
) -> list[str]:
    """Mark superseded every record of ``existing`` (run_id -> MLflow run) that is not a planned
    run but stands for the same (corpus, variant, scale, seed, extend) as one; returns their
    run_ids. The reason names the data hashes when the data changed."""
    planned = {_run_slot(r): r for r in runs}
    ids = {r.run_id for r in runs}
    out = []
    for run_id, rec in existing.items():
        new = planned.get(_slot(rec.data.tags))
        if run_id in ids or new is None:
            continue
        old_hash, new_hash = rec.data.params.get("data_hash"), datasets[new.corpus_name]["content_hash"]
        reason = (
            f"trained on other data (content hash {old_hash}, now {new_hash})"
            if old_hash != new_hash
            else f"its configuration changed (run id {run_id}, now {new.run_id})"
        )
        mark_superseded(client, rec.info.run_id, new.run_id, reason)
        console.print(f"superseded {rec.info.run_name}: {reason}")
        out.append(run_id)
    return out


def run_params(run: RunSpec, data: dict[str, Any]) -> dict[str, Any]:
    """The params a new MLflow run gets beyond the planned ones: the data it trains on
    (content and tokenizer hashes, path) and, for wallclock budgets, the calibration used."""
    params = {"data_hash": data["content_hash"], "data_path": data["path"], "tokenizer_hash": data.get("tokenizer_hash", "")}
    cal = run.calibration
    if cal:
        params.update({"calibration.source": cal["source"], "calibration.digest": cal["digest"]})
        params.update({f"calibration.tokens_per_s.{v}": tps for v, tps in cal["tokens_per_s"].items()})
    return params


def existing_runs(tracking_uri: str, study_name: str, kind: str = KIND_TRAIN) -> tuple[MlflowClient, str, dict[str, Any]]:
    """(client, experiment id, run_id -> training run of ``kind``) of the study, creating the
    store's folder and the experiment when missing."""
    db = sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    client = client_for(tracking_uri)
    exp_id = ensure_experiment(client, study_name)
    return client, exp_id, find_train_runs(client, exp_id, kind)


def runs_kind(runs: list[RunSpec]) -> str:
    """The one kind (``train`` or ``tune``) of ``runs``: a submission holds one kind, so tuning
    runs never supersede main runs of the same (variant, scale, seed). ValueError if mixed."""
    kinds = {r.kind for r in runs} or {KIND_TRAIN}
    if len(kinds) > 1:
        raise ValueError(f"runs of several kinds in one submission: {sorted(kinds)}")
    return kinds.pop()
