"""The backbone layouts (`model.config.Architecture`): RoPE, RMSNorm, SwiGLU, QK-norm, a tied
head. Counts exact at every preset and for every variant, FLOPs as FlopCounterMode counts
them, seeds paired across variants, the GPT-2 default unchanged."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from model import GPT, REGISTRY, ModelConfig, build_config, count_model
from model.check import CHECK_VOCAB, check_variant
from model.config import Architecture, swiglu_hidden
from model.counts import count_instantiated
from model.info import measure_flops_per_token
from model.layers import Rotary
from model.presets import PRESETS

ALL_ON = Architecture(positions="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, tied_head=True)
LAYOUTS = {
    "gpt2": Architecture(),
    "rope": Architecture(positions="rope"),
    "rope_before": Architecture(positions="rope", rope_at="before_transform"),
    "rmsnorm": Architecture(norm="rmsnorm"),
    "swiglu": Architecture(mlp="swiglu"),
    "qk_norm": Architecture(qk_norm=True),
    "tied": Architecture(tied_head=True),
    "all": ALL_ON,
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("preset", PRESETS)
def test_analytic_counts_equal_the_built_model_at_every_preset_and_variant(preset, layout):
    for variant in REGISTRY:
        cfg = build_config(preset, variant, architecture=LAYOUTS[layout])
        assert count_model(cfg) == count_instantiated(cfg), (preset, layout, variant)


def test_each_option_changes_the_counts_by_its_formula():
    d, V, T, L, hd = 512, 32_000, 512, 8, 64
    base = count_model(build_config("60m", "standard"))
    counts = {name: count_model(build_config("60m", "standard", architecture=a)) for name, a in LAYOUTS.items()}
    assert counts["rmsnorm"] == base  # d weights either way, elementwise
    assert counts["rope"].n_params == base.n_params and counts["rope"].n_params_total == base.n_params_total - T * d
    assert counts["rope"].flops_per_token == base.flops_per_token
    assert counts["tied"].n_params == base.n_params and counts["tied"].n_params_total == base.n_params_total - V * d
    assert counts["qk_norm"].n_params == base.n_params + L * 2 * hd and counts["qk_norm"].flops_per_token == base.flops_per_token
    h = 1368  # 8 round(512 / 3)
    assert counts["swiglu"].n_params - base.n_params == L * (3 * d * h - 8 * d * d) == 32_768
    assert counts["swiglu"].flops_per_token_fwd - base.flops_per_token_fwd == L * (6 * d * h - 16 * d * d)


@pytest.mark.parametrize(("d", "h"), [(128, 344), (192, 512), (256, 680), (512, 1368), (768, 2048), (1024, 2728)])
def test_swiglu_hidden_is_8d_over_3_to_a_multiple_of_8_and_keeps_the_mlp_size(d, h):
    assert swiglu_hidden(d) == h and h % 8 == 0
    assert abs(3 * d * h - 8 * d * d) / (8 * d * d) <= 1 / d


@pytest.mark.parametrize("layout", LAYOUTS)
def test_flop_counter_measures_the_analytic_training_flops(layout):
    cfg = build_config("cpu-xs", "standard", vocab_size=CHECK_VOCAB, architecture=LAYOUTS[layout])
    assert measure_flops_per_token(cfg) == count_model(cfg).executed_flops_per_token


@pytest.mark.parametrize("variant", list(REGISTRY))
def test_every_variant_passes_model_check_on_the_modern_recipe(variant):
    for layout in (ALL_ON, ALL_ON.model_copy(update={"rope_at": "before_transform"})):
        results = check_variant(variant, architecture=layout)
        assert [r for r in results if r.ok is not True] == [], (variant, layout)


def test_rope_scores_depend_on_relative_position_only():
    cfg = build_config("cpu-xs", "standard", architecture=Architecture(positions="rope"), seq_len=16)
    rope = Rotary(cfg)
    g = torch.Generator().manual_seed(0)
    q1, k1 = torch.randn(1, 1, 1, cfg.head_dim, generator=g), torch.randn(1, 1, 1, cfg.head_dim, generator=g)
    q = q1.expand(1, 16, 1, cfg.head_dim).contiguous()
    k = k1.expand(1, 16, 1, cfg.head_dim).contiguous()
    rq, rk = rope(q, k)
    scores = (rq[0, :, 0] @ rk[0, :, 0].T).numpy()  # [m, n] = q at m . k at n
    for offset in (0, 1, 5):
        diag = scores.diagonal(-offset)  # m - n = offset
        assert diag == pytest.approx([diag[0]] * len(diag), abs=1e-5)
    assert torch.allclose(rq[0, 0], q[0, 0]) and torch.allclose(rk[0, 0], k[0, 0])  # position 0: no turn
    assert not torch.allclose(rq[0, 3], q[0, 3])  # a turn elsewhere (the test can fail)


def test_rope_before_or_after_the_transform_matters_only_for_a_transform_that_is_not_identity():
    idx = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(0))

    def logits(variant: str, rope_at: str, **options) -> torch.Tensor:
        layout = Architecture(positions="rope", rope_at=rope_at)
        with torch.no_grad():
            return GPT(build_config("cpu-xs", variant, vocab_size=97, seq_len=32, architecture=layout, **options), seed=0)(idx)[0]

    assert torch.equal(logits("standard", "after_transform"), logits("standard", "before_transform"))
    # coupled's f mixes channels: rotating before or after it differs (dt_init 0.5 makes it visible)
    assert not torch.allclose(logits("coupled", "after_transform", dt_init=0.5), logits("coupled", "before_transform", dt_init=0.5))


def test_the_same_seed_gives_every_variant_standards_backbone_on_the_modern_recipe():
    std = dict(GPT(build_config("cpu-xs", "standard", vocab_size=97, architecture=ALL_ON), seed=3).named_parameters())
    for variant in REGISTRY:
        var = dict(GPT(build_config("cpu-xs", variant, vocab_size=97, architecture=ALL_ON), seed=3).named_parameters())
        assert all(torch.equal(var[n], p) for n, p in std.items()), variant
    assert "pos_emb.weight" not in std and "blocks.0.attn.q_norm.weight" in std


def test_a_tied_head_is_the_token_embedding():
    model = GPT(build_config("cpu-xs", "standard", vocab_size=97, architecture=Architecture(tied_head=True)), seed=0)
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.num_params(False) - model.num_params(True) == 97 * 128 + 128 * 128  # embedding + positions, head once


def test_the_gpt2_default_dumps_as_before_and_round_trips():
    cfg = build_config("60m", "coupled")
    assert set(cfg.model_dump()) == {"vocab_size", "seq_len", "n_layer", "d_model", "n_head", "variant", *cfg.options}
    modern = build_config("60m", "coupled", architecture=ALL_ON)
    assert modern.model_dump()["positions"] == "rope" and "rope_at" not in modern.model_dump()  # at its default
    assert ModelConfig(**modern.model_dump()) == modern and modern.architecture() == ALL_ON


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"rope_at": "before_transform"}, "rope_at apply to positions"),
        ({"rope_base": 500.0}, "rope_base apply to positions"),
        ({"mlp": "geglu"}, "'gelu' or 'swiglu'"),
        ({"norms": "rmsnorm"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_layout_fields_are_refused(fields, says):
    with pytest.raises(ValidationError, match=says):
        Architecture(**fields)


def test_rope_needs_an_even_head_dim():
    with pytest.raises(ValidationError, match="head_dim=3 must be even"):
        ModelConfig(vocab_size=8, seq_len=8, n_layer=1, d_model=12, n_head=4, positions="rope")
