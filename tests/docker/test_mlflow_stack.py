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

from tests.helpers import REPO, qk

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
    result = qk("run", "study.yaml", cwd=tmp_path, env=env, timeout=600)
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

    # A read-only account (a READ grant) still gets the report, on disk, said not to be logged;
    # the admin's report is logged as the study's report run (the control).
    from mlflow.server.auth.client import AuthServiceClient

    reader, reader_password = f"read-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    AuthServiceClient(uri).create_user(reader, reader_password)
    granted = qk("grant", name, reader, "--tracking-uri", uri, env=env, timeout=120)
    assert granted.returncode == 0, granted.stderr
    # the reader before any report run exists, the admin (creates it), the reader again (finds it)
    for i, (user, pw_, logged) in enumerate(
        ((reader, reader_password, False), (username, password, True), (reader, reader_password, False))
    ):
        out = tmp_path / f"report-{i}"
        user_env = {**env, "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": pw_}
        rep = qk("report", name, "--tracking-uri", uri, "--out", str(out), env=user_env, timeout=300)
        assert rep.returncode == 0 and (out / "report.md").is_file(), rep.stderr[-3000:]
        assert ("not logged to MLflow" in rep.stderr) is not logged, rep.stderr[-3000:]
        report_runs = client.search_runs([experiment.experiment_id], "tags.`qkstudy.kind` = 'report'")
        assert [r.data.tags["qkstudy.report_revision"] for r in report_runs] == ([] if i == 0 else ["1"]), i


def test_training_account_is_not_an_admin(mlflow_pg_server, monkeypatch) -> None:
    """docker/mlflow/create_user.py (the stack's `mlflow-users` service) gives training a
    non-admin account: it logs its own runs, but cannot read the admin's experiments, create
    users or make itself an admin. Idempotent: a second run re-keys the same account."""
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    uri, admin, admin_password = mlflow_pg_server
    trainer, trainer_password = f"train-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    script = REPO / "docker" / "mlflow" / "create_user.py"
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


SCRIPT = REPO / "docker" / "mlflow" / "create_user.py"


def _accounts(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the stack's `mlflow-users` script with exactly `env` (plus PATH)."""
    return subprocess.run(
        [sys.executable, str(SCRIPT)], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=120
    )


def _as(monkeypatch, uri: str, user: str, password: str) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    return MlflowClient(uri)


def test_reader_account_reads_every_study_and_writes_none(mlflow_pg_server, monkeypatch, tmp_path) -> None:
    """The reader the bootstrap creates reads studies made before and after it (runs, curves,
    artifacts) through its role, and can neither log to them nor manage accounts. Negative
    control: an account without the role sees none of them."""
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    uri, admin, admin_password = mlflow_pg_server
    tag = uuid.uuid4().hex[:6]
    trainer, reader, outsider = (f"{k}-{tag}" for k in ("train", "read", "other"))
    pw = {u: uuid.uuid4().hex for u in (trainer, reader, outsider)}
    env = {
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_TRACKING_USERNAME": admin,
        "MLFLOW_TRACKING_PASSWORD": admin_password,
        "QKSTUDY_TRAINING_USERNAME": trainer,
        "QKSTUDY_TRAINING_PASSWORD": pw[trainer],
        "QKSTUDY_READER_USERNAME": reader,
        "QKSTUDY_READER_PASSWORD": pw[reader],
    }
    before = _as(monkeypatch, uri, admin, admin_password).create_experiment(f"before-{tag}")
    for outcome in ("created", "updated"):  # idempotent: the role and its grant are not doubled
        res = _accounts(env)
        assert res.returncode == 0 and f"MLflow reader {reader!r} {outcome}" in res.stdout, res.stderr[-2000:]
    assert _accounts({**env, "QKSTUDY_READER_USERNAME": trainer}).returncode == 2  # names must differ
    no_admin = _accounts(
        {**env, "MLFLOW_TRACKING_USERNAME": reader, "MLFLOW_TRACKING_PASSWORD": pw[reader], "QKSTUDY_READER_USERNAME": f"r2-{tag}"}
    )  # the "admin" is the reader: refused, no traceback
    assert no_admin.returncode == 2 and "an admin" in no_admin.stderr and "Traceback" not in no_admin.stderr, no_admin.stderr
    auth = AuthServiceClient(uri)
    auth.create_user(outsider, pw[outsider])
    role = next(r for r in auth.list_roles("default") if r.name == "qkstudy-readers")
    assert [(p.resource_type, p.resource_pattern, p.permission) for p in auth.list_role_permissions(role.id)] == [
        ("experiment", "*", "READ")
    ]
    assert auth.get_user(reader).is_admin is False

    training = _as(monkeypatch, uri, trainer, pw[trainer])
    study = training.create_experiment(f"study-{tag}")  # created after the reader
    run_id = training.create_run(study).info.run_id
    training.log_metric(run_id, "val/loss", 3.25, step=1024)
    (tmp_path / "note.txt").write_text("report")
    training.log_artifact(run_id, str(tmp_path / "note.txt"))

    reading = _as(monkeypatch, uri, reader, pw[reader])
    assert {before, study} <= {e.experiment_id for e in reading.search_experiments()}
    assert [m.value for m in reading.get_metric_history(run_id, "val/loss")] == [3.25]
    assert Path(reading.download_artifacts(run_id, "note.txt", str(tmp_path / "dl"))).read_text() == "report"
    denied = "403|PERMISSION_DENIED|ermission"
    with pytest.raises(MlflowException, match=denied):
        reading.log_metric(run_id, "val/loss", 0.0, step=2048)
    with pytest.raises(MlflowException, match=denied):
        reading.create_run(study)
    with pytest.raises(MlflowException, match=denied):
        AuthServiceClient(uri).create_user(f"x-{tag}", uuid.uuid4().hex)

    other = _as(monkeypatch, uri, outsider, pw[outsider])
    assert {before, study}.isdisjoint(e.experiment_id for e in other.search_experiments())
    with pytest.raises(MlflowException, match=denied):
        other.get_metric_history(run_id, "val/loss")


def test_password_rotation_keeps_the_services_in(mlflow_pg_server, monkeypatch) -> None:
    """docker/.env changed after the first stack-up. The admin (bootstrapped once) rotates only
    with MLFLOW_ADMIN_PASSWORD_PREVIOUS: without it the script exits 2 naming that variable
    (not a silent lockout); with it the new password logs in and the old one no longer does.
    The training and reader accounts take their new passwords at the next run."""
    from mlflow.server.auth.client import AuthServiceClient

    uri, admin, admin_password = mlflow_pg_server
    tag = uuid.uuid4().hex[:6]
    boss, trainer, reader = f"admin-{tag}", f"train-{tag}", f"read-{tag}"  # a second admin: the fixture's stays as it is
    old, new = uuid.uuid4().hex, uuid.uuid4().hex
    _as(monkeypatch, uri, admin, admin_password)
    AuthServiceClient(uri).create_user(boss, old)
    AuthServiceClient(uri).update_user_admin(boss, True)
    env = {
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_TRACKING_USERNAME": boss,
        "MLFLOW_TRACKING_PASSWORD": old,
        "QKSTUDY_TRAINING_USERNAME": trainer,
        "QKSTUDY_TRAINING_PASSWORD": "t1-" + uuid.uuid4().hex,
        "QKSTUDY_READER_USERNAME": reader,
        "QKSTUDY_READER_PASSWORD": "r1-" + uuid.uuid4().hex,
    }
    first = _accounts(env)
    assert first.returncode == 0 and "password unchanged" in first.stdout, first.stderr[-2000:]

    rotated = {
        **env,
        "MLFLOW_TRACKING_PASSWORD": new,
        "QKSTUDY_TRAINING_PASSWORD": "t2-" + uuid.uuid4().hex,
        "QKSTUDY_READER_PASSWORD": "r2-" + uuid.uuid4().hex,
    }
    refused = _accounts(rotated)
    assert refused.returncode == 2 and "MLFLOW_ADMIN_PASSWORD_PREVIOUS" in refused.stderr
    res = _accounts({**rotated, "MLFLOW_ADMIN_PASSWORD_PREVIOUS": old})
    assert res.returncode == 0 and "password rotated" in res.stdout, res.stderr[-2000:]
    again = _accounts({**rotated, "MLFLOW_ADMIN_PASSWORD_PREVIOUS": old})  # left in .env: harmless
    assert again.returncode == 0 and "password unchanged" in again.stdout, again.stderr[-2000:]

    url = f"{uri}{SEARCH}"
    for user, key in ((boss, "MLFLOW_TRACKING_PASSWORD"), (trainer, "QKSTUDY_TRAINING_PASSWORD"), (reader, "QKSTUDY_READER_PASSWORD")):
        assert status_of(url, auth=(user, rotated[key])) == 200, user
        assert status_of(url, auth=(user, env[key])) == 401, user  # one server worker: no stale cache


def test_grant_and_revoke_one_study(mlflow_pg_server, monkeypatch, tmp_path) -> None:
    """`qkstudy grant` gives one account READ on one study, made by the study's creator (the
    training account), not on its neighbour; `revoke` takes it back. Bad input exits 2 naming
    what is wrong: an unknown user, permission or study, a local store, an account that does
    not manage the study."""
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient
    from typer.testing import CliRunner

    from orchestrator.cli import app

    uri, admin, admin_password = mlflow_pg_server
    tag = uuid.uuid4().hex[:6]
    trainer, alice = f"train-{tag}", f"alice-{tag}"
    pw = {trainer: uuid.uuid4().hex, alice: uuid.uuid4().hex}
    _as(monkeypatch, uri, admin, admin_password)
    for user in (trainer, alice):
        AuthServiceClient(uri).create_user(user, pw[user])
    training = _as(monkeypatch, uri, trainer, pw[trainer])
    study, neighbour = (training.create_experiment(f"{k}-{tag}") for k in ("study", "neighbour"))
    runs = {e: training.create_run(e).info.run_id for e in (study, neighbour)}
    for run_id in runs.values():
        training.log_metric(run_id, "val/loss", 3.0, step=1)

    def qk(*args: str) -> tuple[int, str]:
        res = CliRunner().invoke(app, [*args, "--tracking-uri", uri])
        return res.exit_code, res.output

    def alice_reads(exp_id: str) -> bool:
        try:
            _as(monkeypatch, uri, alice, pw[alice]).get_metric_history(runs[exp_id], "val/loss")
            return True
        except MlflowException:
            return False

    assert not alice_reads(study)  # negative control: nothing before the grant
    _as(monkeypatch, uri, trainer, pw[trainer])  # the creator manages its study
    code, output = qk("grant", f"study-{tag}", alice)
    assert code == 0 and f"{alice}: READ on study study-{tag}" in output, output
    assert alice_reads(study) and not alice_reads(neighbour)
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED|ermission"):
        _as(monkeypatch, uri, alice, pw[alice]).log_metric(runs[study], "val/loss", 0.0, step=2)

    _as(monkeypatch, uri, trainer, pw[trainer])
    for args, says in (
        (("grant", f"study-{tag}", f"nobody-{tag}"), "no such account"),
        (("grant", f"study-{tag}", alice, "--permission", "OWN"), "choose one of READ, EDIT, MANAGE"),
        (("grant", f"missing-{tag}", alice), "no such experiment"),
    ):
        code, output = qk(*args)
        assert code == 2 and says in output, (args, output)
    _as(monkeypatch, uri, alice, pw[alice])  # READ does not let alice grant
    code, output = qk("grant", f"study-{tag}", trainer, "--permission", "MANAGE")
    assert code == 2 and "may not manage it" in output, output
    res = CliRunner().invoke(app, ["grant", "some-study", alice, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"])
    assert res.exit_code == 2 and "a local store has no accounts" in res.output, res.output

    _as(monkeypatch, uri, trainer, pw[trainer])
    for _ in range(2):  # a second revoke finds no grant: already done, not "no such account"
        code, output = qk("revoke", f"study-{tag}", alice)
        assert code == 0 and "no grant" in output, output
    assert not alice_reads(study)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong-" + uuid.uuid4().hex)  # refused credentials: exit 2, named
    code, output = qk("grant", f"study-{tag}", alice)
    assert code == 2 and "refuses MLFLOW_TRACKING_USERNAME" in output, output
