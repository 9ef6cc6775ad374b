"""``qkstudy grant`` and ``revoke``: who may read or write one study on an MLflow server with
basic auth (``track.access``). Registered by ``cli.py`` under its input-error wrapper; imports
are lazy because ``cli.py`` imports this module on every command.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

URI_HELP = "The MLflow server with basic auth (default: a spec's tracking_uri; a study name's MLFLOW_TRACKING_URI)."


def grant(
    study: str = typer.Argument(..., help="Study name or spec path."),
    username: str = typer.Argument(..., help="MLflow account to grant."),
    permission: str = typer.Option("READ", "--permission", help="READ (runs, curves, report), EDIT (log runs) or MANAGE (also grant)."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help=URI_HELP),
) -> None:
    """Let an MLflow account read (or write) one study, on a server with basic auth; made as
    the account in MLFLOW_TRACKING_USERNAME (the admin, or the study's creator)."""
    from orchestrator.track.access import grant as grant_permission
    from orchestrator.track.status import study_uri

    name, uri = study_uri(study, tracking_uri)
    exp_id = grant_permission(uri, name, username, permission)
    print(f"{username}: {permission.upper()} on study {name} (experiment {exp_id})")


def revoke(
    study: str = typer.Argument(..., help="Study name or spec path."),
    username: str = typer.Argument(..., help="MLflow account whose grant to take back."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help=URI_HELP),
) -> None:
    """Take back a `qkstudy grant` (roles, such as the stack's readers, are untouched)."""
    from orchestrator.track.access import revoke as revoke_permission
    from orchestrator.track.status import study_uri

    name, uri = study_uri(study, tracking_uri)
    exp_id = revoke_permission(uri, name, username)
    print(f"{username}: no grant on study {name} (experiment {exp_id})")


def register(app: typer.Typer, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Add ``grant`` and ``revoke`` to ``app``, each under ``wrap`` (cli.py's input-error wrapper)."""
    app.command("grant")(wrap(grant))
    app.command("revoke")(wrap(revoke))
