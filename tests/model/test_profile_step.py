"""benchmarks.profile_step: where a variant's extra step time goes. The attribution is checked on
synthetic operator times with a known gap, and on real profiles: the operators only the
coupled variant runs are its QK transform's (its integrator's autograd Function, SiLU), and
standard's attention and matmuls appear on both sides; the uncoupled MLP, whose transform has
no integrator, shows no Euler operator (the negative control)."""

import pytest

from benchmarks.profile_step import OpTime, format_gap, main, median_per_op, profile_gap


def test_format_gap_attributes_a_known_gap():
    ops = [OpTime("aten::silu", 0.0, 3.0), OpTime("aten::mm", 10.0, 11.0), OpTime("aten::add", 2.0, 2.0), OpTime("aten::fill_", 1.0, 0.0)]
    text = format_gap(sorted(ops, key=lambda o: -abs(o.diff_ms)), "coupled", top=2)
    assert "| `aten::silu` | 0.00 | 3.00 | +3.00 | 100% |" in text  # gap 3 ms: silu 3, mm 1, fill -1
    assert "| `aten::mm` | 10.00 | 11.00 | +1.00 | 33% |" in text
    assert "| 2 other operators | 3.00 | 2.00 | -1.00 | -33% |" in text
    assert "| **all (the step)** | 13.00 | 16.00 | +3.00 | 100% |" in text
    assert text.endswith("ratio coupled / standard: 1.231.")


def test_median_per_op_ignores_one_slow_step_and_counts_missing_as_zero():
    steps = [{"aten::mm": 10.0, "aten::silu": 1.0}, {"aten::mm": 11.0}, {"aten::mm": 90.0, "aten::silu": 1.0}]
    assert median_per_op(steps) == {"aten::mm": 11.0, "aten::silu": 1.0}  # the 90 ms step moves nothing
    assert median_per_op([{"a": 1.0}, {}, {}]) == {"a": 0.0}  # in one step of three: 0 most steps


@pytest.mark.slow
def test_only_the_variant_runs_its_transforms_operators():
    ops = profile_gap("cpu-xs", "coupled", steps=2, warmup=1, batch_size=2, vocab_size=128)
    only_variant = {o.name for o in ops if o.reference_ms == 0 and o.variant_ms > 0}
    assert "aten::silu" in only_variant, sorted(only_variant)
    assert any("Backward" in n and "Euler" in n for n in only_variant), sorted(only_variant)
    both = {o.name for o in ops if o.reference_ms > 0 and o.variant_ms > 0}
    assert "aten::mm" in both and any("scaled_dot_product" in n for n in both), sorted(both)
    # standard against uncoupled_mlp: a transform of q alone, no Euler coupling of q and k
    unc = profile_gap("cpu-xs", "uncoupled_mlp", steps=1, warmup=1, batch_size=2, vocab_size=128)
    assert not any("Euler" in o.name and o.variant_ms > 0 for o in unc)


def test_bad_variant_exits_2(capsys):
    assert main(["--preset", "cpu-xs", "--variant", "coupled:integrator", "--no-append"]) == 2
    assert "not key=value" in capsys.readouterr().err
