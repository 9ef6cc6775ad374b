"""Causal self-attention assembled from three stages: projection -> QK transform -> scoring.

A variant swaps only the middle stage (`model.coupled`) and/or the scoring kernel
(`model.scoring`); the fused QKV projection and the output projection are shared by all.
"""
from __future__ import annotations

import torch
from torch import nn

from model.config import ModelConfig
from model.coupled import CoupledQK, IdentityQK, UncoupledQK
from model.scoring import DifferentialScoring, SDPAScoring


def make_qk_transform(cfg: ModelConfig) -> nn.Module:
    """The QK transform a variant uses (`IdentityQK`, `CoupledQK` or `UncoupledQK`)."""
    if cfg.variant in ("standard", "differential"):
        return IdentityQK()
    common = dict(n_head=cfg.n_head, head_dim=cfg.head_dim, hidden=cfg.hidden,
                  sharing=cfg.coupling_sharing, n_steps=cfg.n_steps, dt_init=cfg.dt_init)
    if cfg.variant == "uncoupled_mlp":
        return UncoupledQK(**common)
    return CoupledQK(**common, integrator=cfg.integrator)


def make_scoring(cfg: ModelConfig, depth: int) -> nn.Module:
    """The scoring kernel a variant uses; depth is the 0-based layer index."""
    if cfg.variant in ("differential", "coupled_differential"):
        return DifferentialScoring(cfg.d_model, cfg.n_head, depth)
    return SDPAScoring(cfg.d_model, cfg.n_head)


class CausalSelfAttention(nn.Module):
    """x [B, T, d_model] -> [B, T, d_model]; see module docstring for the stages."""

    def __init__(self, cfg: ModelConfig, depth: int):
        super().__init__()
        self.n_head, self.head_dim, self.d_model = cfg.n_head, cfg.head_dim, cfg.d_model
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.qk_transform = make_qk_transform(cfg)
        self.scoring = make_scoring(cfg, depth)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.d_model, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_head, self.head_dim)
        q, k = self.qk_transform(q, k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.scoring(*self._qkv(x)))

    @torch.no_grad()
    def attention_map(self, x: torch.Tensor) -> torch.Tensor:
        """Explicit attention maps [B, heads, T, T] for diagnostics (heads = n_head, or
        n_head/2 differential heads)."""
        q, k, _ = self._qkv(x)
        return self.scoring.attention_map(q, k)

    def num_flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token: QKV 6*d^2 + output 2*d^2 + transform + scoring."""
        d = self.d_model
        return (2 * d * 3 * d + 2 * d * d + self.qk_transform.num_flops_per_token()
                + self.scoring.num_flops_per_token(seq_len))
