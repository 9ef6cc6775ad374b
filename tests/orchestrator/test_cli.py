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
    assert schema["properties"]["extends"]["type"] == "string"  # resolved before validation, still a field of a file


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


def test_plan_table_estimates_device_hours_from_declared_throughput(tmp_path):
    spec = tmp_path / "s.yaml"
    # 40,960 tokens at 4,096 tokens/s on 2 CPU workers: 10 s x 2 devices = 20/3600 device-hours.
    spec.write_text("name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {mode: tokens, tokens: 40960, "
                    "throughput: {standard: 4096}}\nresources: {workers: 2}\n")
    res = CliRunner().invoke(app, ["plan", str(spec)])
    assert res.exit_code == 0, res.output
    assert f"{40960 / 4096 * 2 / 3600:,.1f} device-hours (throughput from the spec)" in res.output
    assert f"{40960 / 4096 * 2 / 3600:.2f}" in res.output  # the run's own column


CLUSTER_SPEC = ("name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n"
                "tracking_uri: http://mlflow:5000\nstorage_path: /shared/qkstudy/s\n")


def test_submit_bad_address_exits_2_without_the_password(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(CLUSTER_SPEC)
    for address, message in (("ftp://alice:s3cret@head:8265", "scheme 'ftp' is not supported"),
                             ("http://alice:s3cret@head:99999", "is not a valid URL"),
                             ("http://203.0.113.7:8265", "refusing to submit")):
        res = CliRunner().invoke(app, ["submit", "s.yaml", "--address", address])
        assert res.exit_code == 2, res.output
        assert message in res.output.replace("\n", "") and "s3cret" not in res.output


def test_submit_spec_outside_the_working_dir_names_the_spec(tmp_path, monkeypatch):
    (tmp_path / "s.yaml").write_text(CLUSTER_SPEC)
    (tmp_path / "wd").mkdir()
    monkeypatch.chdir(tmp_path / "wd")
    res = CliRunner().invoke(app, ["submit", str(tmp_path / "s.yaml"), "--address", "http://127.0.0.1:8265"])
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / 's.yaml'}: the spec must be inside the uploaded working dir" in res.output.replace("\n", "")
