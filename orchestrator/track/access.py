"""Who may read or write one study: per-experiment grants on an MLflow server with basic auth.

A study is one MLflow experiment. On the stack (docker/compose.yaml) the training account
creates every study's experiment and so manages all of them; the reader account reads every
study through its role. Anyone else sees a study only once granted here: READ (runs, curves,
artifacts, `qkstudy report`), EDIT (log and update runs) or MANAGE (also grant and delete).
The grant is MLflow's own (``AuthServiceClient.grant_user_permission``, resource type
``experiment``), made by the account in MLFLOW_TRACKING_USERNAME: the admin, or one with
MANAGE on the study (its creator).
"""

from __future__ import annotations

from urllib.parse import urlparse

from orchestrator.track.tracking import client_for

PERMISSIONS = ("READ", "EDIT", "MANAGE")


class AccessError(ValueError):
    """A grant that cannot be made: a store without accounts, an unknown study, user or
    permission, or an account that may not manage the study (message says which)."""


def _experiment_id(tracking_uri: str, study: str) -> str:
    if urlparse(tracking_uri).scheme not in ("http", "https"):
        raise AccessError(
            f"{tracking_uri}: a local store has no accounts; per-study permissions exist on an "
            "MLflow server started with --app-name basic-auth (the stack's)"
        )
    from mlflow.exceptions import MlflowException

    try:
        exp = client_for(tracking_uri).get_experiment_by_name(study)
    except MlflowException as e:
        if e.error_code in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
            raise AccessError(
                f"study {study!r}: {tracking_uri} refuses MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (wrong, or no access to it)"
            ) from None
        raise ConnectionError(f"tracking server {tracking_uri}: {e.message}") from e
    if exp is None:
        raise AccessError(f"study {study!r}: no such experiment on {tracking_uri} (or this account cannot see it)")
    return exp.experiment_id


def _auth_call(tracking_uri: str, study: str, username: str, call) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    try:
        call(AuthServiceClient(tracking_uri))
    except MlflowException as e:
        code = e.error_code
        if code == "RESOURCE_DOES_NOT_EXIST" and "Permission for user=" in e.message:
            return  # a revoke of a grant that is not there: already the state asked for
        if code == "RESOURCE_DOES_NOT_EXIST":
            raise AccessError(f"user {username!r}: no such account on {tracking_uri} (the admin creates accounts)") from None
        if code in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
            raise AccessError(
                f"study {study!r}: the account in MLFLOW_TRACKING_USERNAME may not manage it "
                "(use the admin, or the account that created the study)"
            ) from None
        raise ConnectionError(f"tracking server {tracking_uri}: {e.message}") from e


def grant(tracking_uri: str, study: str, username: str, permission: str) -> str:
    """Give `username` `permission` (one of PERMISSIONS) on `study`; returns its experiment id.
    A second grant replaces the first.

    Raises:
        AccessError: a local store, an unknown permission, study or user, or an account that
            may not manage the study.
        ConnectionError: the server did not answer.
    """
    permission = permission.upper()
    if permission not in PERMISSIONS:
        raise AccessError(f"--permission {permission!r}: choose one of {', '.join(PERMISSIONS)}")
    exp_id = _experiment_id(tracking_uri, study)
    _auth_call(tracking_uri, study, username, lambda a: a.grant_user_permission(username, "experiment", exp_id, permission))
    return exp_id


def revoke(tracking_uri: str, study: str, username: str) -> str:
    """Take back `username`'s grant on `study` (roles, such as the stack's readers, stay);
    returns its experiment id. Raises as ``grant``."""
    exp_id = _experiment_id(tracking_uri, study)
    _auth_call(tracking_uri, study, username, lambda a: a.revoke_user_permission(username, "experiment", exp_id))
    return exp_id
