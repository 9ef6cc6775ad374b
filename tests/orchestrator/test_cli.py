"""CLI commands that need no cluster: model info, schema, plan output."""

import json

import pytest
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
    assert {"name", "scales", "variants", "budget"} <= set(schema["else"]["required"])  # unless the file extends a base
    assert "corpora" in schema["properties"] and "resources" in schema["properties"]
    assert schema["properties"]["extends"]["type"] == "string"  # resolved before validation, still a field of a file


def test_an_lr_written_as_yaml_1_1_reads_it_is_taken(tmp_path):
    """PyYAML reads 3e-3 (no dot) as text: a float field still takes it (control of the float check)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY + "train: {lr: 3e-3}\n")
    res = CliRunner().invoke(app, ["plan", str(spec), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["train"]["lr"] == 0.003, res.output


def test_plan_json_fields(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nscales: [cpu-xs]\nvariants: [standard, coupled]\nbudget: {tokens: 40960}\nextend: [2]\n")
    rows = json.loads(CliRunner().invoke(app, ["plan", str(spec), "--json"]).output)
    assert [r["variant"] for r in rows] == ["standard", "standard", "coupled"]
    assert set(rows[0]) >= {
        "run_id",
        "variant",
        "scale",
        "seed",
        "extend",
        "n_params",
        "n_params_total",
        "flops_per_token",
        "tokens",
        "total_flops",
    }
    assert rows[1]["tokens"] == 2 * rows[0]["tokens"]
    assert rows[0]["train"]["seq_len"] == 128 and rows[0]["train"]["lr"] > 0  # the recipe each run trains with


def test_plan_shows_each_scales_recipe(tmp_path):
    """One row per scale and recipe: the variants sharing it, the batch in sequences and tokens,
    micro-batch, peak LR ("tuned" when the study tunes it), schedule and the warmup range."""
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: s\nscales: [cpu-xs, cpu-s]\nvariants: [standard, coupled]\nbudget: {tokens: 40960}\nextend: [2]\n"
        "train: {global_batch: 8, seq_len: 64, schedule: wsd}\n"
    )
    res = CliRunner().invoke(app, ["plan", str(spec)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if line.startswith("│ cpu-")][-2:]
    cells = [[c.strip() for c in row.strip("│").split("│")] for row in rows]
    assert [c[:8] for c in cells] == [
        ["cpu-xs", "standard, coupled", "64", "8", "512", "8", "0.003", "wsd"],
        ["cpu-s", "standard, coupled", "64", "8", "512", "8", "0.002", "wsd"],
    ]
    assert cells[0][8].endswith("steps") and "-" in cells[0][8]  # the extend warms up longer
    spec.write_text(spec.read_text() + "tune: {lr: [1e-3, 3e-3], tokens: 0.5}\n")
    tuned = CliRunner().invoke(app, ["plan", str(spec)], env={"COLUMNS": "250"}).output
    assert [line.split("│")[7].strip() for line in tuned.splitlines() if line.startswith("│ cpu-xs │ standard, coupled")] == ["tuned"]


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
    spec.write_text(
        "name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {mode: tokens, tokens: 40960, "
        "throughput: {standard: 4096}}\nresources: {workers: 2}\n"
    )
    res = CliRunner().invoke(app, ["plan", str(spec)])
    assert res.exit_code == 0, res.output
    assert "0.0056 device-hours (throughput from the spec)" in res.output  # 20/3600, not rounded to 0.0
    assert res.output.count("0.0056") == 2  # and in the run's own column


CLUSTER_SPEC = (
    "name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n"
    "tracking_uri: http://mlflow:5000\nstorage_path: /shared/qkstudy/s\n"
)


def test_submit_bad_address_exits_2_without_the_password(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(CLUSTER_SPEC)
    for address, message in (
        ("ftp://alice:s3cret@head:8265", "scheme 'ftp' is not supported"),
        ("http://alice:s3cret@head:99999", "is not a valid URL"),
        ("http://203.0.113.7:8265", "refusing to submit"),
    ):
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


STUDY = "name: s\nscales: [cpu-xs]\nvariants: [standard, coupled]\nbudget: {tokens: 40960}\n"
BAD_INPUT = {  # the spec's text after STUDY's first four lines are replaced or extended, and what validate prints
    "non-positive tuning LR": (STUDY + "tune: {lr: [0.001, 0], tokens: 0.25}\n", "tune.lr: entry 1 (0.0) is not a positive learning rate"),
    "branches with cosine": (
        STUDY + "protocol: branches\nextend: [1.5, 2, 3]\n",
        "train.schedule: protocol: branches needs the wsd schedule",
    ),
    "branches without extend": (
        STUDY + "protocol: branches\ntrain: {schedule: wsd}\n",
        "extend: protocol: branches needs extend multipliers",
    ),
    "unreachable ladder target": (
        STUDY.replace("[cpu-xs]", "[cpu-xs, {ladder: {targets: [2.2M, 300], head_dim: 32, aspect_ratio: 40}}]"),
        "scales[1].ladder.targets[1]: no shape with head_dim 32 has N within 5% of 300",
    ),
    "non-dividing shape": (
        STUDY.replace("[cpu-xs]", "[cpu-xs, {name: w100, n_layer: 2, d_model: 100, n_head: 3}]"),
        "scales[1].n_head: d_model=100 is not divisible by n_head=3",
    ),
    "odd heads for differential": (
        STUDY.replace("[cpu-xs]", "[{name: w96, n_layer: 2, d_model: 96, n_head: 3}]").replace("coupled]", "differential]"),
        "scales[0].n_head: variant 'differential' pairs heads",
    ),
    "a boolean seed": (STUDY + "seeds: [0, true]\n", "seeds: entry 1 (True) is not an integer seed"),
    "a string seed": (STUDY + 'seeds: ["3"]\n', "seeds: entry 0 ('3') is not an integer seed"),
    "a float seed": (STUDY + "seeds: [2.0]\n", "seeds: entry 0 (2.0) is not an integer seed"),
    "a seed past torch's": (STUDY + "seeds: [9223372036854775808]\n", "seeds: entry 0 (9223372036854775808) is past the largest seed"),
    "a boolean ZeRO stage": (STUDY + "resources: {zero_stage: true}\n", "resources.zero_stage: must be a number (got True)"),
    "a GPU count as text": (STUDY + 'resources: {gpus_per_worker: "1"}\n', "resources.gpus_per_worker: must be a number (got '1')"),
    "half a GPU per worker": (STUDY + "resources: {gpus_per_worker: 0.5}\n", "resources.gpus_per_worker: must be 0 (CPU) or 1 (got 0.5)"),
    "two GPUs per worker": (STUDY + "resources: {gpus_per_worker: 2}\n", "resources.gpus_per_worker: must be 0 (CPU) or 1 (got 2.0)"),
    # every integer field of a spec refuses a flag, text or a float by value (NumbersStrict)
    "workers as a flag": (STUDY + "resources: {workers: true}\n", "resources.workers: must be an integer, not True"),
    "retries as a fraction": (STUDY + "resources: {max_retries: 1.0}\n", "resources.max_retries: must be an integer, not 1.0"),
    "a batch as text": (STUDY + 'train: {global_batch: "8"}\n', "train.global_batch: must be an integer, not '8'"),
    "evals as a flag": (STUDY + "eval: {num_evals: true}\n", "eval.num_evals: must be an integer, not True"),
    "a vocabulary as a float": (STUDY + "tokenizer: {vocab_size: 512.0}\n", "tokenizer.vocab_size: must be an integer, not 512.0"),
    "a per-scale budget as a float": (
        STUDY.replace("budget: {tokens: 40960}", "budget: {tokens: {cpu-xs: 40960.0}}"),
        "budget.tokens: must be an integer, not 40960.0",
    ),
    "an inline shape's width as text": (
        STUDY.replace("[cpu-xs]", "[{name: w64, n_layer: 2, d_model: '64', n_head: 2}]"),
        "scales[0].d_model: must be an integer, not '64'",
    ),
    # a float field refuses a flag and a non-finite value, and takes YAML 1.1's 3e-3 (text)
    "an LR as a flag": (STUDY + "train: {lr: true}\n", "train.lr: must be a number, not True"),
    "an infinite LR": (STUDY + "train: {lr: .inf}\n", "train.lr: must be a finite number, not inf"),
    "a NaN weight decay": (STUDY + "train: {weight_decay: .nan}\n", "train.weight_decay: must be a finite number, not nan"),
    "a variant's infinite LR": (
        STUDY.replace("[standard, coupled]", "[standard, {name: c, kind: coupled, lr: .inf}]"),
        "variants[1].lr: must be a finite number, not inf",
    ),
    "a budget for a scale the study lacks": (
        STUDY.replace("budget: {tokens: 40960}", "budget: {tokens: {cpu-xs: 40960, cpu-sss: 99}}"),
        "budget.tokens names scales the study does not have: ['cpu-sss']",
    ),
    "a throughput for a variant the study lacks": (
        STUDY.replace("budget: {tokens: 40960}", "budget: {tokens: 40960, throughput: {standard: 1000, coupled: 900, bogus: 5}}"),
        "budget.throughput names variants the study does not have: ['bogus']",
    ),
    "a budget past float range": (
        STUDY.replace("budget: {tokens: 40960}", "budget: {tokens: 1000000000000000000000000000000}"),
        "budget.tokens: budget tokens must be at most 1e+15, got 1000000000000000000000000000000",
    ),
    "tokens per parameter past float range": (
        STUDY.replace("budget: {tokens: 40960}", "budget: {tokens_per_param: 1.0e+300}"),
        "budget.tokens_per_param: Input should be less than or equal to 1000000",
    ),
    "a model no device holds": (
        STUDY.replace("[cpu-xs]", "[{name: huge, n_layer: 2000, d_model: 65536, n_head: 512}]") + "train: {global_batch: 8, seq_len: 64}\n",
        "resources.device_memory_gb: run standard-huge-s0-x1 (",
    ),
    "a storage URI without a bucket": (
        STUDY + "storage_path: 's3://'\n",
        "storage_path: 's3://' names no bucket or folder: write s3://BUCKET/PREFIX",
    ),
    "bf16 accumulation on GPU": (
        STUDY + "resources: {gpus_per_worker: 1, zero_stage: 2}\n",
        "resources.zero_stage: must be 1 with GPUs (got 2): only ZeRO stage 1 accumulates bf16 gradients in fp32",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_validate_bad_input_names_file_and_field_and_exits_2(case, tmp_path):
    text, expected = BAD_INPUT[case]
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2, res.output
    assert f"error: {spec}: {expected}" in res.output.replace("\n", ""), res.output


def test_schema_has_custom_scales_tuning_and_protocol():
    schema = json.loads(CliRunner().invoke(app, ["schema"]).output)
    assert {"protocol", "tune"} <= set(schema["properties"])
    assert {"ScaleShape", "LadderScale", "LadderSpec", "TuneSpec"} <= set(schema["$defs"])


def test_plan_prints_the_power_of_its_seeds_with_a_known_answer(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY + "seeds: [0, 1, 2]\n")
    res = CliRunner().invoke(app, ["plan", str(spec), "--seed-sd", "0.05", "--gap", "0.1"])
    assert res.exit_code == 0, res.output
    # sd of the paired differences 0.05 sqrt 2 = 0.0707 nats; MDE(n = 3) = 3.2640 sd (noncentral t, as in
    # test_power) = 0.231 nats. A gap of 0.1 nats is 1.414 sd: MDE(6) = 1.4345 sd > 1.414 > MDE(7) = 1.2726 sd,
    # so 7 seeds (simulated: power 0.79 with 6 seeds, 0.87 with 7).
    text = " ".join(res.output.split())
    assert (
        "with 3 seeds and seed std 0.05 nats, the smallest gap detectable at 80% power is 0.231 nats "
        "(seed-paired t-test, 5% two-sided; sd of the paired differences 0.0707 nats = seed std x sqrt 2); "
        "a gap of 0.1 nats needs 7 seeds"
    ) in text


def test_plan_power_with_one_seed_and_in_json_mode(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY)
    res = CliRunner().invoke(app, ["plan", str(spec), "--seed-sd", "0.05"])
    assert res.exit_code == 0 and "with 1 seed and seed std 0.05 nats, no gap is detectable" in " ".join(res.output.split())
    spec.write_text(STUDY + "seeds: [0, 1, 2]\n")
    res = CliRunner().invoke(app, ["plan", str(spec), "--json", "--seed-sd", "0.05"])
    assert res.exit_code == 0 and len(json.loads(res.stdout)) == 6  # stdout is the runs alone
    assert "detectable at 80% power is 0.231 nats" in " ".join(res.stderr.split())
    assert CliRunner().invoke(app, ["plan", str(spec), "--seed-sd", "-1"]).exit_code == 2


def test_version_prints_the_installed_version_and_exits_0():
    from importlib.metadata import version

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"qkstudy {version('qkstudy')}"
    assert CliRunner().invoke(app, ["validate", "--version"]).exit_code == 2  # a global option, not a command's


def test_the_systems_errors_end_in_one_line_and_an_exit_code_not_a_traceback(tmp_path):
    """Errors no product module raises on purpose (issue 51): each class once, with its exit code."""
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY)
    cases = {
        "a folder that cannot be made": (
            ["plan", str(spec), "--write-runs", "/proc/nope/runs.json"],
            2,
            "error: /proc/nope: No such file or directory",
        ),
        "a store that is not a database": (
            ["status", str(spec), "--tracking-uri", f"sqlite:///{tmp_path / 'bad.db'}"],
            2,
            f"error: {tmp_path / 'bad.db'}: not an MLflow store (no experiments table)",
        ),
        "an empty file as the store, left empty": (
            ["status", str(spec), "--tracking-uri", f"sqlite:///{tmp_path / 'empty.db'}"],
            2,
            f"error: {tmp_path / 'empty.db'}: not an MLflow store (no experiments table)",
        ),
    }
    (tmp_path / "bad.db").write_text("not sqlite\n")
    (tmp_path / "empty.db").write_text("")
    big = tmp_path / "big.yaml"
    big.write_text(STUDY.replace("budget: {tokens: 40960}", "budget: {tokens_per_param: 1e300}"))
    # refused by its field now (budget bounds), where it once overflowed in the planner
    cases["a number out of range"] = (["plan", str(big)], 2, "budget.tokens_per_param: Input should be less than or equal to 1000000")
    for name, (argv, code, line) in cases.items():
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == code and "Traceback" not in res.output, (name, res.output[-2000:])
        assert line in " ".join(res.output.split()), (name, res.output[-2000:])
    assert (tmp_path / "empty.db").stat().st_size == 0  # status read it and wrote nothing (MLflow would create its tables)
    # the control: a bug is not hidden as bad input
    import sqlite3

    from orchestrator.cli_errors import system_error

    assert system_error(sqlite3.DatabaseError("file is not a database")) == (
        "the tracking store cannot be read as an SQLite database (file is not a database)",
        2,
    )

    assert system_error(OverflowError("int too large to convert to float")) == (
        "a number is out of range (int too large to convert to float): check the spec's and the options' sizes",
        2,
    )
    assert system_error(KeyError("x")) is None and system_error(RuntimeError("x")) is None


def test_options_out_of_their_range_are_refused_by_name(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY)
    res = CliRunner().invoke(app, ["plan", str(spec), "--gap", "0.1"])
    assert res.exit_code == 2 and "error: --gap: needs --seed-sd" in res.output, res.output
    for argv, option in (
        (["data", "prepare", "--num-proc", "0"], "--num-proc"),
        (["model", "info", "--preset", "cpu-xs", "--vocab-size", "1"], "--vocab-size"),
        (["data", "prepare", "--vocab-size", "1"], "--vocab-size"),
    ):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2 and option in res.output and "Traceback" not in res.output, (argv, res.output)
    # the control: in range, the same plan prints its power line
    res = CliRunner().invoke(app, ["plan", str(spec), "--seed-sd", "0.05", "--gap", "0.1"])
    assert res.exit_code == 0 and "a gap of 0.1 nats needs" in " ".join(res.output.split()), res.output


def test_an_override_is_echoed_as_written_not_read_as_markup(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY)
    res = CliRunner().invoke(app, ["validate", str(spec), "variants=[standard,coupled]", "seeds=[0,1]"])
    assert res.exit_code == 0, res.output
    assert f"{spec} variants=[standard,coupled] seeds=[0,1]: ok (s: 1 scale x 2 variants x 2 seeds, 4 runs)" in res.output, res.output


def test_numbers_and_files_the_commands_cannot_take_end_in_one_line(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY + "seeds: [0, 1, 2]\n")
    (tmp_path / "r.txt").write_bytes(b"\x00\xff\xfe binary")
    big = tmp_path / "big.yaml"
    big.write_text(STUDY.replace("budget: {tokens: 40960}", "budget: {tokens_per_param: 1e300, max_epochs: 1e308}"))
    for argv, line in (
        (["plan", str(spec), "--seed-sd", "inf"], "error: --seed-sd: inf nats is not a spread or gap the power calculation can take"),
        (["plan", str(spec), "--seed-sd", "1e-320", "--gap", "0.1"], "error: --seed-sd: 9.99989e-321 nats is not a spread"),
        (["plan", str(spec), "--seed-sd", "1e308", "--gap", "1"], "error: --seed-sd 1e+308: the power calculation has no answer for it"),
        (["model", "info", "--preset", "cpu-xs", "--seq-len", "99999999999"], "--seq-len"),
        (["train", str(tmp_path / "r.txt")], "error: a file given is not UTF-8 text"),
        (["plan", str(big), "--write-runs", str(tmp_path / "runs")], "budget.tokens_per_param: Input should be less than or equal to"),
    ):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2 and line in " ".join(res.output.split()) and "Traceback" not in res.output, (argv, res.output[-1500:])
    assert not (tmp_path / "runs").exists()  # a plan that cannot be shown writes no run file


def test_the_clis_bounds_are_the_specs_and_the_tokenizers():
    """cli.py keeps its own copies (importing the spec would cost every command pydantic's import):
    they must not drift from the definitions they copy."""
    from data_pipeline import TokenizerConfig
    from orchestrator import cli
    from orchestrator.plan import spec

    assert cli.MAX_SEED == spec.MAX_SEED == 2**63 - 1
    (le,) = [m.le for m in TokenizerConfig.model_fields["vocab_size"].metadata if getattr(m, "le", None) is not None]
    assert cli.MAX_VOCAB == le


def _commands(group, path=()):
    """Every command path of the CLI (groups included), from its click tree."""
    yield list(path)
    for name, sub in (getattr(group, "commands", None) or {}).items():
        yield from _commands(sub, (*path, name))


def test_every_option_has_help_and_help_prints_no_markup_or_type_tags():
    """Issue 51: help text for every option; plain help (no `<bool>` type tags, no raw rich or
    reST markup, sentences wrapped whole rather than cut where the docstring's lines end)."""
    import typer

    root = typer.main.get_command(app)
    missing = []
    for path in _commands(root):
        command = root
        for name in path:
            command = command.commands[name]
        missing += [(" ".join(path), p.opts) for p in command.params if p.name != "help" and not getattr(p, "help", None)]
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
        assert not [t for t in ("``", "[/", "[bold", "[yellow", "<bool>") if t in out], (path, out)
    assert missing == []
    wrapped = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "80"}).output
    assert "follow its logs until it ends" in " ".join(wrapped.split())  # one sentence, not cut at "until it"


def test_small_device_hours_and_memory_are_shown_not_rounded_to_zero():
    from orchestrator.cli_tables import amount

    assert (amount(1.39e-8), amount(0.031), amount(0), amount(1234.5)) == ("1.4e-08", "0.031", "0.00", "1,234.50")


def test_arch_errors_are_one_line_naming_the_option_and_write_runs_says_where(tmp_path):
    res = CliRunner().invoke(app, ["model", "check", "standard", "--arch", "positions=bogus"])
    assert res.exit_code == 2 and res.output.strip().splitlines() == ["error: --arch positions: Input should be 'learned' or 'rope'"]
    spec = tmp_path / "s.yaml"
    spec.write_text(STUDY)
    res = CliRunner().invoke(app, ["plan", str(spec), "--write-runs", str(tmp_path / "runs")])
    assert res.exit_code == 0 and f"wrote 2 run file(s) to {tmp_path / 'runs'}" in " ".join(res.output.split())
