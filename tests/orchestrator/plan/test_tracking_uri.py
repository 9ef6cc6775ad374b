"""Tracking URIs MLflow has no store for are refused before anything runs: in a spec
(`qkstudy validate`, exit 2 naming the file and field) and on the command line or in
MLFLOW_TRACKING_URI (exit 2 naming the option or variable), not as a traceback from inside MLflow
or a run that fails after Ray started."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan.spec import SpecError, parse_spec
from orchestrator.plan.tracking_uri import TRACKING_SCHEMES, TrackingURIError, check_tracking_uri, tracking_uri_problem

SPEC = "name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n"


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///runs/s/mlflow.db",
        "postgresql+psycopg://u:p@db:5432/mlflow",
        "mysql+pymysql://u@h/db",
        "http://mlflow:5000",
        "HTTPS://mlflow.example.org",
        "databricks",
        "databricks://profile",
        "sqlite:///rel.db?timeout=5",
    ],
)
def test_forms_mlflow_serves_pass(uri: str) -> None:
    assert tracking_uri_problem(uri) is None
    assert check_tracking_uri(uri, "--tracking-uri") == uri


@pytest.mark.parametrize(
    "uri, why",
    [
        ("bogus://nowhere", "unsupported tracking URI scheme 'bogus'"),
        ("s3://bucket/mlruns", "unsupported tracking URI scheme 's3'"),  # artifacts only
        ("", "empty tracking URI"),
        ("  ", "empty tracking URI"),
        ("http+foo://x", r"unsupported tracking URI scheme 'http\+foo'"),  # a driver on http
        ("postgresql+a+b://h/db", r"unsupported tracking URI scheme 'postgresql\+a\+b'"),
        ("SQLITE:///x.db", "database scheme 'SQLITE' .* must be lower case"),
        ("sqlite://", "in-memory SQLite store"),
        ("sqlite:///:memory:", "in-memory SQLite"),
        ("mlflow.db", "plain path, .* did you mean sqlite:///mlflow.db$"),
        ("runs/s/mlflow.sqlite", "did you mean sqlite:///runs/s/mlflow.sqlite$"),
        ("/abs/mlruns", "MLFLOW_ALLOW_FILE_STORE=true.*did you mean sqlite:////abs/mlruns/mlflow.db$"),
        ("file:///tmp/mlruns", "did you mean sqlite:////tmp/mlruns/mlflow.db$"),
        ("C:\\mlruns", "plain path"),
    ],
)
def test_forms_mlflow_cannot_serve_are_refused(uri: str, why: str) -> None:
    assert re.search(why, tracking_uri_problem(uri) or "")
    with pytest.raises(TrackingURIError, match=f"^MLFLOW_TRACKING_URI: .*{why}"):
        check_tracking_uri(uri, "MLFLOW_TRACKING_URI")


def test_the_schemes_are_mlflows_tracking_store_registry() -> None:
    """Cross-check against MLflow itself; the negative control is the refused `bogus` and `s3`
    above, which its registry does not have either."""
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    assert set(TRACKING_SCHEMES) | {""} == set(_tracking_store_registry._registry)
    assert not {"bogus", "s3"} & set(_tracking_store_registry._registry)


def test_a_spec_with_an_unsupported_tracking_uri_is_refused_naming_the_field(tmp_path) -> None:
    with pytest.raises(SpecError, match="tracking_uri: .*unsupported tracking URI scheme 'bogus'"):
        parse_spec(
            {"name": "s", "scales": ["cpu-xs"], "variants": ["standard"], "budget": {"tokens": 40960}, "tracking_uri": "bogus://nowhere"}
        )
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC + "tracking_uri: bogus://nowhere\n")
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and f"{spec}: tracking_uri" in res.output.replace("\n", "")
    spec.write_text(SPEC + "tracking_uri: http://mlflow:5000\n")  # negative control: a server URI validates
    assert CliRunner().invoke(app, ["validate", str(spec)]).exit_code == 0


@pytest.mark.parametrize("command", ["status", "report", "export"])
def test_commands_refuse_an_unsupported_tracking_uri_with_exit_2(tmp_path, monkeypatch, command: str) -> None:
    monkeypatch.chdir(tmp_path)
    extra = ["--out", str(tmp_path / "x.parquet")] if command == "export" else []
    res = CliRunner().invoke(app, [command, "s", "--tracking-uri", "bogus://nowhere", *extra])
    assert res.exit_code == 2, res.output
    assert "--tracking-uri: unsupported tracking URI scheme 'bogus'" in res.output.replace("\n", "")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://nowhere")
    res = CliRunner().invoke(app, [command, "s", *extra])
    assert res.exit_code == 2 and "MLFLOW_TRACKING_URI: unsupported" in res.output.replace("\n", ""), res.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("uri", ["runs/s/mlflow.db", "/abs/mlruns", "file:///tmp/mlruns", "C:mlruns"])
def test_a_file_store_passes_where_mlflow_allows_one(uri: str, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert tracking_uri_problem(uri) is None


def test_a_plain_path_on_the_command_line_is_one_error_line_with_a_did_you_mean(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    res = CliRunner().invoke(app, ["report", "s", "--tracking-uri", "mlflow.db"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "did you mean sqlite:///mlflow.db" in res.output.replace("\n", "")
    assert not (tmp_path / "mlflow.db").exists()


# --------------------------------------------------------------------------- credentials in a spec


@pytest.mark.parametrize(
    "field, uri, why",
    [
        ("tracking_uri", "postgresql+psycopg://mlflow:s3cr3t@db/mlflow", "embeds a password"),
        ("tracking_uri", "https://s3cr3t@mlflow.example.org", "embeds a token as its user"),
        ("tracking_uri", "https://mlflow.example.org/?token=s3cr3t", "embeds a secret query parameter"),
        ("storage_path", "s3://AKIAKEY:s3cr3t@bucket/qkstudy", "embeds a password"),
        ("storage_path", "s3://bucket/qkstudy?X-Amz-Signature=s3cr3t", "embeds a secret query parameter"),
    ],
)
def test_a_spec_uri_with_credentials_is_refused_naming_the_field(tmp_path, field, uri, why) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC + f"{field}: {uri}\n")
    res = CliRunner().invoke(app, ["validate", str(spec)])
    text = res.output + (res.stderr if res.stderr_bytes is not None else "")
    assert res.exit_code == 2, text
    assert f"{spec}: {field}:" in text and why in text and "MLFLOW_TRACKING_PASSWORD" in text
    assert "s3cr3t" not in text  # the refusal itself does not repeat the secret


@pytest.mark.parametrize(
    "field, uri",
    [
        ("tracking_uri", "postgresql+psycopg://mlflow@db/mlflow"),  # the password from PGPASSWORD / ~/.pgpass
        ("tracking_uri", "https://mlflow.example.org/?tokens=5"),  # "tokens" names no secret
        ("storage_path", "s3://bucket/qkstudy?region=eu-west-1"),
        ("storage_path", "/shared/qkstudy"),
    ],
)
def test_a_spec_uri_without_credentials_validates(tmp_path, field, uri) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC + f"{field}: {uri}\n")
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0, res.output


def test_an_override_cannot_bring_credentials_in_either(tmp_path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    res = CliRunner().invoke(app, ["validate", str(spec), "storage_path=s3://k:s3cr3t@bucket/x"])
    text = res.output + (res.stderr if res.stderr_bytes is not None else "")
    assert res.exit_code == 2 and "storage_path" in text and "s3cr3t" not in text, text
