"""`qkstudy status` / `qkstudy report` given a spec whose local data is not the data the study's
runs were trained on: runs are matched by the content hash MLflow records, and the
command says the data differs, naming both hashes. A real SQLite MLflow store, its runs
created by the product's own helpers (``tracking.create_run``, ``register.run_params``)."""

import json

import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan.inputs import corpus_hashes, plan_study
from orchestrator.plan.spec import load_spec
from orchestrator.run.driver.records import run_params
from orchestrator.track.data_match import match_data
from orchestrator.track.tracking import STATUS_FINISHED, client_for, create_run, ensure_experiment, set_status
from orchestrator.track.tracking import study_tracking_uri as uri_of


def _study(tmp_path):
    """A 2-variant x 2-seed study on a text corpus of 3 files; its spec path."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"d{i}.txt").write_text(f"document {i}\n" * 50)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "dm",
                "scales": ["cpu-xs"],
                "variants": ["standard", "coupled"],
                "seeds": [0, 1],
                # planned, never trained: the epoch guard is not the subject
                "budget": {"mode": "tokens", "tokens": 100_000, "max_epochs": 1e6},
                "corpus": {"source": "text", "paths": [str(docs)]},
                "workdir": str(tmp_path / "work"),
            }
        )
    )
    return spec


def _log_finished(spec):
    """The study's runs as a driver would have logged them, finished; the data hash they used."""
    study = load_spec(spec)
    runs = plan_study(study)
    client = client_for(uri_of(study))
    exp = ensure_experiment(client, study.name)
    for r in runs:
        mid = create_run(client, exp, r, run_params(r, {"content_hash": r.data_hash, "path": "/shared/data/x"}))
        set_status(client, mid, STATUS_FINISHED)
    return runs, runs[0].data_hash


def _status(spec):
    res = CliRunner().invoke(app, ["status", str(spec), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_status_matches_runs_by_mlflows_data_hash_and_names_both(tmp_path):
    spec = _study(tmp_path)
    runs, held = _log_finished(spec)
    same = _status(spec)
    assert sorted(r["status"] for r in same["runs"]) == [STATUS_FINISHED] * 4 and not same.get("data_notes")

    (tmp_path / "docs" / "d1.txt").write_text("the copy here was edited\n" * 50)
    local = corpus_hashes(load_spec(spec))["text"]
    assert local != held
    got = _status(spec)
    # before: 4 finished rows plus the 4 runs planned on the local hash listed as "planned"
    assert sorted(r["run_id"] for r in got["runs"]) == sorted(r.run_id for r in runs)
    assert {r["status"] for r in got["runs"]} == {STATUS_FINISHED}
    (note,) = got["data_notes"]
    assert local in note and held in note and "differs" in note

    for f in (tmp_path / "docs").iterdir():  # the files are not on this machine at all
        f.unlink()
    (tmp_path / "docs").rmdir()
    gone = _status(spec)
    assert {r["status"] for r in gone["runs"]} == {STATUS_FINISHED} and len(gone["runs"]) == 4
    (note,) = gone["data_notes"]
    assert "cannot be read here" in note and held in note


def test_report_says_the_local_data_differs(tmp_path):
    spec = _study(tmp_path)
    _, held = _log_finished(spec)
    (tmp_path / "docs" / "d0.txt").write_text("edited\n" * 50)
    local = corpus_hashes(load_spec(spec))["text"]
    res = CliRunner().invoke(app, ["report", str(spec), "--no-log", "--json", "--out", str(tmp_path / "rep")])
    assert local in res.stderr and held in res.stderr and "differs" in res.stderr, res.stderr


def test_several_hashes_in_mlflow_none_local_plans_on_the_local_data():
    data, (note,) = match_data({"c": "L"}, {"c": {"A", "B"}})
    assert data == {"c": "L"} and "A, B" in note and "(content hash L)" in note
    assert match_data({"c": "A"}, {"c": {"A", "B"}}) == ({"c": "A"}, [])
    assert match_data({"c": "L"}, {}) == ({"c": "L"}, [])  # nothing in MLflow yet: nothing to say
    assert match_data({"c": None}, {"c": {"A"}})[0] == {"c": "A"}
