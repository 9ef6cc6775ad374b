"""`model.check`: every built-in variant passes every check, and each check fails on a toy
variant broken in the one way that check exists for (its negative control)."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import BaseModel
from torch import nn
from typer.testing import CliRunner

from model import GPT, REGISTRY, ModelConfig, Variant, build_config, count_model, register
from model.check import CHECK_VOCAB, check_config, check_variant, contract_problems
from model.contract import Contributions
from model.init import normal_
from orchestrator.cli import app
from orchestrator.cli_errors import EXIT_FAILED, EXIT_INPUT

CHECKS = 7


class ScaleOptions(BaseModel):
    rank: int = 2


class LowRankQ(nn.Module):
    """q' = q + (q a) b per head: 2 * head_dim * rank parameters and 2 * 2 * that FLOPs per head and token."""

    def __init__(self, cfg: ModelConfig, global_rng: bool = False, flops_scale: int = 1, shape_bug: bool = False):
        super().__init__()
        r = cfg.options.get("rank", 2)
        self.n_head, self.global_rng, self.flops_scale, self.shape_bug = cfg.n_head, global_rng, flops_scale, shape_bug
        self.a = nn.Parameter(torch.empty(cfg.head_dim, r))
        self.b = nn.Parameter(torch.empty(r, cfg.head_dim))
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        gen = None if self.global_rng else (generator or torch.Generator().manual_seed(7))
        normal_(self.a, 0.1, gen)
        normal_(self.b, 0.1, gen)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q2 = q + (q @ self.a) @ self.b
        return (q2[..., :-1] if self.shape_bug else q2), k

    def num_flops_per_token(self, seq_len: int) -> int:
        return self.n_head * 2 * 2 * self.a.numel() // self.flops_scale


class UnusedParameter(LowRankQ):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.spare = nn.Parameter(torch.zeros(3))  # never in the graph


def _counts(cfg: ModelConfig, params_off: int = 0) -> Contributions:
    per_layer = 2 * cfg.head_dim * cfg.options.get("rank", 2)  # a and b
    flops = cfg.n_layer * cfg.n_head * 2 * per_layer  # two matmuls per head and token
    return Contributions(cfg.n_layer * per_layer + params_off, flops, flops)


TOYS = {
    "toy_ok": dict(qk_transform=LowRankQ, counts=_counts),
    "toy_wrong_counts": dict(qk_transform=LowRankQ, counts=lambda cfg: _counts(cfg, params_off=1)),
    "toy_undercounted_flops": dict(qk_transform=lambda cfg: LowRankQ(cfg, flops_scale=2)),
    "toy_global_rng": dict(qk_transform=lambda cfg: LowRankQ(cfg, global_rng=True)),
    "toy_bad_shape": dict(qk_transform=lambda cfg: LowRankQ(cfg, shape_bug=True)),
    "toy_unused": dict(qk_transform=UnusedParameter),
}


@pytest.fixture(scope="module")
def toys():
    for name, stages in TOYS.items():
        register(Variant(name, "a toy for model.check's negative controls", ScaleOptions, **stages))
    yield
    for name in TOYS:
        del REGISTRY[name]


def _failed(results) -> set[str]:
    return {r.name.split(" ")[0] for r in results if r.ok is False}


@pytest.mark.parametrize("variant", ["standard", "coupled", "uncoupled_mlp", "differential", "coupled_differential", "nonlinear_q"])
def test_every_built_in_variant_passes_every_check(variant):
    results = check_variant(variant)
    assert len(results) == CHECKS
    assert [r for r in results if r.ok is not True] == []
    assert contract_problems(variant) == []


def test_a_correct_toy_passes_and_the_checks_see_its_numbers(toys):
    results = {r.name.split(" ")[0]: r for r in check_variant("toy_ok", rank=3)}
    assert all(r.ok for r in results.values()), results
    # per layer and head two matmuls of head_dim 32 x rank 3: 2 * 2 * 96 = 384 forward FLOPs/token;
    # x 4 heads x 3 layers x 3 (forward + backward) = 13,824 training FLOPs/token; 3 x 2 x 96 = 576 parameters
    assert "measured 13,824, analytic executed 13,824, model FLOPs (budgets) 13,824" in results["executed"].detail
    std = count_model(build_config("cpu-xs", "standard", vocab_size=CHECK_VOCAB))
    assert f"N {std.n_params + 576:,}," in results["analytic"].detail


@pytest.mark.parametrize(
    "variant, fails",
    [
        ("toy_wrong_counts", {"analytic"}),  # the registry's arithmetic disagrees with the built stages
        ("toy_undercounted_flops", {"executed"}),  # the stage reports half its matmul FLOPs
        ("toy_global_rng", {"initial"}),  # reset_parameters draws from torch's global RNG
        ("toy_bad_shape", {"stage"}),  # q' loses a channel (later checks fail too: the block cannot run)
        ("toy_unused", {"forward/backward"}),  # a parameter outside the graph
    ],
)
def test_each_check_fails_on_the_toy_broken_for_it(toys, variant, fails):
    failed = _failed(check_variant(variant))
    assert fails <= failed
    if variant != "toy_bad_shape":
        assert failed == fails, failed


def test_paired_fails_when_the_variant_changes_a_shared_weight():
    def perturbed(cfg: ModelConfig, seed: int) -> nn.Module:
        model = GPT(cfg, seed=seed)
        if cfg.variant != "standard":
            with torch.no_grad():
                model.blocks[0].mlp.fc.weight.mul_(1.01)  # e.g. a variant that re-initialises the block
        return model

    cfg = build_config("cpu-xs", "coupled", vocab_size=CHECK_VOCAB)
    paired = {r.name.split(" ")[0]: r for r in check_config(cfg, build=perturbed)}["shared"]
    assert paired.ok is False and "blocks.0.mlp.fc.weight" in paired.detail
    assert {r.name.split(" ")[0]: r for r in check_config(cfg)}["shared"].ok is True


def test_contract_problems_is_what_loading_a_plug_in_refuses(toys):
    assert contract_problems("toy_ok") == []
    assert any("n_params" in p for p in contract_problems("toy_wrong_counts"))
    assert any("stage contract" in p for p in contract_problems("toy_bad_shape"))
    assert any("no gradient: " in p and "spare" in p for p in contract_problems("toy_unused"))
    assert contract_problems("toy_global_rng") == []  # seeding is model check's, not a load error


def test_a_stage_that_raises_is_a_failed_check_not_a_crash():
    def boom(cfg: ModelConfig, seed: int) -> nn.Module:
        raise RuntimeError("stage constructor broke")

    results = check_config(build_config("cpu-xs", "standard", vocab_size=CHECK_VOCAB), build=boom)
    assert [(r.name, r.ok) for r in results] == [("builds", False)] and "stage constructor broke" in results[0].detail


def test_cli_model_check_exit_codes(toys):
    runner = CliRunner()
    ok = runner.invoke(app, ["model", "check", "coupled", "--option", "n_steps=2", "--json"])
    assert ok.exit_code == 0, ok.output
    rows = json.loads(ok.stdout)
    assert len(rows) == CHECKS and all(r["ok"] for r in rows)
    bad = runner.invoke(app, ["model", "check", "toy_wrong_counts"])
    assert bad.exit_code == EXIT_FAILED and "FAIL" in bad.output
    bad_input = [
        ["nope"],
        ["coupled", "--option", "n_steps"],
        ["coupled", "--option", "n_steps=2", "--option", "n_steps=3"],  # which one? not the last silently
        ["coupled", "--option", "colour=3"],
        ["coupled", "--preset", "9b"],
    ]
    for argv in bad_input:
        r = runner.invoke(app, ["model", "check", *argv])
        assert r.exit_code == EXIT_INPUT, (argv, r.output)


def test_a_wrong_shape_that_crashes_a_later_op_still_names_the_stage(toys):
    register(Variant("toy_narrow_q", "q' loses half its channels", ScaleOptions, qk_transform=lambda cfg: _Narrow()))
    try:
        contract = check_variant("toy_narrow_q")[0]
    finally:
        del REGISTRY["toy_narrow_q"]
    assert contract.ok is False
    assert contract.detail.startswith("blocks.0.attn.qk_transform: ") and "the contract says" in contract.detail
    assert "then the forward raised" in contract.detail


class _Narrow(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q[..., :16], k

    def num_flops_per_token(self, seq_len: int) -> int:
        return 0
