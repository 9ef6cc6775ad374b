"""``KEY=VALUE`` overrides after the spec on `validate`, `plan`, `run` and `submit`: merged before
validation, named in errors (exit 2), handed to training and recorded with every run, and passed
on to a submitted job."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app

SPEC = {"name": "ov", "scales": ["cpu-xs"], "variants": ["standard", "coupled"], "seeds": [0], "budget": {"mode": "flops", "tokens": 40960}}


@pytest.fixture
def spec(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(SPEC))
    return f


def _plan(spec, *overrides):
    res = CliRunner().invoke(app, ["plan", str(spec), "--json", *overrides])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_validate_counts_the_runs_of_the_merged_spec(spec):
    res = CliRunner().invoke(app, ["validate", str(spec), "seeds=[0,1,2]"])
    assert res.exit_code == 0, res.output
    assert "seeds=[0,1,2]: ok" in res.output and "3 seeds, 6 runs" in res.output
    plain = CliRunner().invoke(app, ["validate", str(spec)])  # negative control: the file alone
    assert plain.exit_code == 0 and "1 seed, 2 runs" in plain.output


@pytest.mark.parametrize(
    ("override", "says"),
    [
        (
            "budget.tokns_per_param=10",
            "override 'budget.tokns_per_param=10': budget.tokns_per_param: unknown field (did you mean 'tokens_per_param'?",
        ),
        ("budget", "override 'budget': expected KEY=VALUE"),
        ("budget.mode=banana", "override 'budget.mode=banana': budget.mode: Input should be 'tokens', 'flops' or 'wallclock'"),
        # refused by the planner, not the schema: still the override and the field
        ("budget={tokens: 1}", "override 'budget={tokens: 1}': budget: budget for scale cpu-xs is 1 tokens, less than one optimizer step"),
        ("resources={workers: 3}", "override 'resources={workers: 3}': resources.workers: train.global_batch 16 (at scale cpu-xs) is not"),
        ("train.seq_len=100", "override 'train.seq_len=100': train.seq_len: train.seq_len 100 must equal the MQAR corpus's seq_len 64"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_a_bad_override_exits_2_naming_it_and_the_field(spec, command, override, says):
    if override.startswith("train.seq_len"):
        spec.write_text(yaml.safe_dump({**SPEC, "corpus": {"source": "mqar", "mqar": {"preset": "easy"}}}))
    res = CliRunner().invoke(app, [command, str(spec), override])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split())


def test_plan_tokens_follow_the_override_and_ids_the_config(spec):
    base = _plan(spec)
    doubled = _plan(spec, "budget.tokens=81920")
    assert doubled[0]["tokens"] == 2 * base[0]["tokens"]  # the reference's; the others are FLOP-matched to it
    assert all(d["tokens"] > b["tokens"] for d, b in zip(doubled, base))
    assert {r["run_id"] for r in doubled}.isdisjoint(r["run_id"] for r in base)
    same = _plan(spec, "budget.tokens=40960", "seeds=[0]")  # the file's own values: the same runs
    assert [r["run_id"] for r in same] == [r["run_id"] for r in base]


def test_run_trains_the_merged_spec_and_records_its_overrides(spec, monkeypatch):
    from orchestrator.run.driver import study as study_mod
    from orchestrator.run.driver.runner import StudyResult
    from orchestrator.track.provenance import OVERRIDES_TAG

    seen = {}

    def fake_run_study(s, options, **kw):
        seen.update(study=s, provenance=options.provenance, **kw)
        return StudyResult()

    monkeypatch.setattr(study_mod, "run_study", fake_run_study)
    monkeypatch.chdir(spec.parent)
    res = CliRunner().invoke(app, ["run", spec.name, "budget.tokens=81920", "seeds=[0,1]"])
    assert res.exit_code == 0, res.output
    s = seen["study"]
    assert (s.budget.tokens, s.seeds, s.overrides) == (81920, [0, 1], ["budget.tokens=81920", "seeds=[0,1]"])
    tags = seen["provenance"].tags  # set on every run the driver creates or resumes
    assert json.loads(tags[OVERRIDES_TAG]) == ["budget.tokens=81920", "seeds=[0,1]"]
    assert yaml.safe_load(seen["provenance"].artifacts["spec/resolved.yaml"])["resolved"]["seeds"] == [0, 1]


def test_run_without_overrides_records_none(spec, monkeypatch):
    from orchestrator.run.driver import study as study_mod
    from orchestrator.run.driver.runner import StudyResult
    from orchestrator.track.provenance import OVERRIDES_TAG

    seen = {}
    monkeypatch.setattr(
        study_mod, "run_study", lambda s, options, **kw: seen.update(study=s, provenance=options.provenance) or StudyResult()
    )
    monkeypatch.chdir(spec.parent)
    assert CliRunner().invoke(app, ["run", spec.name]).exit_code == 0
    assert seen["study"].seeds == [0] and json.loads(seen["provenance"].tags[OVERRIDES_TAG]) == []


def test_run_refuses_a_bad_override_before_training(spec, monkeypatch):
    from orchestrator.run.driver import study as study_mod

    monkeypatch.setattr(study_mod, "run_study", lambda s, *a, **kw: pytest.fail("trained a refused spec"))
    res = CliRunner().invoke(app, ["run", str(spec), "seeds=[0, 0]"])
    assert res.exit_code == 2 and "override 'seeds=[0, 0]': seeds:" in res.output


def test_submitted_job_runs_the_same_overrides(spec):
    from orchestrator.run.driver.submit import build_job

    spec.write_text(yaml.safe_dump({**SPEC, "tracking_uri": "http://127.0.0.1:5000", "storage_path": "/shared/ray"}))
    overrides = ["seeds=[0,1,2]", "corpus.max_documents=60", "description=a b; $(touch x)"]
    job = build_job(spec, "http://127.0.0.1:8265", working_dir=spec.parent, overrides=overrides)
    assert shlex.split(job["entrypoint"]) == ["python", "-m", "orchestrator.cli", "run", spec.name, *overrides]
    assert shlex.split(job["metadata"]["overrides"]) == overrides
    # negative control: without overrides the entrypoint and metadata are as before
    plain = build_job(spec, "http://127.0.0.1:8265", working_dir=spec.parent)
    assert (
        shlex.split(plain["entrypoint"]) == ["python", "-m", "orchestrator.cli", "run", spec.name] and "overrides" not in plain["metadata"]
    )


def test_submit_validates_the_merged_spec(spec, monkeypatch):
    monkeypatch.chdir(spec.parent)
    # the file keeps its store in the job's working dir: refused, naming the override that unset it
    spec.write_text(yaml.safe_dump({**SPEC, "storage_path": "/shared/ray", "tracking_uri": "http://127.0.0.1:5000"}))
    res = CliRunner().invoke(app, ["submit", spec.name, "--address", "http://127.0.0.1:8265", "tracking_uri=null"])
    assert res.exit_code == 2, res.output
    assert "override 'tracking_uri=null': tracking_uri:" in res.output
    res = CliRunner().invoke(app, ["submit", spec.name, "--address", "http://127.0.0.1:8265", "budget.tokns=1"])
    assert res.exit_code == 2 and "override 'budget.tokns=1': budget.tokns: unknown field" in res.output


def test_a_plan_refused_for_a_field_of_the_file_names_the_file_and_the_field(spec):
    spec.write_text(yaml.safe_dump({**SPEC, "resources": {"workers": 3}}))
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and f"{spec}: resources.workers: train.global_batch 16" in " ".join(res.output.split())
