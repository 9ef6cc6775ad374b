"""Ensure the stack's MLflow accounts: rotate the admin's password, create (or re-key) the
training account and the reader account.

Runs once per `make stack-up` as the compose service ``mlflow-users``, after the server is
healthy. It holds the admin credentials; the Ray nodes never do. The accounts:

- training (QKSTUDY_TRAINING_*): what the Ray nodes log with. Not an admin: it creates
  experiments and runs and manages the ones it created (so it may write every study the stack
  trains), but cannot read other users' experiments, create users or change permissions.
- reader (QKSTUDY_READER_*, optional here, required by compose): for `qkstudy status`,
  `report` and the UI. Not an admin; the role ``qkstudy-readers`` gives it READ on every
  experiment of the default workspace, present and future, and nothing else.
- admin: bootstrapped by the server once, at the first start, from MLFLOW_AUTH_ADMIN_PASSWORD;
  a later change of that password in docker/.env does not reach the server's user store. To
  rotate it, set the new one and MLFLOW_ADMIN_PASSWORD_PREVIOUS (the old one): this script
  logs in with the old one and sets the new. Without it, a wrong admin password exits 2 saying
  so (the Ray services, which wait for this script, then do not start).

Environment: MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (the
admin), MLFLOW_ADMIN_PASSWORD_PREVIOUS (optional), QKSTUDY_TRAINING_USERNAME /
QKSTUDY_TRAINING_PASSWORD, QKSTUDY_READER_USERNAME / QKSTUDY_READER_PASSWORD (optional).
Exit code 0 when every account exists with its password and none but the admin is an admin,
2 on missing or conflicting settings or an admin password the server refuses. Idempotent: a
second run re-keys the same accounts and changes nothing else. Standard library only
(mlflow's own client would import the whole server first).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

API = "/api/2.0/mlflow/users"
RBAC = "/api/3.0/mlflow"  # roles (MLflow >= 3.11's RBAC): per-workspace, with resource patterns
WORKSPACE = "default"  # the only workspace of a server without multi-workspace mode
READER_ROLE = "qkstudy-readers"
RETRY_S = 180.0


class ServerRefused(RuntimeError):
    """The auth API answered with an error (status and MLflow error code in the message)."""


def _call(uri: str, auth: tuple[str, str], method: str, path: str, body: dict | None = None,
          retry_s: float = RETRY_S) -> dict:
    """One JSON request to MLflow's auth REST API with basic auth; returns the decoded body.
    Standard library only: importing mlflow's client pulls in the whole server (a minute here).
    A dropped connection is retried for `retry_s`: the server answers /health (so compose
    starts this) while its second worker may still be loading the auth app."""
    data = json.dumps(body).encode() if body is not None else None
    deadline = time.monotonic() + retry_s
    while True:
        req = urllib.request.Request(uri.rstrip("/") + path, data=data, method=method)
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read().decode() or "{}")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            if err.code < 500 or time.monotonic() > deadline:
                raise ServerRefused(f"{method} {path}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as err:
            if time.monotonic() > deadline:
                raise ServerRefused(f"{method} {path}: {err}") from None
        time.sleep(2)


def ensure_user(uri: str, admin: tuple[str, str], username: str, password: str) -> str:
    """Create `username` with `password`, or set its password if it exists; never an admin.

    Returns "created" or "updated". Raises ServerRefused when the server refuses (e.g. the
    `admin` credentials are wrong or not an admin's)."""
    try:
        _call(uri, admin, "POST", f"{API}/create", {"username": username, "password": password})
        outcome = "created"
    except ServerRefused as err:
        if "RESOURCE_ALREADY_EXISTS" not in str(err):
            raise
        _call(uri, admin, "PATCH", f"{API}/update-password", {"username": username, "password": password})
        outcome = "updated"
    query = urllib.parse.urlencode({"username": username})
    if _call(uri, admin, "GET", f"{API}/get?{query}")["user"]["is_admin"]:
        _call(uri, admin, "PATCH", f"{API}/update-admin", {"username": username, "is_admin": False})
    return outcome


def logs_in(uri: str, auth: tuple[str, str]) -> bool:
    """Whether the server accepts `auth` (a request only a logged-in user may make)."""
    query = urllib.parse.urlencode({"username": auth[0]})
    try:
        _call(uri, auth, "GET", f"{API}/get?{query}")
    except ServerRefused as err:
        if "HTTP 401" in str(err):
            return False
        raise
    return True


def rotate_admin(uri: str, username: str, password: str, previous: str | None) -> str:
    """Make `password` the admin's: "unchanged" when the server takes it already, "rotated"
    after logging in with `previous` and setting it.

    Raises ServerRefused naming MLFLOW_ADMIN_PASSWORD_PREVIOUS when neither logs in."""
    if logs_in(uri, (username, password)):
        return "unchanged"
    if previous and logs_in(uri, (username, previous)):
        _call(uri, (username, previous), "PATCH", f"{API}/update-password", {"username": username, "password": password, "current_password": previous})
        return "rotated"
    raise ServerRefused(
        f"the server refuses the admin {username!r} with MLFLOW_ADMIN_PASSWORD"
        + (" and with MLFLOW_ADMIN_PASSWORD_PREVIOUS" if previous else "")
        + ". The admin is created once, at the stack's first start, and a later change in "
        "docker/.env does not reach it: to rotate, put the password the server has in "
        "MLFLOW_ADMIN_PASSWORD_PREVIOUS beside the new one and run `make stack-up` again"
    )


def ensure_reader(uri: str, admin: tuple[str, str], username: str, password: str) -> str:
    """Ensure `username` (not an admin) holds the role READER_ROLE: READ on every experiment of
    WORKSPACE, including those created later. Returns ensure_user's outcome."""
    outcome = ensure_user(uri, admin, username, password)
    roles = _call(uri, admin, "GET", f"{RBAC}/roles/list?" + urllib.parse.urlencode({"workspace": WORKSPACE}))
    role = next((r for r in roles.get("roles", []) if r["name"] == READER_ROLE), None)
    if role is None:
        role = _call(uri, admin, "POST", f"{RBAC}/roles/create", {
            "workspace": WORKSPACE, "name": READER_ROLE,
            "description": "qkstudy: read every study (status, report, the UI)"})["role"]
    perms = _call(uri, admin, "GET", f"{RBAC}/roles/permissions/list?" + urllib.parse.urlencode({"role_id": role["id"]}))
    wanted = {"resource_type": "experiment", "resource_pattern": "*", "permission": "READ"}
    if not any(all(p.get(k) == v for k, v in wanted.items()) for p in perms.get("role_permissions", [])):
        _call(uri, admin, "POST", f"{RBAC}/roles/permissions/add", {"role_id": role["id"], **wanted})
    held = _call(uri, admin, "GET", f"{RBAC}/users/roles/list?" + urllib.parse.urlencode({"username": username}))
    if not any(r["id"] == role["id"] for r in held.get("roles", [])):
        _call(uri, admin, "POST", f"{RBAC}/roles/assign", {"username": username, "role_id": role["id"]})
    return outcome


def main() -> int:
    """Read the settings from the environment; rotate the admin's password, ensure the accounts."""
    env = os.environ
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
             "QKSTUDY_TRAINING_USERNAME", "QKSTUDY_TRAINING_PASSWORD")
    missing = [n for n in names if not env.get(n)]
    if bool(env.get("QKSTUDY_READER_PASSWORD")) != bool(env.get("QKSTUDY_READER_USERNAME")):  # both or neither
        missing.append("QKSTUDY_READER_USERNAME" if env.get("QKSTUDY_READER_PASSWORD") else "QKSTUDY_READER_PASSWORD")
    if missing:
        print(f"error: set {', '.join(missing)}", file=sys.stderr)
        return 2
    uri, admin_user = env["MLFLOW_TRACKING_URI"], env["MLFLOW_TRACKING_USERNAME"]
    accounts = {"QKSTUDY_TRAINING_USERNAME": env["QKSTUDY_TRAINING_USERNAME"]}
    if env.get("QKSTUDY_READER_PASSWORD"):
        accounts["QKSTUDY_READER_USERNAME"] = env["QKSTUDY_READER_USERNAME"]
    names_used = [admin_user, *accounts.values()]
    if len(set(names_used)) < len(names_used):
        print(f"error: {', '.join(accounts)} and the admin account must all differ", file=sys.stderr)
        return 2
    try:
        rotated = rotate_admin(uri, admin_user, env["MLFLOW_TRACKING_PASSWORD"], env.get("MLFLOW_ADMIN_PASSWORD_PREVIOUS"))
    except ServerRefused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"MLflow admin {admin_user!r}: password {rotated}")
    if rotated == "unchanged" and env.get("MLFLOW_ADMIN_PASSWORD_PREVIOUS"):
        print("note: the rotation is done; remove MLFLOW_ADMIN_PASSWORD_PREVIOUS from docker/.env")
    admin = (admin_user, env["MLFLOW_TRACKING_PASSWORD"])
    try:
        user = accounts["QKSTUDY_TRAINING_USERNAME"]
        outcome = ensure_user(uri, admin, user, env["QKSTUDY_TRAINING_PASSWORD"])
        print(f"MLflow training user {user!r} {outcome} (not an admin)")
        if reader := accounts.get("QKSTUDY_READER_USERNAME"):
            outcome = ensure_reader(uri, admin, reader, env["QKSTUDY_READER_PASSWORD"])
            print(f"MLflow reader {reader!r} {outcome} (not an admin; role {READER_ROLE}: READ on every experiment)")
    except ServerRefused as err:  # e.g. 403: MLFLOW_TRACKING_USERNAME is no admin; 404 on /api/3.0: MLflow < 3.11
        print(f"error: {err} (is {admin_user!r} an admin, and the server MLflow >= 3.11 with its roles API?)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
