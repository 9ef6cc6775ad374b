"""Errors at the tracking store's edge: each is one `error:` line and exit code 2, never a
traceback, and nothing is left half-done in the store."""

import sqlite3
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.fixtures.synthetic import ONE_SEED
from tests.helpers import REPO, mlflow_store
from tests.published import unzip_store


def _finished_run(db: Path) -> str:
    with sqlite3.connect(db) as con:
        return con.execute(
            "SELECT t.value FROM runs r JOIN tags t ON r.run_uuid = t.run_uuid "
            "WHERE t.key IN ('run_id', 'qkstudy.run_id') AND r.status = 'FINISHED' LIMIT 1"
        ).fetchone()[0]


def test_eval_of_a_run_whose_artifacts_are_on_another_machine_is_one_error_line(tmp_path):
    """A store copied from the machine that trained it keeps that machine's artifact paths."""
    uri = unzip_store(REPO / "results" / "cpu-evidence-mqar-easy-mlflow.db.gz", tmp_path)
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        con.execute("UPDATE runs SET artifact_uri = 'file:///nonexistent/qkstudy/' || run_uuid || '/artifacts'")
    res = CliRunner().invoke(app, ["eval", "cpu-evidence-mqar-easy", _finished_run(tmp_path / "mlflow.db"), "--tracking-uri", uri])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    text = res.output.replace("\n", "")
    assert "its final weights cannot be read from file:///nonexistent/qkstudy/" in text and "the store's artifacts are elsewhere" in text


def test_eval_of_a_published_store_says_it_was_published_without_artifacts(tmp_path):
    uri = unzip_store(REPO / "results" / "cpu-evidence-mqar-easy-mlflow.db.gz", tmp_path)
    res = CliRunner().invoke(app, ["eval", "cpu-evidence-mqar-easy", _finished_run(tmp_path / "mlflow.db"), "--tracking-uri", uri])
    assert res.exit_code == 2 and "this store was published without its artifacts (qkstudy-published:/" in res.output.replace("\n", "")


def test_a_report_whose_artifacts_cannot_be_stored_ends_its_run_failed(tmp_path):
    uri = mlflow_store(tmp_path, ONE_SEED)
    with sqlite3.connect(tmp_path / "mlflow.db") as con:  # a location no process can create folders in
        con.execute("UPDATE experiments SET artifact_location = 'file:///proc/qkstudy-nowhere' WHERE name = ?", (ONE_SEED.study,))
    res = CliRunner().invoke(app, ["report", ONE_SEED.study, "--tracking-uri", uri, "--out", str(tmp_path / "r")])
    assert res.exit_code == 2, res.output
    assert "could not store it at file:///proc/qkstudy-nowhere" in res.output.replace("\n", "")
    assert (tmp_path / "r" / "report.md").is_file()  # the report itself stands
    exp = MlflowClient(uri).get_experiment_by_name(ONE_SEED.study)
    reports = MlflowClient(uri).search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'report'")
    assert [r.info.status for r in reports] == ["FAILED"]
    # negative control: where the artifacts can be stored, the report run finishes
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE name = ?", (f"file://{tmp_path / 'art'}", ONE_SEED.study))
    res = CliRunner().invoke(app, ["report", ONE_SEED.study, "--tracking-uri", uri, "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    reports = MlflowClient(uri).search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'report'")
    assert sorted(r.info.status for r in reports) == ["FAILED", "FINISHED"]  # the failed run is not reused: its location is bad


def test_status_at_a_database_that_refuses_says_so_without_mlflows_retries(tmp_path, monkeypatch):
    """MLflow alone retries a refused database for about 100 s in silence; one attempt answers."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["status", "s", "--tracking-uri", "postgresql://u:secret@127.0.0.1:1/mlflow"])
    text = res.output.replace("\n", "")
    assert res.exit_code == 1 and "tracking store postgresql://u:***@127.0.0.1:1/mlflow did not accept a connection" in text
    assert "Connection refused" in text and "secret" not in text and "retried" not in text


def test_a_study_argument_that_no_study_can_be_named_is_an_input_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in (["status"], ["report"], ["export", "--out", str(tmp_path / "x.parquet")]):
        res = CliRunner().invoke(app, [command[0], "../etc/passwd", *command[1:]])
        assert res.exit_code == 2 and "STUDY '../etc/passwd' is neither a spec file nor a study name" in res.output.replace("\n", "")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("content", "says"), [(b"\x8f" * 5000, "the file is not SQLite"), (b"", "it holds no MLflow tables")])
@pytest.mark.parametrize("command", ["report", "export"])
def test_report_and_export_of_a_file_that_is_no_mlflow_store_is_one_line_and_exit_2(tmp_path, command, content, says):
    db = tmp_path / "junk.db"
    db.write_bytes(content)
    extra = ["--out", str(tmp_path / "x.parquet")] if command == "export" else ["--out", str(tmp_path / "r")]
    res = CliRunner().invoke(app, [command, "foo", "--tracking-uri", f"sqlite:///{db}", *extra])
    assert res.exit_code == 2 and (res.exception is None or isinstance(res.exception, SystemExit)), res.output
    assert f"is not an MLflow database ({says})" in res.output and "SELECT" not in res.output and "Traceback" not in res.output


def test_calibrate_refuses_no_repeats_before_ray_starts():
    res = CliRunner().invoke(app, ["calibrate", "x.yaml", "--repeats", "0"])
    assert res.exit_code == 2 and "--repeats" in res.output
