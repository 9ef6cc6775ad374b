"""``qkstudy submit``, ``logs`` and ``stop``: a study sent to a Ray cluster as a job, followed, stopped.

The address is ``--address``, else RAY_API_SERVER_ADDRESS, else RAY_ADDRESS (Ray's own order,
``run.driver.submit.resolve_address``); a missing or cluster-style address (``auto``,
``ray://``, ``host:6379``) exits 2 in one line. ``submit`` follows the job's logs until it ends
as ``ray job submit`` does. Registered by ``cli.py`` under its input-error wrapper; imports are
lazy because ``cli.py`` imports this module on every command.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from orchestrator.cli_errors import EXIT_FAILED, EXIT_INPUT, err, print_error

# Dotted overrides after SPEC (`validate`, `plan`, `run`, `submit`): set over the spec before it validates.
OVERRIDES_HELP = "Overrides of the spec's fields, KEY=VALUE with YAML values, e.g. budget.tokens_per_param=10 seeds=[0,1,2]."


def dashboard(address: str | None) -> str:
    """``--address`` of submit / logs / stop: else RAY_API_SERVER_ADDRESS, else RAY_ADDRESS
    (``submit.resolve_address``, Ray's order); exit 2 in one line when none names a dashboard."""
    from orchestrator.run.driver.submit import AddressError, require_address

    try:
        return require_address(address)
    except AddressError as e:  # a callback runs before the command, outside input_errors
        print_error(str(e))
        raise typer.Exit(EXIT_INPUT) from None


def jobs_dashboard(address: str | None) -> str | None:
    """``status --address``: as ``dashboard``, but optional (no address: no jobs listed), and a
    RAY_ADDRESS that names the cluster, not its dashboard (set for ``qkstudy run``), is skipped
    with a warning rather than refused."""
    import os

    from orchestrator.run.driver.submit import ADDRESS_ENV, AddressError, resolve_address

    if not address and not any(os.environ.get(k, "").strip() for k in ADDRESS_ENV):
        return None  # the common case imports nothing
    try:
        found = resolve_address(address)
    except AddressError as e:
        if address or os.environ.get("RAY_API_SERVER_ADDRESS", "").strip():
            print_error(str(e))
            raise typer.Exit(EXIT_INPUT) from None
        err.print(f"[yellow]warning[/]: {escape(str(e))}; the study's Ray jobs are not listed", highlight=False)
        return None
    return found[0] if found else None


_ADDRESS_HELP = "Ray dashboard URL, e.g. https://HEAD:8265 (default: RAY_API_SERVER_ADDRESS, else RAY_ADDRESS)."


def submit_cmd(
    spec: Path = typer.Argument(..., help="Study spec (YAML), inside the current folder."),
    address: str = typer.Option(None, callback=dashboard, help=_ADDRESS_HELP, show_default=False),
    allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Allow plain http to a non-loopback host."),
    allow_ephemeral: bool = typer.Option(
        False,
        "--allow-ephemeral",
        help="Submit a spec whose tracking_uri / storage_path default to the job's temporary working dir (lost when it ends).",
    ),
    no_upload: bool = typer.Option(
        False,
        "--no-upload",
        help="Upload nothing: the cluster has this code (its image) and reads SPEC at the same absolute path (shared storage).",
    ),
    no_wait: bool = typer.Option(False, "--no-wait", help="Print the job id and return at once, without following the job."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List every file uploaded (default: the 10 largest)."),
    overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP + " The job runs with the same ones.", show_default=False),
) -> None:
    """Send a study to a Ray cluster through the Job Submission API and follow its logs until it
    ends, as `ray job submit` does: the job id is stdout's first line; exit 0 if the job
    succeeded, 1 if it failed or was stopped. Ctrl-C stops following, not the job."""
    from orchestrator.run.driver.submit import submit as submit_job
    from orchestrator.run.driver.upload import upload_files, upload_lines

    def show_upload(job: dict[str, Any]) -> None:  # stderr: stdout stays the job id (and its logs)
        if files := upload_files(job["runtime_env"]):
            for line in upload_lines(files, limit=None if verbose else 10):
                err.print(escape(line), highlight=False, soft_wrap=True)

    job_id = submit_job(
        spec,
        address,
        allow_insecure=allow_insecure,
        allow_ephemeral=allow_ephemeral,
        upload=not no_upload,
        overrides=overrides or [],
        before_send=show_upload,
    )
    print(job_id, flush=True)
    if not no_wait:
        _follow(job_id, address, allow_insecure)


def _follow(job_id: str, address: str, allow_insecure: bool) -> None:
    """``submit``'s wait: the job's logs to stdout until it ends; exit 1 unless it SUCCEEDED."""
    from orchestrator.run.driver.submit import wait_job
    from orchestrator.track.tracking import redact_uri

    again = f"--address {redact_uri(address)}{' --allow-insecure' if allow_insecure else ''}"
    err.print(f"following job {job_id} until it ends (Ctrl-C stops following, not the job: qkstudy stop {job_id} {again})", highlight=False)
    try:
        with _ctrl_c_interrupts():
            status, message = wait_job(address, job_id, _write, allow_insecure=allow_insecure)
    except KeyboardInterrupt:
        err.print(
            f"stopped following; job {job_id} keeps running. Follow it again: qkstudy logs {job_id} {again}; "
            f"stop it: qkstudy stop {job_id} {again}",
            highlight=False,
        )
        raise typer.Exit(130) from None
    err.print(f"job {job_id}: {status}{f' ({escape(message)})' if message else ''}", highlight=False)
    if status != "SUCCEEDED":
        raise typer.Exit(EXIT_FAILED)


@contextmanager
def _ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt inside the block even in a process started with
    SIGINT ignored. Python installs its KeyboardInterrupt handler only where SIGINT is not
    ignored at startup, and a command started in the background of a non-interactive shell
    (``qkstudy submit ... &`` in a script, a CI job's children) inherits it ignored: there a
    follow never ends on SIGINT, however the dashboard behaves. Ending a follow leaves the job
    running, so SIGINT is honoured here even where a caller ignored it on purpose (``trap '' INT``:
    the follow ends with exit 130, the job goes on); a handler the caller installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _write(chunk: str) -> None:
    sys.stdout.write(chunk)
    sys.stdout.flush()


def logs_cmd(
    job_id: str = typer.Argument(..., help="Ray job id printed by `qkstudy submit`."),
    address: str = typer.Option(None, callback=dashboard, help=_ADDRESS_HELP, show_default=False),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Keep printing until the job ends."),
    allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Allow plain http to a non-loopback host."),
) -> None:
    """Print (and follow) a submitted job's logs."""
    from orchestrator.run.driver.submit import follow_logs

    with _ctrl_c_interrupts():
        for chunk in follow_logs(address, job_id, follow=follow, allow_insecure=allow_insecure):
            _write(chunk)


def stop_cmd(
    job_id: str = typer.Argument(..., help="Ray job id printed by `qkstudy submit`."),
    address: str = typer.Option(None, callback=dashboard, help=_ADDRESS_HELP, show_default=False),
    allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Allow plain http to a non-loopback host."),
) -> None:
    """Stop a submitted job and print its final status (exit 0; 2 for an unknown job id). Its
    finished runs stay finished in MLflow: a resubmit trains the rest."""
    from orchestrator.run.driver.submit import UnknownJob, stop_job

    try:
        was_running, status = stop_job(address, job_id, allow_insecure=allow_insecure)
    except UnknownJob as e:
        print_error(str(e))
        raise typer.Exit(EXIT_INPUT) from None
    print(f"job {job_id}: {status}" if was_running else f"job {job_id} had already ended: {status}")


def register(app: typer.Typer, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Add ``submit``, ``logs`` and ``stop`` to ``app``, each under ``wrap`` (cli.py's input-error wrapper)."""
    app.command("submit")(wrap(submit_cmd))
    app.command("logs")(wrap(logs_cmd))
    app.command("stop")(wrap(stop_cmd))
