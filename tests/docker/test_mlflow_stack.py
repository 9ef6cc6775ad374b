"""The stack's tracking half, for real and without containers: `mlflow server --app-name
basic-auth` on loopback over a Postgres backend (fixtures in tests/fixtures/services.py). A run logged with
credentials lands in Postgres; requests without or with wrong credentials get 401; no secret
appears in the server's log. The slow test runs a tiny real study (`qkstudy run`) into it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

# A real `mlflow server` on a real PostgreSQL: integration, the slow tier.
pytestmark = pytest.mark.slow

SEARCH = "/api/2.0/mlflow/experiments/search?max_results=5"


def status_of(url: str, *, auth: tuple[str, str] | None = None, body: dict | None = None, host: str | None = None) -> int:
    """HTTP status of a GET (or a JSON POST when `body` is given), optionally with a Host."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if host:
        req.add_unredirected_header("Host", host)
    if data:
        req.add_header("Content-Type", "application/json")
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture
def client(mlflow_pg_server, monkeypatch) -> MlflowClient:
    uri, username, password = mlflow_pg_server
    # The standard variables: the product never takes credentials from a spec.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    return MlflowClient(tracking_uri=uri)


def test_run_logged_with_credentials_lands_in_postgres(client: MlflowClient, postgres_server, tmp_path) -> None:
    import psycopg

    experiment = f"qkstudy-stack-{uuid.uuid4().hex[:8]}"
    exp_id = client.create_experiment(experiment)
    run = client.create_run(exp_id, tags={"study": experiment, "variant": "coupled", "seed": "0"})
    run_id = run.info.run_id
    curve = [(4096 * (i + 1), 6.0 / (i + 1)) for i in range(5)]  # (tokens seen, val/loss)
    for tokens, loss in curve:
        client.log_metric(run_id, "val/loss", loss, step=tokens)
    client.log_param(run_id, "scale", "cpu-tiny")
    (tmp_path / "plan.json").write_text(json.dumps({"runs": 1}))
    client.log_artifact(run_id, str(tmp_path / "plan.json"))  # proxied to the artifact store
    client.set_terminated(run_id)

    # Through the API ...
    history = client.get_metric_history(run_id, "val/loss")
    assert sorted((m.step, m.value) for m in history) == curve
    assert client.get_run(run_id).data.tags["variant"] == "coupled"
    downloaded = client.download_artifacts(run_id, "plan.json", str(tmp_path / "dl"))
    assert json.loads(open(downloaded).read()) == {"runs": 1}
    # ... and in the Postgres backend store itself.
    with psycopg.connect(
        host=postgres_server.host, port=postgres_server.port, user=postgres_server.user, password=postgres_server.password, dbname="mlflow"
    ) as conn:
        rows = conn.execute("SELECT step, value FROM metrics WHERE run_uuid = %s AND key = 'val/loss' ORDER BY step", (run_id,)).fetchall()
        status = conn.execute("SELECT status FROM runs WHERE run_uuid = %s", (run_id,)).fetchone()
    assert [(int(s), float(v)) for s, v in rows] == curve
    assert status == ("FINISHED",)


def test_requests_without_valid_credentials_are_refused(mlflow_pg_server) -> None:
    uri, username, password = mlflow_pg_server
    assert status_of(uri + SEARCH, auth=(username, password)) == 200
    assert status_of(uri + SEARCH) == 401
    assert status_of(uri + SEARCH, auth=(username, password + "x")) == 401
    assert status_of(uri + SEARCH, auth=("nobody", password)) == 401
    create = "/api/2.0/mlflow/experiments/create"
    assert status_of(uri + create, body={"name": f"anon-{uuid.uuid4().hex[:6]}"}) == 401
    # The health probe (compose healthcheck) stays open; it reveals nothing.
    assert status_of(uri + "/health") == 200


def test_unknown_host_header_is_refused(mlflow_pg_server) -> None:
    """DNS-rebinding guard with the allow-list docker/.env.example ships."""
    uri, username, password = mlflow_pg_server
    assert status_of(uri + SEARCH, auth=(username, password), host="mlflow:5000") == 200
    assert status_of(uri + SEARCH, auth=(username, password), host="attacker.example") in (400, 403)


def test_client_without_credentials_is_refused(mlflow_pg_server, monkeypatch) -> None:
    from mlflow.exceptions import MlflowException

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    with pytest.raises(MlflowException, match="401|nauthorized|credentials"):
        MlflowClient(tracking_uri=mlflow_pg_server[0]).search_experiments(max_results=1)


def test_no_secret_in_server_log(client: MlflowClient, mlflow_pg_server) -> None:
    client.search_experiments(max_results=1)  # at least one authenticated request logged
    log = mlflow_pg_server.log_path.read_text(errors="replace")
    for secret in mlflow_pg_server.secrets_in_env:
        assert secret not in log


STUDY = """\
name: stack-{suffix}
corpus: {{source: stdlib, max_documents: 30}}
tokenizer: {{vocab_size: 512}}
scales: [cpu-xs]
variants: [standard]
budget: {{mode: tokens, tokens: 8192}}
train: {{global_batch: 8, seq_len: 64}}
eval: {{num_evals: 1, max_windows: 4, final_max_windows: 4}}
resources: {{workers: 1, cpus_per_worker: 1, zero_stage: 2}}
tracking_uri: {uri}
storage_path: {storage}
"""


def test_tiny_study_tracks_into_the_server(mlflow_pg_server, postgres_server, tmp_path, monkeypatch) -> None:
    """`qkstudy run` (real Ray + DeepSpeed) against the basic-auth server: credentials only
    from the standard environment variables, the run lands in Postgres, nothing leaks."""
    import psycopg

    uri, username, password = mlflow_pg_server
    name = f"stack-{uuid.uuid4().hex[:6]}"
    (tmp_path / "study.yaml").write_text(STUDY.format(suffix=name.removeprefix("stack-"), uri=uri, storage=tmp_path / "ray"))
    env = {
        **os.environ,
        "QKSTUDY_CACHE": str(tmp_path / "cache"),
        "MLFLOW_TRACKING_USERNAME": username,
        "MLFLOW_TRACKING_PASSWORD": password,
    }
    env.pop("RAY_ADDRESS", None)
    qkstudy = Path(sys.executable).with_name("qkstudy")
    result = subprocess.run([str(qkstudy), "run", "study.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for secret in mlflow_pg_server.secrets_in_env:
        assert secret not in result.stdout + result.stderr

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], "tags.`qkstudy.kind` = 'train'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["qkstudy.variant"] == "standard"
    with psycopg.connect(
        host=postgres_server.host, port=postgres_server.port, user=postgres_server.user, password=postgres_server.password, dbname="mlflow"
    ) as conn:
        (last_step,) = conn.execute("SELECT max(step) FROM metrics WHERE run_uuid = %s AND key = 'val/ppl'", (run.info.run_id,)).fetchone()
    assert last_step == 8192  # step = tokens seen, final eval at the budget
    assert 1.0 < run.data.metrics["val/ppl"] < 512


def test_training_account_is_not_an_admin(mlflow_pg_server, monkeypatch) -> None:
    """docker/mlflow/create_user.py (the stack's `mlflow-users` service) gives training a
    non-admin account: it logs its own runs, but cannot read the admin's experiments, create
    users or make itself an admin. Idempotent: a second run re-keys the same account."""
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    uri, admin, admin_password = mlflow_pg_server
    trainer, trainer_password = f"train-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    script = Path(__file__).resolve().parents[2] / "docker" / "mlflow" / "create_user.py"
    env = {
        "PATH": os.environ["PATH"],
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_TRACKING_USERNAME": admin,
        "MLFLOW_TRACKING_PASSWORD": admin_password,
        "QKSTUDY_TRAINING_USERNAME": trainer,
        "QKSTUDY_TRAINING_PASSWORD": trainer_password,
    }
    for outcome in ("created", "updated"):
        res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and outcome in res.stdout, res.stderr[-2000:]
    assert (
        subprocess.run(
            [sys.executable, str(script)], env={**env, "QKSTUDY_TRAINING_USERNAME": admin}, capture_output=True, timeout=120
        ).returncode
        == 2
    )

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin_password)
    private = MlflowClient(uri).create_experiment(f"admin-only-{uuid.uuid4().hex[:6]}")

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", trainer)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", trainer_password)
    client = MlflowClient(uri)
    exp_id = client.create_experiment(f"study-{uuid.uuid4().hex[:6]}")
    run_id = client.create_run(exp_id).info.run_id
    client.log_metric(run_id, "val/loss", 3.5, step=4096)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val/loss")] == [(4096, 3.5)]
    visible = {e.experiment_id for e in client.search_experiments()}
    assert exp_id in visible and private not in visible
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED|ermission"):
        client.get_experiment(private)
    auth = AuthServiceClient(uri)
    assert auth.get_user(trainer).is_admin is False
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED|ermission"):
        auth.create_user(f"x-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex)
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED|ermission"):
        auth.update_user_admin(trainer, True)
