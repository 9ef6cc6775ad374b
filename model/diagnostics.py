"""Attention diagnostics on a probe batch: entropy, effective rank, spectral gap.

For every layer the explicit attention maps A [B, heads, T, T] are recomputed from the
layer's input (captured by a forward pre-hook during one no-grad forward pass), then:

* entropy: mean over query rows of -sum_j p_j log p_j [nats], p = the row of A.
* effective rank: exp of the entropy of the normalised singular values of A,
  sigma / sum(sigma) (Roy & Vetterli 2007), between 1 and T.
* spectral gap: 1 - sigma_2 / sigma_1 of A (relative gap between its two largest singular
  values; 0 = no dominant direction, 1 = rank one).

Each is averaged over batch and heads per layer, then over layers. Differential attention
is measured on its signed map A1 - lambda * A2, with the entropy taken over |row| / sum|row|.
"""
from __future__ import annotations

import torch

from model.gpt import GPT


def _map_stats(a: torch.Tensor) -> tuple[float, float, float]:
    """(entropy, effective rank, spectral gap) averaged over maps a [B, H, T, T]."""
    a = a.double()
    p = a.abs()
    p = p / p.sum(-1, keepdim=True)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1).mean()
    s = torch.linalg.svdvals(a)  # [B, H, T], descending
    ps = s / s.sum(-1, keepdim=True)
    eff_rank = torch.exp(-(ps * torch.log(ps.clamp_min(1e-300))).sum(-1)).mean()
    gap = (1 - s[..., 1] / s[..., 0]).mean() if s.shape[-1] > 1 else torch.zeros(())
    return entropy.item(), eff_rank.item(), gap.item()


@torch.no_grad()
def attention_diagnostics(model: GPT, idx: torch.Tensor) -> dict[str, float]:
    """Diagnostics of `model` on probe tokens idx [B, T] (T >= 2), as MLflow-ready keys.

    Returns "attn/entropy", "attn/effective_rank", "attn/spectral_gap" (means over layers)
    and "attn/<metric>/layer_{i}" for each 0-based layer i. Raises ValueError if T < 2.
    The model's train/eval mode is restored afterwards.
    """
    if idx.dim() != 2 or idx.shape[1] < 2:
        raise ValueError(f"probe batch must be [B, T] with T >= 2, got shape {tuple(idx.shape)}")
    inputs: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
             for b in model.blocks]
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    out: dict[str, float] = {}
    names = ("entropy", "effective_rank", "spectral_gap")
    per_layer = [_map_stats(b.attn.attention_map(x)) for b, x in zip(model.blocks, inputs)]
    for i, stats in enumerate(per_layer):
        for name, value in zip(names, stats):
            out[f"attn/{name}/layer_{i}"] = value
    for j, name in enumerate(names):
        out[f"attn/{name}"] = sum(s[j] for s in per_layer) / len(per_layer)
    return out
