"""Attention diagnostics on a probe of validation windows: entropy, effective rank, spectral gap.

For every layer the explicit attention maps A [B, heads, T, T] are recomputed from the
layer's input (captured by a forward pre-hook during one no-grad forward pass), then:

* entropy: mean over query rows of -sum_j p_j log p_j [nats], p = the row of A.
* effective rank: exp of the entropy of the normalised singular values of A,
  sigma / sum(sigma) (Roy & Vetterli 2007), between 1 and T.
  The singular values are the square roots of the eigenvalues of A Aᵀ in float64
  (``singular_values``): 1.2-1.8x faster than an SVD at T = 128-1024 on a CPU and within 2e-5 of
  it in effective rank and 5e-8 in spectral gap on causal softmax and rank-one maps
  (BENCHMARKS.md, ``benchmarks.diag_spectrum``); in float32 the same route is off by 0.04-0.27 in
  effective rank (the small singular values drown in rounding), so it is not used.
* spectral gap: 1 - sigma_2 / sigma_1 of A (relative gap between its two largest singular
  values; 0 = no dominant direction, 1 = rank one).

Per window each is averaged over heads and layers; the result is the mean over the probe's
windows with their spread (sample standard deviation across windows), plus per-layer means.
A probe should hold at least `PROBE_WINDOWS` windows (two windows say little). Differential
attention is measured on its signed map A1 - lambda * A2, with the entropy taken over
|row| / sum|row|.

Distributed use: the maps come from module calls (qkv, QK transform), which a sharded
engine's hooks gather, except lambda, which the diagnostics read directly from the four
lambda vectors of each differential layer. They read them once, through `layer_lambdas`,
inside `gather(lambda_parameters(model))`: under DeepSpeed ZeRO-3 pass
`gather=deepspeed.zero.GatheredParameters` (this package imports no DeepSpeed). A lambda
vector that is still partitioned (empty) raises instead of silently reading lambda_init.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from model.gpt import GPT
from model.scoring import DifferentialScoring

PROBE_WINDOWS = 16
"""Windows a probe should hold so that the spread across windows means something."""

NAMES = ("entropy", "effective_rank", "spectral_gap")

Gather = Callable[[list[nn.Parameter]], contextlib.AbstractContextManager[Any]]


def singular_values(a: torch.Tensor) -> torch.Tensor:
    """Singular values [..., T] (descending, float64) of square maps a [..., T, T], as
    sqrt(eigvalsh(A Aᵀ)) in float64 (Golub & Van Loan, Matrix Computations, 4th ed., 8.6: the
    singular values of A are the square roots of the eigenvalues of A Aᵀ). A singular value
    taken this way is off by at most about sqrt(eps) * sigma_1 = 1.5e-8 sigma_1: a small one loses
    its relative accuracy, which the effective rank and the gap barely weigh (within 2e-5 of
    the SVD at T = 1024; tests/model/test_diagnostics.py holds them to 1e-3)."""
    a = a.double()
    return torch.linalg.eigvalsh(a @ a.transpose(-1, -2)).flip(-1).clamp_min(0).sqrt()


def _window_stats(a: torch.Tensor) -> torch.Tensor:
    """[3, B]: (entropy, effective rank, spectral gap) of maps a [B, H, T, T], mean over heads."""
    a = a.double()
    p = a.abs()
    p = p / p.sum(-1, keepdim=True)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1).mean(-1)  # [B, H]
    s = singular_values(a)  # [B, H, T], descending
    eff_rank, gap = rank_and_gap(s)
    return torch.stack([entropy, eff_rank, gap]).mean(-1)


def rank_and_gap(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(effective rank, spectral gap), each [...], of singular values s [..., T] (descending):
    exp of the entropy of s / sum(s) (Roy & Vetterli 2007) and 1 - s_2 / s_1 (0 when T = 1)."""
    ps = s / s.sum(-1, keepdim=True)
    eff_rank = torch.exp(-(ps * torch.log(ps.clamp_min(1e-300))).sum(-1))
    gap = 1 - s[..., 1] / s[..., 0] if s.shape[-1] > 1 else torch.zeros_like(eff_rank)
    return eff_rank, gap


def _map_stats(a: torch.Tensor) -> tuple[float, float, float]:
    """(entropy, effective rank, spectral gap) averaged over maps a [B, H, T, T]."""
    e, r, g = _window_stats(a).mean(-1).tolist()
    return e, r, g


def _blocks(model: GPT) -> list[Any]:
    return list(model.blocks)


def lambda_parameters(model: GPT) -> list[nn.Parameter]:
    """Every parameter the diagnostics read outside a module's forward: the lambda vectors of
    each differential layer (empty for variants without them). Gather these under ZeRO-3."""
    return [p for b in _blocks(model) if isinstance(b.attn.scoring, DifferentialScoring) for p in b.attn.scoring.lambda_parameters()]


def layer_lambdas(model: GPT, gather: Gather | None = None) -> list[float | None]:
    """Lambda of each layer (None where the layer has none), read inside
    gather(lambda_parameters(model)) when gather is given.

    Raises RuntimeError if a lambda vector is empty (partitioned by ZeRO-3 and not gathered).
    """
    params = lambda_parameters(model)
    with gather(params) if gather is not None and params else contextlib.nullcontext():
        if any(p.numel() == 0 for p in params):
            raise RuntimeError(
                "differential lambda parameters are partitioned (ZeRO-3): pass "
                "gather=deepspeed.zero.GatheredParameters to attention_diagnostics"
            )
        return [
            float(b.attn.scoring.lambda_full().detach()) if isinstance(b.attn.scoring, DifferentialScoring) else None
            for b in _blocks(model)
        ]


def _layer_inputs(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's attention input for probe tokens idx, from one forward pass."""
    inputs: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])) for b in _blocks(model)]
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
    return inputs


@torch.no_grad()
def window_stats(model: GPT, idx: torch.Tensor, batch_size: int = 8, gather: Gather | None = None) -> torch.Tensor:
    """Per-window diagnostics of `model` on probe windows idx [W, T] (T >= 2): a float64
    tensor [L, 3, W] of (entropy, effective rank, spectral gap) (`NAMES` order) for each layer
    and window, each averaged over heads. Windows run batch_size at a time (maps are T x T per
    head). gather: see the module docstring (ZeRO-3). The model's train/eval mode is restored.
    Raises ValueError if idx is not [W, T] with T >= 2."""
    if idx.dim() != 2 or idx.shape[1] < 2:
        raise ValueError(f"probe batch must be [B, T] with T >= 2, got shape {tuple(idx.shape)}")
    lambdas = layer_lambdas(model, gather)
    was_training = model.training
    model.eval()
    try:
        chunks = []  # [L, 3, B] per chunk of windows
        for part in idx.split(batch_size):
            inputs = _layer_inputs(model, part)
            chunks.append(torch.stack([_window_stats(b.attn.attention_map(x, lam)) for b, x, lam in zip(_blocks(model), inputs, lambdas)]))
    finally:
        model.train(was_training)
    return torch.cat(chunks, dim=-1)


def sharded_stats(model: GPT, idx: torch.Tensor, rank: int, world: int, gather: Gather | None = None) -> torch.Tensor:
    """This rank's piece of `window_stats` of probe idx [W, T] split over `world` ranks: a
    float64 CPU tensor [L, 3, W] holding the stats of windows rank, rank + world, ... and
    zeros elsewhere, so the ranks' pieces summed (an all-reduce) are the whole probe's stats.
    Every rank runs the same forwards, ceil(W / world) windows (a short share is padded with
    window 0, whose stats are dropped): under ZeRO-3 the forwards and lambda gathers are
    collective. Raises ValueError for a bad probe (`window_stats`) or rank outside [0, world)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a world of {world}")
    windows = idx.shape[0]
    mine = list(range(rank, windows, world))
    share = -(-windows // world)
    stats = window_stats(model, idx[mine + [0] * (share - len(mine))], gather=gather)[..., : len(mine)].cpu()
    whole = torch.zeros(stats.shape[0], stats.shape[1], windows, dtype=torch.float64)
    whole[..., mine] = stats
    return whole


def summarize(stats: torch.Tensor) -> dict[str, float]:
    """MLflow-ready keys from per-window stats [L, 3, W] (`window_stats`; a sharded probe's
    pieces may be put together first, in any window order): for each metric in `NAMES`,
    "attn/<metric>" (mean over windows of the layer-averaged value), "attn/<metric>/std" (its
    sample std across the W windows; 0 if W = 1) and "attn/<metric>/layer_{i}" (mean over
    windows) for each 0-based layer i; plus "attn/probe_windows" = W."""
    per_window = stats.mean(0)  # [3, W], layer-averaged
    out: dict[str, float] = {"attn/probe_windows": float(stats.shape[-1])}
    for j, name in enumerate(NAMES):
        values = per_window[j].tolist()
        out[f"attn/{name}"] = statistics.fmean(values)
        out[f"attn/{name}/std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        for i in range(stats.shape[0]):
            out[f"attn/{name}/layer_{i}"] = stats[i, j].mean().item()
    return out


def attention_diagnostics(model: GPT, idx: torch.Tensor, batch_size: int = 8, gather: Gather | None = None) -> dict[str, float]:
    """Diagnostics of `model` on probe windows idx [W, T] (T >= 2), as MLflow-ready keys:
    `summarize` of `window_stats` (see both). Raises ValueError if idx is not [W, T], T >= 2."""
    return summarize(window_stats(model, idx, batch_size, gather))
