"""Spec validation: every malformed spec gets a precise error and exit code 2, before Ray or MLflow."""

from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan.spec import SpecError, load_spec
from orchestrator.track.tracking import sqlite_path, study_tracking_uri
from tests.helpers import REPO

GOOD = """\
name: t
scales: [cpu-xs]
variants: [standard, {name: coupled, options: {integrator: leapfrog, n_steps: 2}}]
budget: {mode: flops, tokens: 40960}
"""

MALFORMED = {
    "missing_file": (None, "no such file"),
    "invalid_yaml": ("name: t\nscales: [cpu-xs\n", "invalid YAML at line"),
    "empty_file": ("", "the spec is empty"),
    "unknown_field": (GOOD + "colour: blue\n", "colour: unknown field"),
    "wrong_type": (GOOD.replace("seeds", "x") + "seeds: three\n", "seeds: Input should be a valid list"),
    "unknown_variant": (
        GOOD.replace("standard,", "standard, banana,"),
        "variants[1]: name: unknown variant 'banana'; allowed: standard, coupled",
    ),
    "unknown_scale": (GOOD.replace("cpu-xs", "cpu-xxl"), "scales[0]: unknown scale 'cpu-xxl'; allowed: cpu-xs"),
    "negative_budget": (GOOD.replace("40960", "-5"), "budget.tokens: budget tokens must be positive, got -5"),
    "negative_budget_of_a_scale": (GOOD.replace("40960", "{cpu-xs: -5}"), "budget.tokens: budget tokens of cpu-xs must be positive"),
    "repeated_variant": (GOOD.replace("standard,", "standard, standard,"), "variants: variant names repeat"),
    "unsupported_tracking_uri": (GOOD + "tracking_uri: bogus://nowhere\n", "tracking_uri: unsupported tracking URI scheme 'bogus'"),
    "impossible_resources": (GOOD + "resources: {workers: 0, zero_stage: 5}\n", "resources.workers: Input should be greater than 0"),
    "missing_corpus": (GOOD + "corpus: {source: parquet, text_column: text}\n", "corpus: paths: required for source 'parquet'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_spec_exits_2_with_precise_error(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text, expected = MALFORMED[case]
    spec = tmp_path / f"{case}.yaml"
    if text is not None:
        spec.write_text(text)
    for cmd in (["validate", str(spec)], ["plan", str(spec)], ["run", str(spec)]):
        res = CliRunner().invoke(app, cmd)
        assert res.exit_code == 2, (cmd, res.output)
        assert str(spec) in res.output and expected in res.output.replace("\n", ""), res.output
    assert not ray.is_initialized()
    assert not list(tmp_path.rglob("mlflow.db")) and not (tmp_path / "runs").exists()


def test_run_refuses_missing_local_corpus_files_before_ray(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD + "corpus: {source: text, paths: [does/not/exist/*.txt]}\n")
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and "corpus.paths[0]: no file or folder matches 'does/not/exist/*.txt'" in res.output
    res = CliRunner().invoke(app, ["validate", str(spec), "--data-elsewhere"])  # only on the cluster: said, not read
    assert res.exit_code == 0 and "corpus files not read (--data-elsewhere)" in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["run", str(spec)])
    assert res.exit_code == 2 and "corpus.paths[0]: no file or folder matches 'does/not/exist/*.txt'" in res.output
    assert not ray.is_initialized() and not (tmp_path / "runs").exists()


def test_impossible_resources_lists_every_problem(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD + "resources: {workers: 0, zero_stage: 5}\n")
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    locs = [loc for loc, _ in e.value.problems]
    assert locs == ["resources.workers", "resources.zero_stage"]
    assert "Input should be 0, 1, 2 or 3 (got 5)" in str(e.value)


def test_bad_variant_option_names_allowed_options(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD.replace("integrator: leapfrog", "integrator: rk4"))
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert e.value.problems[0][0] == "variants[1].options"
    assert "rk4" in str(e.value)


def test_reference_must_be_a_variant(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD + "reference: differential\n")
    with pytest.raises(SpecError, match="reference 'differential' is not one of the variants"):
        load_spec(spec)


def test_good_spec_defaults(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD)
    s = load_spec(spec)
    assert [v.name for v in s.variants] == ["standard", "coupled"]
    assert s.variants[1].options == {"integrator": "leapfrog", "n_steps": 2}
    assert list(s.corpus_map) == ["stdlib"] and s.seeds == [0] and s.resources.zero_stage == 2
    assert s.workdir_path == (Path.cwd() / "runs" / "t").resolve()
    uri = study_tracking_uri(s)
    assert uri == f"sqlite:///{Path.cwd().resolve()}/runs/t/mlflow.db" and sqlite_path(uri) == s.workdir_path / "mlflow.db"


JOBS = sorted((REPO / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("job", JOBS, ids=[j.stem for j in JOBS])
def test_every_job_validates_and_plans(job):
    from orchestrator.plan.planner import plan

    runs = plan(load_spec(job))
    assert runs and len({r.run_id for r in runs}) == len(runs)


def test_duplicate_yaml_key_is_an_error(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: a\nname: b\n" + GOOD.split("\n", 1)[1])
    with pytest.raises(SpecError, match="line 2, column 1: duplicate key 'name'"):
        load_spec(spec)


def test_unknown_field_suggests_the_close_one(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD + "corpus: {source: text, path: docs}\n")
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert "corpus.path: unknown field (did you mean 'paths'? allowed: " in str(e.value)


def test_indivisible_global_batch_fails_validation(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD + "train: {global_batch: 7}\nresources: {workers: 2}\n")
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and "train.global_batch 7 (at scale cpu-xs) is not divisible by resources.workers 2" in res.output
