"""redact_uri, and the promise it keeps: no password of a tracking URI in a report, its MLflow
artifacts, or anything the CLI prints.

The end-to-end tests use real stores reached by URIs that carry a password: a PostgreSQL
database (``postgresql+psycopg://user:password@127.0.0.1:port/db``, read by the report's SQL
path) and an ``mlflow server --app-name basic-auth`` on loopback
(``http://user:password@127.0.0.1:port``, read through the MLflow client), both from
tests/fixtures/services.py. They skip only where the PostgreSQL binaries are absent. MLflow's
own "View run at <URI>" lines are part of the output checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.track.tracking import REDACTED, redact_uri
from tests.synthetic_study import SyntheticStudy, write_synthetic_study

# --------------------------------------------------------------------------- redact_uri


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql+psycopg://mlflow:pa55@db:5432/mlflow", f"postgresql+psycopg://mlflow:{REDACTED}@db:5432/mlflow"),
        ("http://bob:hunter2@mlflow:5000", f"http://bob:{REDACTED}@mlflow:5000"),
        ("https://tok@host/x", f"https://{REDACTED}@host/x"),
        ("https://h/x?token=abc&a=1", f"https://h/x?token={REDACTED}&a=1"),
        ("https://h/x?X-Amz-Signature=abc&apiKey=k&tokens=5", f"https://h/x?X-Amz-Signature={REDACTED}&apiKey={REDACTED}&tokens=5"),
        # Unencoded '#', '?' or '@' in a password must not end the userinfo early.
        ("postgresql://u:p#a?s@s@db/mlflow", f"postgresql://u:{REDACTED}@db/mlflow"),
        ("s3://bucket/qkstudy", "s3://bucket/qkstudy"),
        ("sqlite:////tmp/runs/x/mlflow.db", "sqlite:////tmp/runs/x/mlflow.db"),
        ("/data/qkstudy", "/data/qkstudy"),
        # URIs inside messages, markdown and quotes.
        (
            "study 'x': no experiment in postgresql://u:pw1@db/m (check it)",
            f"study 'x': no experiment in postgresql://u:{REDACTED}@db/m (check it)",
        ),
        (
            "Tracking URI `http://a:pw2@h:5000`, and 'https://b:pw3@h'.",
            f"Tracking URI `http://a:{REDACTED}@h:5000`, and 'https://b:{REDACTED}@h'.",
        ),
    ],
)
def test_redact_uri(text: str, expected: str) -> None:
    assert redact_uri(text) == expected


def test_redact_uri_keeps_non_secret_queries_byte_for_byte() -> None:
    uri = "https://h/x?a=1&b=%2F&tokenizer=bpe"
    assert redact_uri(uri) == uri


# --------------------------------------------------------------------------- real stores

STUDY = SyntheticStudy(
    study="redaction", variants={"standard": 1.0, "coupled": 2.0}, scales={"xs": 2e6}, seeds=(0,), extend=(2.0, 3.0), n_eval=6
)


# The server takes a minute or two to come up on a loaded machine: slow.
@pytest.fixture(scope="module", params=["postgres", pytest.param("mlflow-server", marks=pytest.mark.slow)])
def password_store(request, tmp_path_factory):
    """(tracking URI with the password in it, the password), holding STUDY's training runs."""
    with pytest.MonkeyPatch.context() as mp:
        # A SQL store's default artifact root is ./mlruns at creation: keep it in a temp folder.
        mp.chdir(tmp_path_factory.mktemp("cwd"))
        if request.param == "postgres":
            pg = request.getfixturevalue("postgres_server")
            uri, password = pg.create_database("redaction"), pg.password
        else:
            base, user, password = request.getfixturevalue("mlflow_pg_server")
            uri = base.replace("http://", f"http://{user}:{password}@", 1)
        write_synthetic_study(STUDY, uri)
        yield uri, password


def _leaks(root: Path, password: str) -> list[str]:
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and password.encode() in p.read_bytes()]


def test_report_from_a_password_uri_leaks_it_nowhere(password_store, tmp_path) -> None:
    uri, password = password_store
    assert f":{password}@" in uri  # the store really is reached with the password in its URI
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", STUDY.study, "--tracking-uri", uri, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert password not in res.output

    files = {p.name for p in out.rglob("*") if p.is_file()}
    assert {"summary.json", "report.md", "report.html"} <= files
    assert _leaks(out, password) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tracking_uri"] == redact_uri(uri) and f":{REDACTED}@" in summary["tracking_uri"]
    assert summary["tracking_uri"] in (out / "report.md").read_text()  # still says which store, redacted

    client = MlflowClient(uri)
    run = client.get_run(summary["mlflow_report_run"])
    assert password not in json.dumps(run.to_dictionary())  # params, tags, metrics of the report's run
    artifacts = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    assert {"summary.json", "report.md", "report.html"} <= {p.name for p in artifacts.rglob("*")}
    assert _leaks(artifacts, password) == []


def test_cli_errors_and_status_redact_the_uri(password_store) -> None:
    uri, password = password_store
    res = CliRunner().invoke(app, ["report", "no-such-study", "--tracking-uri", uri, "--no-log"])
    assert res.exit_code == 2, res.output
    assert "no-such-study" in res.output and password not in res.output and REDACTED in res.output

    res = CliRunner().invoke(app, ["status", STUDY.study, "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    assert password not in res.output and REDACTED in res.output
