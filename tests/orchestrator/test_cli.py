"""CLI commands that need no cluster: model info, schema, plan output."""

import json

from typer.testing import CliRunner

from orchestrator.cli import app


def test_model_info_json_analytic_equals_measured():
    res = CliRunner().invoke(app, ["model", "info", "--preset", "cpu-xs", "--variant", "coupled", "--seq-len", "64", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["n_params"] < info["n_params_total"]
    assert abs(info["flops_per_token_measured"] / info["flops_per_token"] - 1) < 0.02


def test_model_info_bad_variant_exits_2():
    res = CliRunner().invoke(app, ["model", "info", "--preset", "cpu-xs", "--variant", "banana"])
    assert res.exit_code == 2 and "unknown variant 'banana'" in res.output


def test_schema_is_json_schema_of_a_study():
    res = CliRunner().invoke(app, ["schema"])
    schema = json.loads(res.output)
    assert {"name", "scales", "variants", "budget"} <= set(schema["required"])
    assert "corpora" in schema["properties"] and "resources" in schema["properties"]


def test_plan_json_fields(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nscales: [cpu-xs]\nvariants: [standard, coupled]\nbudget: {tokens: 40960}\nextend: [2]\n")
    rows = json.loads(CliRunner().invoke(app, ["plan", str(spec), "--json"]).output)
    assert [r["variant"] for r in rows] == ["standard", "standard", "coupled"]
    assert set(rows[0]) >= {"run_id", "variant", "scale", "seed", "extend", "n_params", "n_params_total",
                            "flops_per_token", "tokens", "total_flops"}
    assert rows[1]["tokens"] == 2 * rows[0]["tokens"]


def test_status_of_unknown_study_exits_2_and_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["status", "no-such-study"])
    assert res.exit_code == 2 and "no MLflow store" in res.output
    assert not (tmp_path / "runs").exists()


def test_train_given_a_study_spec_points_to_plan_write_runs(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n")
    res = CliRunner().invoke(app, ["train", str(spec)])
    assert res.exit_code == 2 and "this is a study spec, not a run" in res.output.replace("\n", "")


def test_write_runs_refuses_a_file(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n")
    (tmp_path / "f").write_text("x")
    res = CliRunner().invoke(app, ["plan", str(spec), "--write-runs", str(tmp_path / "f")])
    assert res.exit_code == 2 and "needs a folder" in res.output and (tmp_path / "f").read_text() == "x"
