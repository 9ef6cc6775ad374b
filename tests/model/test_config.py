import pytest

from model import GPT, PRESETS, REGISTRY, VARIANTS, ModelConfig, build_config, count_model
from model.registry import ARCHITECTURE_FIELDS, CONFIG_FIELDS


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(scale="huge", variant="standard"), "unknown scale 'huge'; allowed: cpu-xs"),
        (dict(scale="60m", variant="fancy"), "unknown variant 'fancy'; allowed: standard, coupled"),
        (dict(scale="60m", variant="standard", n_steps=2), "n_steps not valid for variant 'standard'"),
        (dict(scale="60m", variant="uncoupled_mlp", integrator="euler"), "allowed: n_steps"),
        (dict(scale="60m", variant="coupled", n_steps=8), "n_steps"),
        (dict(scale="60m", variant="coupled", n_steps=0), "n_steps"),
        (dict(scale="60m", variant="coupled", integrator="rk4"), "'euler' or 'leapfrog'"),
        (dict(scale="60m", variant="coupled", coupling_sharing="model"), "'layer' or 'head'"),
    ],
)
def test_bad_input_names_the_field_and_allowed_values(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        build_config(kwargs.pop("scale"), kwargs.pop("variant"), vocab_size=100, **kwargs)


def test_differential_needs_even_heads():
    with pytest.raises(ValueError, match="n_head=3 must be even"):
        ModelConfig(vocab_size=10, seq_len=8, n_layer=1, d_model=48, n_head=3, variant="differential")


def test_every_variant_has_an_option_list_and_presets_default_to_32k_vocab():
    assert list(VARIANTS) == ["standard", "coupled", "uncoupled_mlp", "differential", "coupled_differential", "nonlinear_q"]
    assert set(REGISTRY) == set(VARIANTS) and all(REGISTRY[v].options is not None for v in VARIANTS)
    assert CONFIG_FIELDS == set(ModelConfig.model_fields)  # option names may not reuse these
    assert build_config("cpu-s", "standard").vocab_size == 32_000
    assert build_config("cpu-s", "standard", seq_len=64).seq_len == 64
    assert build_config("cpu-s", "standard").seq_len == PRESETS["cpu-s"].seq_len


@pytest.mark.parametrize("scale, nominal", [("60m", 60e6), ("150m", 150e6), ("350m", 350e6)])
def test_paper_scales_total_params_within_10_percent(scale, nominal):
    for variant in VARIANTS:
        total = count_model(build_config(scale, variant)).n_params_total
        assert abs(total / nominal - 1) < 0.10, (scale, variant, total)


@pytest.mark.parametrize("scale, nominal", [("cpu-xs", 0.5e6), ("cpu-s", 2e6), ("cpu-m", 6e6)])
def test_cpu_scales_non_embedding_params_roughly_nominal(scale, nominal):
    n = count_model(build_config(scale, "standard", vocab_size=4096)).n_params
    assert 0.75 < n / nominal < 1.25, n


def test_coupled_parameter_overhead_at_60m_matches_paper_order():
    std = count_model(build_config("60m", "standard"))
    cpl = count_model(build_config("60m", "coupled"))
    overhead = cpl.n_params_total / std.n_params_total - 1
    assert 0.0005 < overhead < 0.003  # paper: +0.11%
    # one shared f per layer (2*hd*hd + 2*hd) plus one dt per head, 8 layers, hd=64, 8 heads
    assert cpl.n_params - std.n_params == 8 * (2 * 64 * 64 + 2 * 64 + 8)


def test_count_model_matches_a_real_model():
    cfg = build_config("cpu-xs", "coupled_differential", vocab_size=300, coupling_sharing="head")
    counts = count_model(cfg)
    model = GPT(cfg)
    assert counts.n_params_total == sum(p.numel() for p in model.parameters())
    emb = model.tok_emb.weight.numel() + model.pos_emb.weight.numel() + model.lm_head.weight.numel()
    assert counts.n_params == counts.n_params_total - emb
    assert counts.flops_per_token == 3 * counts.flops_per_token_fwd == 3 * model.num_flops_per_token()


def test_standard_flops_match_closed_form():
    cfg = build_config("60m", "standard")
    L, d, T, V = cfg.n_layer, cfg.d_model, cfg.seq_len, cfg.vocab_size
    # per layer: QKV 6d^2, out 2d^2, MLP 16d^2 (matmul FLOPs), scores + AV 4*T*d; LM head 2dV
    assert count_model(cfg).flops_per_token_fwd == L * (24 * d * d + 4 * T * d) + 2 * d * V
    assert GPT(build_config("cpu-xs", "standard")).num_flops_per_token(seq_len=16) == (3 * (24 * 128**2 + 4 * 16 * 128) + 2 * 128 * 32_000)


def test_coupled_flops_count_f_per_head_per_evaluation():
    base = count_model(build_config("cpu-s", "standard", vocab_size=100)).flops_per_token_fwd
    L, H, hd = 5, 6, 32
    for integrator, n_steps, evals in [("euler", 3, 3), ("leapfrog", 3, 4)]:
        cfg = build_config("cpu-s", "coupled", vocab_size=100, integrator=integrator, n_steps=n_steps, coupling_hidden=48)
        extra = count_model(cfg).flops_per_token_fwd - base
        assert extra == L * evals * H * 2 * (2 * hd * 48)


@pytest.mark.parametrize("variant", VARIANTS)
def test_config_dump_is_flat_and_round_trips(variant):
    """RunSpecs carry cfg.model_dump() and workers rebuild ModelConfig(**it): options travel
    flat (MLflow params model.n_steps, ...), only the variant's own, defaults filled in."""
    import json

    cfg = build_config("cpu-s", variant, vocab_size=100)
    dump = json.loads(json.dumps(cfg.model_dump()))
    assert "options" not in dump
    # the backbone layout's fields are left out at their (GPT-2) defaults: the dump, and run ids, as before them
    assert set(dump) == set(CONFIG_FIELDS - {"options", *ARCHITECTURE_FIELDS}) | set(REGISTRY[variant].options.model_fields)
    assert ModelConfig(**dump) == cfg and ModelConfig(**dump).options == cfg.options
    assert hash(ModelConfig(**dump)) == hash(cfg)  # frozen configs stay usable as keys
    if variant == "coupled":
        assert dump["integrator"] == "euler" and dump["n_steps"] == 1 and dump["coupling_hidden"] is None
