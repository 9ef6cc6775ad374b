"""MLflow conventions (DESIGN.md, "Conventions that numbers depend on") in one module.

Experiment = study name. One MLflow run per planned run, found again by its ``run_id`` tag
(the planner's hash), so a resubmitted study reuses the same MLflow run: the id is created
once by the driver and carried in the run's checkpoint. Step = tokens seen (int). Tags:
study, run_id, variant, scale, seed, corpus, extend, status, and ``qkstudy.kind`` = train
(the report's own run is kind = report and never counts as a training run).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

KIND_TAG = "qkstudy.kind"
STATUS_QUEUED, STATUS_RUNNING, STATUS_FINISHED, STATUS_FAILED = "queued", "running", "finished", "failed"


def client_for(uri: str) -> MlflowClient:
    """An MlflowClient on ``uri`` (SQLite file, http(s) server, or a file store)."""
    return MlflowClient(tracking_uri=uri)


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """Experiment id of ``name``, creating it (tolerating a concurrent creator)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_train_runs(client: MlflowClient, experiment_id: str) -> dict[str, Any]:
    """All training runs of an experiment keyed by their ``run_id`` tag (newest wins)."""
    out: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{KIND_TAG}` = 'train'",
            max_results=5000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        for r in page:
            out[r.data.tags.get("run_id", r.info.run_id)] = r
        token = page.token
        if not token:
            return out


def run_status(run: Any) -> str:
    """``queued``, ``running``, ``finished`` or ``failed`` from the run's ``status`` tag."""
    return run.data.tags.get("status", STATUS_QUEUED)


def create_run(client: MlflowClient, experiment_id: str, spec: Any, extra_params: dict[str, Any] | None = None) -> str:
    """Create the MLflow run of a planned run (RunSpec) with its tags and params; return its id."""
    tags = {
        KIND_TAG: "train",
        "study": spec.study,
        "run_id": spec.run_id,
        "variant": spec.variant,
        "model_variant": spec.model_variant,
        "scale": spec.scale,
        "seed": str(spec.seed),
        "corpus": spec.corpus_name,
        "extend": spec.extend_tag,
        "status": STATUS_QUEUED,
    }
    run = client.create_run(experiment_id, run_name=spec.run_name, tags=tags)
    params = {
        "n_params": spec.n_params,
        "n_params_total": spec.n_params_total,
        "flops_per_token": spec.flops_per_token,
        "planned_tokens": spec.tokens,
        "planned_steps": spec.steps,
        "seq_len": spec.train.seq_len,
        "global_batch": spec.train.global_batch,
        "lr": spec.train.lr,
        "schedule": spec.train.schedule,
        "zero_stage": spec.resources.zero_stage,
        "workers": spec.resources.workers,
        **{f"model.{k}": v for k, v in spec.model.items()},
        **(extra_params or {}),
    }
    _log_params(client, run.info.run_id, params)
    return run.info.run_id


def _log_params(client: MlflowClient, mlflow_run_id: str, params: dict[str, Any]) -> None:
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client.log_batch(mlflow_run_id, params=items[i : i + 100])


def set_status(client: MlflowClient, mlflow_run_id: str, status: str, reason: str | None = None,
               tokens: int | None = None) -> None:
    """Set the ``status`` tag (and MLflow's own run status) of a run; record why it failed."""
    tags = [RunTag("status", status)]
    if reason is not None:
        tags.append(RunTag("failure_reason", reason[:5000]))
    if tokens is not None:
        tags.append(RunTag("failed_at_tokens" if status == STATUS_FAILED else "final_tokens", str(tokens)))
    client.log_batch(mlflow_run_id, tags=tags)
    if status == STATUS_FINISHED:
        client.set_terminated(mlflow_run_id, "FINISHED")
    elif status == STATUS_FAILED:
        client.set_terminated(mlflow_run_id, "FAILED")
    else:
        client.update_run(mlflow_run_id, status="RUNNING")


class MetricBuffer:
    """Batches metric points and writes them with ``log_batch`` (one call per flush).

    ``resume_after`` is the last step already in MLflow: after a resume from a checkpoint the
    loop recomputes steps past the checkpoint, and those points are dropped here, so no step
    is logged twice. Non-finite values are dropped (MLflow rejects NaN in some stores); the
    run's failure reason carries them instead.
    """

    def __init__(self, client: MlflowClient, mlflow_run_id: str, resume_after: int = -1):
        self.client = client
        self.mlflow_run_id = mlflow_run_id
        self.resume_after = resume_after
        self._pending: list[Metric] = []

    def add(self, metrics: dict[str, float], step: int) -> None:
        """Queue ``metrics`` at ``step`` (tokens seen); dropped if MLflow already has that step."""
        if step <= self.resume_after:
            return
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            v = float(v)
            if math.isfinite(v):
                self._pending.append(Metric(k, v, ts, int(step)))

    def flush(self) -> None:
        """Write every queued point to MLflow (``log_batch``, 1,000 points per call)."""
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), 1000):
            self.client.log_batch(self.mlflow_run_id, metrics=pending[i : i + 1000])


def last_logged_step(client: MlflowClient, mlflow_run_id: str, key: str = "tokens") -> int:
    """Largest step logged for ``key`` in a run (-1 if none)."""
    hist: Iterable[Metric] = client.get_metric_history(mlflow_run_id, key)
    return max((m.step for m in hist), default=-1)
