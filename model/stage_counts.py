"""What each built-in variant's stages add to standard attention, by arithmetic, torch-free:
the ``counts`` of its `model.registry` entry. Whole-model counts (the backbone plus these)
are `model.counts`, above the registry; tests/model/test_registry.py checks these against the
stages built on the meta device (`Variant.contributions`).

Conventions as `model.counts`: parameters are all non-embedding; FLOPs are forward model
FLOPs per token at cfg.seq_len (matmuls only, 2 per multiply-add), summed over all layers;
executed FLOPs (what a fused kernel runs) only where a stage runs more than the definition.
"""

from __future__ import annotations

from model.contract import Contributions, StageConfig
from model.options import CoupledOptions, DynamicsOptions, NonlinearQOptions


def dynamics_counts(cfg: StageConfig, o: DynamicsOptions, evaluations: int) -> Contributions:
    """f (head_dim -> hidden -> head_dim, weights and biases, one per layer or per head) and
    one dt per head, per layer; each evaluation of f costs 2 (2 head_dim hidden) per head."""
    hd, H = cfg.head_dim, cfg.n_head
    hidden = o.coupling_hidden or hd
    groups = 1 if o.coupling_sharing == "layer" else H
    params = groups * (2 * hd * hidden + hidden + hd) + H
    flops = evaluations * H * 2 * (2 * hd * hidden)
    return Contributions(cfg.n_layer * params, cfg.n_layer * flops, cfg.n_layer * flops)


def coupled_counts(cfg: StageConfig) -> Contributions:
    """Coupled QK dynamics (`model.coupled.CoupledQK`): n_steps evaluations of f (Euler) or
    n_steps + 1 (leapfrog reuses the last evaluation as the next first half-kick)."""
    o = CoupledOptions(**cfg.options)
    return dynamics_counts(cfg, o, o.n_steps + 1 if o.integrator == "leapfrog" else o.n_steps)


def uncoupled_counts(cfg: StageConfig) -> Contributions:
    """The uncoupled control (`model.coupled.UncoupledQK`): n_steps evaluations of f."""
    o = DynamicsOptions(**cfg.options)
    return dynamics_counts(cfg, o, o.n_steps)


def differential_counts(cfg: StageConfig) -> Contributions:
    """Differential scoring (`model.scoring.DifferentialScoring`): four lambda vectors of
    head_dim and the sub-layer RMSNorm weight of 2 head_dim per layer; model FLOPs as standard,
    the fused form executes AV at 4Td instead of 2Td (executed only, never in budgets)."""
    L = cfg.n_layer
    return Contributions(L * 6 * cfg.head_dim, 0, L * 2 * cfg.seq_len * cfg.d_model)


def coupled_differential_counts(cfg: StageConfig) -> Contributions:
    """Coupled dynamics, then differential scoring: the sum of both stages' counts."""
    a, b = coupled_counts(cfg), differential_counts(cfg)
    return Contributions(*(x + y for x, y in zip(a, b)))


def matched_bottleneck(cfg: StageConfig) -> int:
    """The bottleneck r of `nonlinear_q` whose f (2 d r + r + d parameters per layer, d =
    d_model) comes nearest what coupled adds per layer at its default options (f of
    head_dim -> head_dim -> head_dim with biases, and one dt per head: 2 hd^2 + 2 hd + H):
    r = max(1, round((P - d) / (2 d + 1))). At 60m (d 512, hd 64, H 8): P = 8,328, r = 8."""
    per_layer = dynamics_counts(cfg, DynamicsOptions(), 1).n_params // cfg.n_layer
    d = cfg.d_model
    return max(1, round((per_layer - d) / (2 * d + 1)))


def nonlinear_q_counts(cfg: StageConfig) -> Contributions:
    """The nonlinear query (`model.query.ResidualQueryMLP`): f = d_model -> r -> d_model with
    biases, per layer, 2 d r + r + d parameters; forward 2 (2 d r) FLOPs per token (its two
    matmuls; W_Q reads x + f(x) at standard's cost, the residual add is elementwise)."""
    d, L = cfg.d_model, cfg.n_layer
    r = NonlinearQOptions(**cfg.options).bottleneck or matched_bottleneck(cfg)
    return Contributions(L * (2 * d * r + r + d), L * 4 * d * r, L * 4 * d * r)
