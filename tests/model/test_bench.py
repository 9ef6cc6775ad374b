import pytest

from benchmarks.model_steps import main, run_bench
from benchmarks.record import append_markdown
from model.timing import StepOptions


def test_run_bench_reports_ratios_against_standard():
    results = run_bench(
        "cpu-xs",
        ["coupled:n_steps=2", "differential"],
        repeats=2,
        steps=1,
        batch_size=2,
        vocab_size=128,
        seq_len=32,
        device="cpu",
        peak_tflops=1.0,
    )
    assert [r.spec for r in results] == ["standard", "coupled:n_steps=2", "differential"]
    assert results[0].ratio == results[0].cpu_ratio == results[0].flop_ratio == results[0].best_ratio == 1.0
    assert results[0].ratio_iqr == (1.0, 1.0) and results[1].ratio_iqr[0] <= results[1].ratio_iqr[1]
    assert results[1].flop_ratio > 1.0 and results[1].ratio > 0
    assert [r.impl for r in results] == ["-", "fused", "-"]  # auto on CPU: the fused transform
    for r in results:
        assert r.tokens_per_s == pytest.approx(2 * 32 / r.step_s)
        assert r.mfu == pytest.approx(r.flops_per_token * r.tokens_per_s / 1e12)
        assert r.step_mem_gib is None and r.load >= 0  # memory is measured on CUDA only


def test_main_appends_a_dated_table(tmp_path, capsys):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nearlier section\n")
    args = [
        "--preset",
        "cpu-xs",
        "--variants",
        "standard",
        "uncoupled_mlp",
        "--repeats",
        "1",
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--seq-len",
        "16",
        "--vocab-size",
        "64",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nearlier section\n\n## benchmarks.model_steps: preset cpu-xs, ")
    assert "| uncoupled_mlp |" in text and "Command: `python -m benchmarks.model_steps --preset cpu-xs" in text
    assert list(tmp_path.iterdir()) == [out]  # no temp file left behind
    assert main([*args[:-2], "--no-append", "--out", str(out), "--variants", "nope"]) == 2
    assert "unknown variant 'nope'" in capsys.readouterr().err


def test_append_markdown_creates_file(tmp_path):
    path = tmp_path / "B.md"
    append_markdown(path, "## x\n")
    assert path.read_text() == "# Benchmarks\n\n## x\n"
    assert path.stat().st_mode & 0o777 == 0o644
    path.chmod(0o664)
    append_markdown(path, "## y")
    assert path.read_text().endswith("## x\n\n## y\n") and path.stat().st_mode & 0o777 == 0o664


def test_spec_impl_overrides_the_default_and_is_validated():
    results = run_bench(
        "cpu-xs",
        ["coupled:impl=eager", "uncoupled_mlp"],
        repeats=1,
        steps=1,
        batch_size=1,
        vocab_size=64,
        seq_len=16,
        device="cpu",
        peak_tflops=None,
        warmup=1,
        options=StepOptions(impl="fused"),
    )
    assert [(r.spec, r.impl) for r in results] == [("standard", "-"), ("coupled:impl=eager", "eager"), ("uncoupled_mlp", "fused")]
    with pytest.raises(ValueError, match="allowed: auto, eager, fused, compile"):
        run_bench("cpu-xs", ["coupled:impl=cuda"], 1, 1, 1, 64, 16, "cpu", None)


@pytest.mark.slow  # compiles the model (torch.compile): most of a minute on 2 cores
def test_dry_run_runs_the_gpu_path_on_cpu(tmp_path, capsys):
    """--dry-run: bf16 autocast, flash SDPA, compiled coupled transform, MFU column, at tiny
    CPU shapes; prints the table and appends nothing."""
    out = tmp_path / "BENCHMARKS.md"
    assert main(["--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "preset cpu-xs (dry run)" in text and "amp bf16, SDPA flash, QK impl compile" in text
    assert "| MFU |" in text and "| coupled | compile |" in text and "| standard | - |" in text
    assert not out.exists()
