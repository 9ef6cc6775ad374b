"""Submission to a remote Ray cluster through Ray's Job Submission API.

The job is ``python -m orchestrator.cli run SPEC`` executed on the cluster with this
checkout as its ``working_dir`` (so the code that planned the study is the code that runs
it) and, optionally, a container image. Only the spec's *path* enters the entrypoint, quoted
with ``shlex``; no spec field ever reaches a shell. Inside the job ``RAY_ADDRESS`` is set by
Ray, so ``qkstudy run`` joins the cluster and schedules the runs there; resubmitting a study
trains only the runs not finished in its MLflow store.

Multi-node clusters need the study's ``tracking_uri`` to be an MLflow server and its
``storage_path`` (and QKSTUDY_CACHE for shards) on shared storage: a local SQLite file or
folder on one node is not visible from the others.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from orchestrator.plan.spec import Study, load_spec
from orchestrator.run.security import check_submit_address, shell_join

# Never uploaded: environments, local state, VCS metadata.
EXCLUDES = [".venv/", "runs/", ".git/", "**/__pycache__/", "*.egg-info/", ".pytest_cache/", "reports/", "mlruns/"]
# Forwarded to the job when set here: where shards are cached and how Ray logs (no secrets).
FORWARDED_ENV = ("QKSTUDY_CACHE",)
AGENT_WAIT_S = 120


def build_job(spec_path: str | Path, address: str, *, image: str | None = None, allow_insecure: bool = False,
              working_dir: str | Path | None = None, upload: bool = True) -> dict[str, Any]:
    """The arguments of ``JobSubmissionClient.submit_job`` for a study, without sending them.

    Args:
        spec_path: the study spec; it must lie inside ``working_dir`` (it travels with it).
        address: the cluster's dashboard URL (``http://HOST:8265``).
        image: optional container image for the job (runtime_env ``image_uri``).
        working_dir: folder uploaded as the job's working dir (default: the current one).
        upload: False when the cluster already has the code (its image) and reads the spec
            at the same absolute path (shared storage): nothing is uploaded.

    Returns:
        {"address", "entrypoint", "runtime_env", "metadata", "study"}.

    Raises:
        SpecError: the spec does not validate. InsecureAddressError / ValueError: a bad
            address (see ``orchestrator.run.security.check_submit_address``); a spec outside
            the working dir.
    """
    study: Study = load_spec(spec_path)
    addr = check_submit_address(address, allow_insecure=allow_insecure)
    wd = Path(working_dir or os.getcwd()).resolve()
    spec_abs = Path(spec_path).resolve()
    runtime_env: dict[str, Any] = {}
    if upload:
        try:
            rel = spec_abs.relative_to(wd)
        except ValueError:
            raise ValueError(f"{spec_path}: the spec must be inside the uploaded working dir {wd}") from None
        runtime_env.update(working_dir=str(wd), excludes=list(EXCLUDES))
    else:
        rel = spec_abs
    entrypoint = shell_join(["python", "-m", "orchestrator.cli", "run", rel.as_posix()])
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    if env:
        runtime_env["env_vars"] = env
    if image:
        runtime_env["image_uri"] = image
    return {"address": addr, "entrypoint": entrypoint, "runtime_env": runtime_env,
            "metadata": {"study": study.name, "spec": rel.as_posix()}, "study": study.name}


def submit(spec_path: str | Path, address: str, *, image: str | None = None, allow_insecure: bool = False,
           working_dir: str | Path | None = None, upload: bool = True) -> str:
    """Submit a study as a Ray job (see ``build_job``); returns the job's submission id."""
    from ray.job_submission import JobSubmissionClient

    job = build_job(spec_path, address, image=image, allow_insecure=allow_insecure, working_dir=working_dir,
                    upload=upload)
    client = JobSubmissionClient(job["address"])
    # A cluster that just came up answers "No available agent" until its job agent is ready.
    deadline = time.time() + AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(entrypoint=job["entrypoint"], runtime_env=job["runtime_env"], metadata=job["metadata"])
        except RuntimeError as e:
            if "No available agent" not in str(e) or time.time() > deadline:
                raise
            time.sleep(2)


def job_status(address: str, job_id: str, *, allow_insecure: bool = False) -> str:
    """Ray's status of a job (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(check_submit_address(address, allow_insecure=allow_insecure))
    return str(client.get_job_status(job_id).value)


def study_jobs(address: str, study: str, *, allow_insecure: bool = False) -> list[dict[str, Any]]:
    """The cluster's jobs submitted for ``study`` (from their metadata), newest last."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(check_submit_address(address, allow_insecure=allow_insecure))
    jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("study") == study]
    jobs.sort(key=lambda j: j.start_time or 0)
    return [{"job_id": j.submission_id, "status": str(j.status.value), "start_time": j.start_time,
             "end_time": j.end_time, "message": j.message} for j in jobs]


def follow_logs(address: str, job_id: str, *, follow: bool = True, allow_insecure: bool = False):
    """Yield a job's log text: everything so far, then (``follow``) new lines until it ends."""
    import asyncio

    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(check_submit_address(address, allow_insecure=allow_insecure))
    if not follow:
        yield client.get_job_logs(job_id)
        return

    loop = asyncio.new_event_loop()
    try:
        agen = client.tail_job_logs(job_id).__aiter__()
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.close()
