"""What the data and the devices can support, before launch: epochs per run (``plan.epochs``),
per-device memory (``plan.memory``), device-hours from a declared MFU (``plan.throughput``),
and the refusals of ``validate`` (exit 2, the field named)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from typer.testing import CliRunner

from data_pipeline import CorpusConfig
from model import build_config
from model.counts import count_model
from model.gpt import GPT
from orchestrator.cli import app
from orchestrator.plan import memory
from orchestrator.plan.epochs import BYTES_PER_TOKEN, CorpusSize, corpus_size, epochs
from orchestrator.plan.inputs import plan_here
from orchestrator.plan.spec import SpecError, load_spec, parse_spec
from orchestrator.plan.throughput import device_hours_at_mfu
from tests.helpers import TPS, tiny_spec


def _text_corpus(tmp_path, n_bytes: int) -> CorpusConfig:
    d = tmp_path / "docs"
    d.mkdir(parents=True)
    for i in range(4):
        (d / f"doc{i}.txt").write_text(("x" * 69 + "\n") * (n_bytes // 4 // 70))  # lines the tokenizer can train on
    return CorpusConfig(source="text", paths=[str(d)], val_fraction=0.1)


def test_estimate_is_train_bytes_over_bytes_per_token(tmp_path):
    size = corpus_size(_text_corpus(tmp_path, 28_000), data_hash=None, cache_root=str(tmp_path / "cache"))
    assert size.source == "estimate"
    assert size.train_tokens == pytest.approx(28_000 * 0.9 / BYTES_PER_TOKEN)


def test_max_bytes_caps_the_estimate(tmp_path):
    c = _text_corpus(tmp_path, 28_000).model_copy(update={"max_bytes": 7_000})
    assert corpus_size(c, None, str(tmp_path)).train_tokens == pytest.approx(7_000 * 0.9 / BYTES_PER_TOKEN)


def test_max_documents_caps_the_estimate_at_the_kept_documents_bytes(tmp_path):
    """Two of four 7,000-byte documents: 14,000 bytes, not the files' 28,000 (the estimate
    read the files' sizes whatever the cap, so a capped corpus looked twice as big)."""
    c = _text_corpus(tmp_path, 28_000).model_copy(update={"max_documents": 2})
    assert corpus_size(c, None, str(tmp_path)).train_tokens == pytest.approx(14_000 * 0.9 / BYTES_PER_TOKEN)
    # a cap above the document count keeps them all: the uncapped figure (the control)
    c = c.model_copy(update={"max_documents": 10})
    assert corpus_size(c, None, str(tmp_path)).train_tokens == pytest.approx(28_000 * 0.9 / BYTES_PER_TOKEN)


def test_a_prepared_corpus_counts_its_manifest_tokens(tmp_path):
    c = _text_corpus(tmp_path, 28_000)
    (tmp_path / "cache" / "abc123").mkdir(parents=True)
    (tmp_path / "cache" / "abc123" / "manifest.json").write_text(json.dumps({"splits": {"train": {"tokens": 12_345}}}))
    assert corpus_size(c, "abc123", str(tmp_path / "cache")) == CorpusSize(12_345.0, "manifest")
    # another hash has no manifest: back to the estimate
    assert corpus_size(c, "other", str(tmp_path / "cache")).source == "estimate"


def test_mqar_counts_its_generated_examples():
    c = CorpusConfig(source="mqar", mqar={"preset": "easy", "num_train_examples": 1_000, "seq_len": 64})
    assert corpus_size(c, None) == CorpusSize(64_000.0, "generated")


def test_unreadable_files_give_an_unknown_size(tmp_path):
    c = CorpusConfig(source="text", paths=[str(tmp_path / "missing")])
    assert corpus_size(c, None, str(tmp_path)) == CorpusSize(None, "unknown")


def test_a_mixture_is_sized_as_its_sampler_draws(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "1.txt").write_text("x" * 10_000)
    (b / "1.txt").write_text("x" * 40_000)
    mix = CorpusConfig(
        source="mixture",
        val_fraction=0.5,
        components=[
            {"weight": 1, "corpus": {"source": "text", "paths": [str(a)], "val_fraction": 0.5}},
            {"weight": 1, "corpus": {"source": "text", "paths": [str(b)], "val_fraction": 0.5}},
        ],
    )
    # equal weights: M = min(5000 / 0.5, 20000 / 0.5) bytes of train text -> 10,000 bytes
    assert corpus_size(mix, None, str(tmp_path)).train_tokens == pytest.approx(10_000 / BYTES_PER_TOKEN)


def _write(tmp_path, name: str, **over) -> str:
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(tiny_spec(name, **over)))
    return str(f)


def _text_spec(tmp_path, name: str, tokens: int, **over) -> str:
    c = _text_corpus(tmp_path / name, 28_000)  # ~9,000 unique train tokens
    return _write(tmp_path, name, corpus=c.model_dump(mode="json"), budget={"mode": "tokens", "tokens": tokens, **over})


def test_validate_refuses_a_run_over_max_epochs_naming_run_field_and_epochs(tmp_path):
    spec = _text_spec(tmp_path, "many-epochs", 100 * TPS)  # 51,200 tokens over ~9,000: ~5.7 epochs
    res = CliRunner().invoke(app, ["validate", spec])
    assert res.exit_code == 2, res.output
    assert "budget.max_epochs" in res.output and "standard-cpu-xs-s0-x1" in res.output
    assert f"~{100 * TPS / (28_000 * 0.9 / BYTES_PER_TOKEN):.3g} epochs" in res.output
    assert spec in res.output
    # negative control: the same plan with the limit raised validates
    ok = _text_spec(tmp_path, "many-epochs-allowed", 100 * TPS, max_epochs=6)
    res = CliRunner().invoke(app, ["validate", ok])
    assert res.exit_code == 0, res.output


def test_plan_prints_epochs_and_warns_without_refusing(tmp_path):
    spec = _text_spec(tmp_path, "plan-epochs", 100 * TPS)
    res = CliRunner().invoke(app, ["plan", spec, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows[0]["epochs"] == pytest.approx(100 * TPS / (28_000 * 0.9 / BYTES_PER_TOKEN))
    assert rows[0]["epochs_source"] == "estimate"
    assert "warning: budget.max_epochs" in res.stderr


def test_epochs_of_a_run_over_an_unknown_corpus_are_none(tmp_path):
    study = load_spec(_text_spec(tmp_path, "unknown-size", 10 * TPS))
    (run,) = plan_here(study, warn=lambda _: None)
    assert epochs(run, {run.corpus_name: CorpusSize(None, "unknown")}) is None
    assert epochs(run, {run.corpus_name: CorpusSize(2_560.0, "manifest")}) == 2.0


def _adam_state_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """Measured (weights, gradients, optimizer) bytes of ``model`` after one AdamW step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 512, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    opt.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    states = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    return weights, grads, states


@pytest.mark.parametrize("variant", ["standard", "coupled"])
def test_model_state_bytes_match_measured_fp32_adamw(variant):
    cfg = build_config("cpu-xs", variant, vocab_size=512, seq_len=64)
    n_total = count_model(cfg).n_params_total
    measured = _adam_state_bytes(GPT(cfg))
    assert memory.model_states(n_total, zero_stage=0, world_size=1, bf16=False) == measured
    # negative control: a model twice as wide holds more than this estimate allows
    wide = _adam_state_bytes(GPT(cfg.model_copy(update={"d_model": 2 * cfg.d_model})))
    assert sum(wide) > 1.5 * sum(memory.model_states(n_total, 0, 1, False))


def test_zero_stages_partition_states_as_the_zero_paper_gives():
    psi, n = 1_000_000, 8
    assert memory.model_states(psi, 0, n, True) == (2 * psi, 2 * psi, 12 * psi)  # 16 psi
    assert memory.model_states(psi, 1, n, True) == (2 * psi, 6 * psi, 12 * psi / n)  # + the fp32 accumulator
    assert memory.model_states(psi, 2, n, True) == (2 * psi, 2 * psi / n, 12 * psi / n)
    assert memory.model_states(psi, 3, n, True) == (2 * psi / n, 2 * psi / n, 12 * psi / n)
    # the paper's example: 7.5 B parameters on 64 GPUs, stage 1: 31.4 GB; stage 2: 16.6; stage 3: 1.9;
    # stage 1 here adds DeepSpeed's fp32 gradient accumulator, 4 psi = 30 GB
    for stage, gb in ((1, 31.4 + 30), (2, 16.6), (3, 1.88)):
        assert sum(memory.model_states(7_500_000_000, stage, 64, True)) / 1e9 == pytest.approx(gb, rel=0.01)
    with pytest.raises(ValueError, match="ZeRO stage"):
        memory.model_states(psi, 4, n, True)


def test_validate_refuses_a_run_over_device_memory(tmp_path):
    spec = _write(tmp_path, "too-big", resources={"device_memory_gb": 0.001})
    res = CliRunner().invoke(app, ["validate", spec])
    assert res.exit_code == 2, res.output
    assert "resources.device_memory_gb" in res.output and "GiB per device" in res.output
    ok = _write(tmp_path, "fits", resources={"device_memory_gb": 1})  # negative control
    assert CliRunner().invoke(app, ["validate", ok]).exit_code == 0


def test_device_hours_from_a_declared_mfu(tmp_path):
    spec = _write(tmp_path, "mfu", budget={"mode": "tokens", "tokens": 20 * TPS, "throughput": {"mfu": 0.5, "peak_tflops": 100}})
    study = load_spec(spec)
    (run,) = plan_here(study, warn=lambda _: None)
    assert device_hours_at_mfu(run, study.budget.throughput) == pytest.approx(run.total_flops / (0.5 * 100e12) / 3600)
    res = CliRunner().invoke(app, ["plan", spec])
    assert res.exit_code == 0, res.output
    assert "from a declared MFU of 0.5" in res.output
    by_device = parse_spec(tiny_spec("dev", budget={"mode": "tokens", "tokens": 20 * TPS, "throughput": {"mfu": 0.35, "device": "H100"}}))
    assert math.isclose(by_device.budget.throughput.peak_flops, 989e12)


@pytest.mark.parametrize(
    "throughput,mode,message",
    [
        ({"mfu": 0.35}, "tokens", "exactly one of peak_tflops or device"),
        ({"mfu": 0.35, "peak_tflops": 989, "device": "H100"}, "tokens", "exactly one of peak_tflops or device"),
        ({"mfu": 0.35, "device": "TPU9"}, "tokens", "unknown device 'TPU9'"),
        ({"mfu": 1.5, "peak_tflops": 989}, "tokens", "mfu"),
        ({"mfu": 0.35, "peak_tflops": 989}, "wallclock", "equal wall-clock would be equal FLOPs"),
    ],
)
def test_bad_mfu_declarations_are_refused(throughput, mode, message):
    with pytest.raises(SpecError, match=message) as e:
        parse_spec(tiny_spec("bad", budget={"mode": mode, "tokens": 20 * TPS, "throughput": throughput}))
    assert "budget" in str(e.value)


def test_run_of_a_tuned_study_over_max_epochs_exits_2_before_ray_or_mlflow(tmp_path):
    """The tuned protocol plans its main runs only after tuning; their tokens are known before
    it, so ``run`` refuses them as ``validate`` does (the unit tier's guard would fail this test
    had it started Ray)."""
    spec = _text_spec(tmp_path, "tuned-epochs", 100 * TPS)
    doc = yaml.safe_load(open(spec))
    doc["tune"] = {"lr": [1e-3, 3e-3], "tokens": 4 * TPS}
    doc["workdir"] = str(tmp_path / "runs")
    open(spec, "w").write(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["run", spec])
    assert res.exit_code == 2, res.output
    assert "budget.max_epochs" in res.output and "standard-cpu-xs-s0-x1" in res.output and spec in res.output
    assert not (tmp_path / "runs").exists()  # no lease, no store


def test_the_default_zero_stage_is_1_with_gpus_and_2_on_cpu():
    from orchestrator.plan.contract import ResourcesSpec

    assert ResourcesSpec().zero_stage == 2 and ResourcesSpec.model_validate({}).zero_stage == 2
    assert ResourcesSpec.model_validate({"gpus_per_worker": 1}).zero_stage == 1
    assert ResourcesSpec.model_validate({"gpus_per_worker": 1, "zero_stage": 1}).zero_stage == 1
    assert ResourcesSpec.model_validate({"zero_stage": 0}).zero_stage == 0  # CPU: any stage
