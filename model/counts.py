"""Parameter and FLOP counts of a config by arithmetic, torch-free (the planner, `qkstudy
validate` / `plan`, the ladder generator): what `GPT(cfg)` holds and computes, without
building it. `model.gpt.count_instantiated` counts the built model (meta device) instead;
tests/model/test_counts.py asserts the two agree for every preset, variant and option grid.

Conventions (DESIGN.md, `model.gpt`): N excludes the token embedding, the position table and
the untied LM head; FLOPs are model FLOPs, matmuls only (2 per multiply-add), one forward pass
per token at context T, scores and AV over the full sequence; training = 3 x forward.

Backbone, per layer (d = d_model, no biases): QKV 3d^2 + output d^2 + MLP 8d^2 weights and two
LayerNorm weights 2d; forward FLOPs QKV 6d^2 + output 2d^2 + MLP 16d^2 + scores 2Td + AV 2Td.
Plus the final LayerNorm (d), embeddings (V d + T d), LM head (V d weights, 2 d V FLOPs).

A variant's stages add `Contributions` (its registry entry's ``counts``, below for the built-in
ones). A variant registered without them is counted on the built model instead (torch).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from model.options import CoupledOptions, DynamicsOptions

if TYPE_CHECKING:
    from model.config import ModelConfig


class Contributions(NamedTuple):
    """What a variant adds to standard attention over the whole model (all layers): parameters
    (all of them non-embedding) and forward FLOPs per token, model and executed."""

    n_params: int
    flops_per_token_fwd: int
    executed_flops_per_token_fwd: int


class ModelCounts(NamedTuple):
    """Analytic size of a config: N (non-embedding), total parameters, FLOPs per token.
    flops_per_token (training, 3 x forward, model FLOPs) is what budgets use;
    executed_flops_per_token (training, 3 x executed forward) is reported beside it only."""

    n_params: int
    n_params_total: int
    flops_per_token_fwd: int
    flops_per_token: int  # training = 3 x forward
    executed_flops_per_token: int


def dynamics_counts(cfg: ModelConfig, o: DynamicsOptions, evaluations: int) -> Contributions:
    """f (head_dim -> hidden -> head_dim, weights and biases, one per layer or per head) and
    one dt per head, per layer; each evaluation of f costs 2 (2 head_dim hidden) per head."""
    hd, H = cfg.head_dim, cfg.n_head
    hidden = o.coupling_hidden or hd
    groups = 1 if o.coupling_sharing == "layer" else H
    params = groups * (2 * hd * hidden + hidden + hd) + H
    flops = evaluations * H * 2 * (2 * hd * hidden)
    return Contributions(cfg.n_layer * params, cfg.n_layer * flops, cfg.n_layer * flops)


def coupled_counts(cfg: ModelConfig) -> Contributions:
    """Coupled QK dynamics (`model.coupled.CoupledQK`): n_steps evaluations of f (Euler) or
    n_steps + 1 (leapfrog reuses the last evaluation as the next first half-kick)."""
    o = CoupledOptions(**cfg.options)
    return dynamics_counts(cfg, o, o.n_steps + 1 if o.integrator == "leapfrog" else o.n_steps)


def uncoupled_counts(cfg: ModelConfig) -> Contributions:
    """The uncoupled control (`model.coupled.UncoupledQK`): n_steps evaluations of f."""
    o = DynamicsOptions(**cfg.options)
    return dynamics_counts(cfg, o, o.n_steps)


def differential_counts(cfg: ModelConfig) -> Contributions:
    """Differential scoring (`model.scoring.DifferentialScoring`): four lambda vectors of
    head_dim and the sub-layer RMSNorm weight of 2 head_dim per layer; model FLOPs as standard,
    the fused form executes AV at 4Td instead of 2Td (executed only, never in budgets)."""
    L = cfg.n_layer
    return Contributions(L * 6 * cfg.head_dim, 0, L * 2 * cfg.seq_len * cfg.d_model)


def coupled_differential_counts(cfg: ModelConfig) -> Contributions:
    """Coupled dynamics, then differential scoring: the sum of both stages' counts."""
    a, b = coupled_counts(cfg), differential_counts(cfg)
    return Contributions(*(x + y for x, y in zip(a, b)))


def count_model(cfg: ModelConfig) -> ModelCounts:
    """Parameter and FLOP counts of `GPT(cfg)` at cfg.seq_len (module docstring), by arithmetic.

    A variant whose registry entry gives no ``counts`` is counted on the model built on the
    meta device (`model.gpt.count_instantiated`, which imports torch)."""
    from model.registry import get_variant

    variant = get_variant(cfg.variant)
    extra = variant.analytic_contributions(cfg)
    if extra is None:
        from model.gpt import count_instantiated

        return count_instantiated(cfg)
    L, d, T, V = cfg.n_layer, cfg.d_model, cfg.seq_len, cfg.vocab_size
    n = L * (12 * d * d + 2 * d) + d + extra.n_params
    base_fwd = L * (24 * d * d + 4 * T * d) + 2 * d * V
    fwd, executed = base_fwd + extra.flops_per_token_fwd, base_fwd + extra.executed_flops_per_token_fwd
    return ModelCounts(n, n + 2 * V * d + T * d, fwd, 3 * fwd, 3 * executed)
