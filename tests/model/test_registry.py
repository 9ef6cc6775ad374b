"""The variant registry: a variant defined entirely in this file is built, counted and
cross-checked by the unchanged model code; bad names and options list what is allowed."""

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from model import GPT, REGISTRY, VARIANTS, ModelConfig, Variant, build_config, count_model, register
from model.info import check_flop_delta
from model.init import normal_

L, H, HD = 3, 4, 32  # cpu-xs


class LowRankOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rank: int = Field(default=4, ge=1)


class LowRankQK(nn.Module):
    """Toy QK transform: q' = q + (q A) B with A [head_dim, rank], B [rank, head_dim] per layer."""

    def __init__(self, head_dim: int, rank: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.a = nn.Parameter(torch.empty(head_dim, rank))
        self.b = nn.Parameter(torch.empty(rank, head_dim))
        self.reset_parameters()

    def reset_parameters(self, generator=None):
        normal_(self.a, 0.5, generator)
        normal_(self.b, 0.5, generator)

    def forward(self, q, k):
        return q + (q @ self.a) @ self.b, k

    def num_flops_per_token(self, seq_len):
        return self.n_head * 2 * 2 * self.a.numel()


def _toy_qk(cfg):
    return LowRankQK(cfg.head_dim, cfg.options["rank"], cfg.n_head)


@pytest.fixture
def toy():
    entry = register(Variant("toy_lowrank", "low-rank additive query map", LowRankOptions, qk_transform=_toy_qk))
    yield entry
    del REGISTRY["toy_lowrank"]


def test_a_variant_defined_in_a_test_is_built_and_counted(toy):
    assert "toy_lowrank" in VARIANTS
    cfg = build_config("cpu-xs", "toy_lowrank", vocab_size=97, seq_len=32, rank=3)
    assert cfg.options == {"rank": 3} and build_config("cpu-xs", "toy_lowrank").options == {"rank": 4}
    assert cfg.model_dump()["rank"] == 3 and ModelConfig(**cfg.model_dump()) == cfg  # flat round trip
    std = count_model(build_config("cpu-xs", "standard", vocab_size=97, seq_len=32))
    counts = count_model(cfg)
    assert counts.n_params - std.n_params == L * 2 * HD * 3
    assert counts.flops_per_token - std.flops_per_token == 3 * L * H * 2 * 2 * HD * 3
    assert toy.contributions(cfg) == (L * 2 * HD * 3, L * H * 2 * 2 * HD * 3, L * H * 2 * 2 * HD * 3)
    model = GPT(cfg, seed=1)
    logits, _ = model(torch.randint(0, 97, (2, 32)))
    assert logits.shape == (2, 32, 97)
    assert sum(p.numel() for p in model.parameters()) == counts.n_params_total
    assert check_flop_delta(build_config("cpu-xs", "toy_lowrank", vocab_size=64, seq_len=32, rank=3)).ok
    std_model = GPT(build_config("cpu-xs", "standard", vocab_size=97, seq_len=32), seed=1)
    for name, p in std_model.named_parameters():  # the toy shares the seeded backbone too
        assert torch.equal(p, model.get_parameter(name)), name


def test_toy_variant_errors_name_allowed_values(toy):
    with pytest.raises(ValueError, match=r"option\(s\) bogus not valid for variant 'toy_lowrank'; allowed: rank=4"):
        build_config("cpu-xs", "toy_lowrank", bogus=1)
    with pytest.raises(ValueError, match="variant 'toy_lowrank': option rank: Input should be greater than or equal to 1"):
        build_config("cpu-xs", "toy_lowrank", rank=0)
    with pytest.raises(ValueError, match="unknown variant 'nope'; allowed: standard, coupled, .*toy_lowrank"):
        build_config("cpu-xs", "nope")
    with pytest.raises(ValueError, match="'toy_lowrank' is already registered"):
        register(toy)


def test_unknown_variant_and_option_errors_list_allowed_values():
    allowed = "standard, coupled, uncoupled_mlp, differential, coupled_differential, nonlinear_q"
    with pytest.raises(ValueError, match=f"unknown variant 'fancy'; allowed: {allowed}$"):
        build_config("cpu-xs", "fancy")
    with pytest.raises(ValueError, match="unknown variant 'fancy'"):
        ModelConfig(vocab_size=10, seq_len=8, n_layer=1, d_model=32, n_head=2, variant="fancy")
    with pytest.raises(
        ValueError,
        match=r"option\(s\) integrator not valid for variant 'uncoupled_mlp'; "
        r"allowed: n_steps=1, coupling_hidden=None, coupling_sharing='layer', dt_init=0.1$",
    ):
        build_config("cpu-xs", "uncoupled_mlp", integrator="euler")
    with pytest.raises(ValueError, match="not valid for variant 'standard'; allowed: none"):
        ModelConfig(vocab_size=10, seq_len=8, n_layer=1, d_model=32, n_head=2, n_steps=2)


def test_registration_rejects_options_named_like_config_fields():
    class Bad(BaseModel):
        d_model: int = 3

    with pytest.raises(ValueError, match="d_model reuse ModelConfig field names"):
        register(Variant("bad", "clashes", Bad))
    assert "bad" not in VARIANTS


def test_builtin_contributions_match_the_counts():
    for variant in VARIANTS:
        cfg = build_config("cpu-s", variant, vocab_size=100)
        std = count_model(build_config("cpu-s", "standard", vocab_size=100))
        c, counts = REGISTRY[variant].contributions(cfg), count_model(cfg)
        assert c.n_params == counts.n_params - std.n_params
        assert c.flops_per_token_fwd == counts.flops_per_token_fwd - std.flops_per_token_fwd
        assert 3 * c.executed_flops_per_token_fwd == counts.executed_flops_per_token - std.executed_flops_per_token
