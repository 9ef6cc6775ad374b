"""Analytic FLOPs against torch's FlopCounterMode: totals, and the variant-minus-standard
deltas that isolate what each variant adds (with negative controls)."""

import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from model import PRESETS, VARIANTS, build_config, count_model
from model.info import check_flop_delta, measure_flops_per_token, model_info
from model.options import CoupledOptions
from model.registry import REGISTRY
from model.stage_counts import coupled_counts, differential_counts, dynamics_counts

DIFFERENTIAL = ("differential", "coupled_differential")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("preset, seq_len", [("cpu-xs", None), ("60m", 48)])
def test_analytic_flops_agree_with_flop_counter(preset, seq_len, variant):
    info = model_info(preset, variant, seq_len=seq_len)
    assert info["seq_len"] == (seq_len or 128) and info["vocab_size"] == 32_000
    assert info["flops_per_token_measured"] == pytest.approx(info["flops_per_token"], rel=0.02)
    # matmul FLOPs are integers: the executed count is exact
    assert info["flops_per_token_measured"] == pytest.approx(info["executed_flops_per_token"], rel=1e-9)


@pytest.mark.parametrize(
    "variant, options",
    [
        ("coupled", dict(integrator="leapfrog", n_steps=4, coupling_sharing="head", coupling_hidden=48)),
        ("uncoupled_mlp", dict(n_steps=3, coupling_sharing="head")),
        ("coupled_differential", dict(integrator="euler", n_steps=2, coupling_hidden=16)),
        ("nonlinear_q", dict(bottleneck=64)),
    ],
)
def test_analytic_flops_agree_with_flop_counter_for_options(variant, options):
    info = model_info("cpu-xs", variant, seq_len=64, vocab_size=500, **options)
    assert info["flops_per_token_measured"] == pytest.approx(info["executed_flops_per_token"], rel=1e-9)
    L, d, T = 3, 128, 64
    excess = 3 * L * 2 * T * d if variant in DIFFERENTIAL else 0  # fused AV: 4*T*d run, 2*T*d counted
    assert info["executed_flops_per_token"] - info["flops_per_token"] == excess


@pytest.mark.parametrize("preset", ["cpu-xs", "cpu-s", "cpu-m", "60m", "150m", "350m"])
def test_differential_counts_model_flops_like_standard(preset):
    """One convention (DESIGN.md): Differential's AV counts 2*T*d like standard's, so a
    FLOP-matched budget gives differential exactly standard's tokens; the fused kernel's
    extra 2*T*d per layer is only in the separate executed count."""
    std = count_model(build_config(preset, "standard", vocab_size=2048))
    diff = count_model(build_config(preset, "differential", vocab_size=2048))
    L, d, T = PRESETS[preset].n_layer, PRESETS[preset].d_model, PRESETS[preset].seq_len
    assert diff.flops_per_token == std.flops_per_token
    assert diff.executed_flops_per_token - std.executed_flops_per_token == 3 * L * 2 * T * d
    assert std.executed_flops_per_token == std.flops_per_token


def _cfg(variant, **options):
    return build_config("cpu-xs", variant, vocab_size=64, seq_len=32, **options)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "standard"])
def test_flop_delta_of_each_variant_at_default_options(variant):
    check = check_flop_delta(_cfg(variant))
    assert check.ok, check
    assert check.analytic > 0


GRID = [
    ("coupled", dict(n_steps=n, integrator=i, coupling_sharing=s, coupling_hidden=h))
    for n, i, s, h in itertools.product((1, 2, 3), ("euler", "leapfrog"), ("layer", "head"), (None, 48))
]
GRID += [
    ("uncoupled_mlp", dict(n_steps=n, coupling_sharing=s, coupling_hidden=h))
    for n, s, h in itertools.product((1, 2, 3), ("layer", "head"), (None, 48))
]
GRID += [("coupled_differential", dict(n_steps=n, integrator=i)) for n, i in itertools.product((1, 3), ("euler", "leapfrog"))]
GRID += [("nonlinear_q", dict(bottleneck=r)) for r in (None, 1, 7, 64)]


@pytest.mark.parametrize("variant, options", GRID)
def test_flop_delta_over_the_option_grid(variant, options):
    check = check_flop_delta(_cfg(variant, **options))
    assert check.ok, check


def _with_counts(m, variant, counts):
    """Register ``variant`` with other analytic ``counts`` (what the planner's budgets use)."""
    m.setitem(REGISTRY, variant, dataclasses.replace(REGISTRY[variant], counts=counts))


def test_flop_delta_check_catches_wrong_counts(monkeypatch):
    """Negative controls: analytic counts (`model.counts`, the planner's) that are wrong by what
    matters make the check fail, while the old total-at-32k-vocab comparison (2%) would still pass."""
    leapfrog = _cfg("coupled", integrator="leapfrog", n_steps=2)
    assert check_flop_delta(leapfrog).ok
    with monkeypatch.context() as m:  # one evaluation of f too few (leapfrog runs n + 1)
        _with_counts(m, "coupled", lambda c: dynamics_counts(c, CoupledOptions(**c.options), c.options["n_steps"]))
        wrong = check_flop_delta(leapfrog)
        assert not wrong.ok and wrong.measured > wrong.analytic
    with monkeypatch.context() as m:  # the coupling network's FLOPs dropped entirely
        _with_counts(m, "coupled", lambda c: coupled_counts(c)._replace(flops_per_token_fwd=0, executed_flops_per_token_fwd=0))
        assert not check_flop_delta(_cfg("coupled")).ok
        total = model_info("cpu-xs", "coupled")  # 32k vocabulary: the LM head dominates
        assert total["flops_per_token_measured"] == pytest.approx(total["flops_per_token"], rel=0.02)
    with monkeypatch.context() as m:  # differential's executed AV counted as the definition's
        _with_counts(m, "differential", lambda c: differential_counts(c)._replace(executed_flops_per_token_fwd=0))
        assert not check_flop_delta(_cfg("differential")).ok


def test_info_keys_and_bad_preset():
    info = model_info("cpu-xs", "coupled", vocab_size=300, n_steps=2)
    assert set(info) == {
        "preset",
        "variant",
        "seq_len",
        "vocab_size",
        "n_params",
        "n_params_total",
        "flops_per_token",
        "executed_flops_per_token",
        "flops_per_token_measured",
    }
    assert info["n_params"] < info["n_params_total"]
    assert info["executed_flops_per_token"] == info["flops_per_token"]
    with pytest.raises(ValueError, match="unknown preset 'xl'"):
        model_info("xl", "coupled")


def test_cpu_flash_sdpa_is_invisible_to_flop_counter_so_measurement_forces_math():
    """Documents why measure_flops_per_token forces the math backend: if this starts failing,
    torch learned to count the CPU flash kernel and the forced backend can be revisited."""
    q = torch.randn(1, 2, 16, 8)
    counter = FlopCounterMode(display=False)
    with counter:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert counter.get_total_flops() == 0
    cfg = build_config("cpu-xs", "standard", vocab_size=100, seq_len=16)
    assert measure_flops_per_token(cfg) > 0
