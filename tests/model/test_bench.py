import pytest

from model.bench import append_markdown, main, parse_variant, run_bench


def test_parse_variant():
    assert parse_variant("standard") == ("standard", {})
    assert parse_variant("coupled:integrator=leapfrog,n_steps=2,dt_init=0.5,coupling_hidden=None") == (
        "coupled", {"integrator": "leapfrog", "n_steps": 2, "dt_init": 0.5, "coupling_hidden": None})
    with pytest.raises(ValueError, match="not key=value"):
        parse_variant("coupled:leapfrog")


def test_run_bench_reports_ratios_against_standard():
    results = run_bench("cpu-xs", ["coupled:n_steps=2", "differential"], repeats=2, steps=1,
                        batch_size=2, vocab_size=128, seq_len=32, device="cpu", peak_tflops=1.0)
    assert [r.spec for r in results] == ["standard", "coupled:n_steps=2", "differential"]
    assert results[0].ratio == results[0].cpu_ratio == results[0].flop_ratio == 1.0
    assert results[1].flop_ratio > 1.0 and results[1].ratio > 0
    for r in results:
        assert r.tokens_per_s == pytest.approx(2 * 32 / r.step_s)
        assert r.mfu == pytest.approx(r.flops_per_token * r.tokens_per_s / 1e12)


def test_main_appends_a_dated_table(tmp_path, capsys):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nearlier section\n")
    args = ["--preset", "cpu-xs", "--variants", "standard", "uncoupled_mlp", "--repeats", "1",
            "--steps", "1", "--batch-size", "1", "--seq-len", "16", "--vocab-size", "64", "--out", str(out)]
    assert main(args) == 0
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nearlier section\n\n## model.bench: preset cpu-xs, ")
    assert "| uncoupled_mlp |" in text and "Command: `python -m model.bench --preset cpu-xs" in text
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
