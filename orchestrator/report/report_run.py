"""The report's own MLflow run: one per report of a study, updated by every ``report`` call.

A report is found again by its name (``report-<study>``, or ``report-<study>-<corpus>`` for a
``--corpus`` report) among the experiment's runs of kind ``report``, so the Runs table holds one
report row per study that always shows the latest report, instead of one more row per call.
Its artifacts are overwritten in place; the tag ``qkstudy.report_revision`` counts the updates
and ``qkstudy.report_updated`` says when the last one was logged (UTC, ISO 8601). A build
that fails before it logs leaves an existing run as it was (its artifacts are still the last
good report); one whose artifacts cannot be stored ends the run FAILED, and the next call
starts a new run (the failed one's artifact location may be what failed).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.report.errors import ReportError
from orchestrator.track.tracking import KIND_REPORT, KIND_TAG, tag

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

REPORT_TAG, REVISION_TAG, UPDATED_TAG = "qkstudy.report", "qkstudy.report_revision", "qkstudy.report_updated"


def report_run(client: MlflowClient, experiment_id: str, name: str, study: str) -> tuple[str, bool]:
    """(MLflow run id, created) of the report ``name`` in the experiment: the newest existing
    report run of that name (tag ``qkstudy.report``, or the run name of a store written before
    the tag) that did not fail, else a new one. Deleted runs are not reused."""
    from mlflow.entities import ViewType

    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{KIND_TAG}` = '{KIND_REPORT}'",
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time DESC"],
        max_results=1000,
    )
    for run in found:  # a FAILED one is not reused: its artifact location may be the reason
        if run.info.status != "FAILED" and run.data.tags.get(REPORT_TAG, run.info.run_name) == name:
            return run.info.run_id, False
    tags = {KIND_TAG: KIND_REPORT, REPORT_TAG: name, tag("study"): study, REVISION_TAG: "0"}
    return client.create_run(experiment_id, run_name=name, tags=tags).info.run_id, True


def open_report_run(client: MlflowClient, experiment_id: str, name: str, study: str) -> tuple[str | None, bool, str | None]:
    """``report_run``, or (None, False, why) when this account may only read the study (a
    reader on the stack, a ``qkstudy grant`` of READ), or when the store is a published one
    (``track.publish``: its artifact locations lead nowhere, so a report run could only fail):
    the report is still written to disk, and the caller says it was not logged instead of
    failing after the analysis."""
    from mlflow.exceptions import MlflowException

    from orchestrator.track.publish import is_published

    if is_published(client.get_experiment(experiment_id).artifact_location):
        return None, False, "not logged to MLflow: a published store (its artifacts were not published with it)"
    try:
        run_id, created = report_run(client, experiment_id, name, study)
        if not created:  # found by a search (a read): a write that changes nothing tells a reader now
            client.set_tag(run_id, REPORT_TAG, name)
        return run_id, created, None
    except MlflowException as err:
        if err.error_code not in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
            raise
        return None, False, f"not logged to MLflow: this account may not write to study {study!r} (read-only)"


def log_report(client: MlflowClient, run_id: str, folder: Path) -> None:
    """Log ``folder`` (the finished report) as the run's artifacts, bump its revision and end it
    FINISHED.

    Raises ReportError (after ending the run FAILED) when the artifact store refuses the files:
    the report on disk stands, its MLflow copy does not."""
    from mlflow.exceptions import MlflowException

    client.update_run(run_id, status="RUNNING")
    try:
        client.log_artifacts(run_id, str(folder))
    except (MlflowException, OSError) as err:
        client.set_terminated(run_id, status="FAILED")
        where = client.get_run(run_id).info.artifact_uri
        raise ReportError(
            f"report written to {folder}, but its MLflow run {run_id} could not store it at {where} "
            f"({type(err).__name__}: {err}); the run is marked FAILED (--no-log skips logging)"
        ) from None
    revision = int(client.get_run(run_id).data.tags.get(REVISION_TAG, "0")) + 1
    client.set_tag(run_id, REVISION_TAG, str(revision))
    client.set_tag(run_id, UPDATED_TAG, datetime.now(timezone.utc).isoformat(timespec="seconds"))
    client.set_terminated(run_id, status="FINISHED")
