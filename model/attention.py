"""Causal self-attention assembled from three stages: projection -> QK transform -> scoring.

A variant swaps only the middle stage (`model.coupled`) and/or the scoring kernel
(`model.scoring`), as its `model.registry` entry says; the fused QKV projection and the
output projection are shared by all.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from model.config import ModelConfig
from model.registry import ScoringStage, get_variant, stage_flops


class CausalSelfAttention(nn.Module):
    """x [B, T, d_model] -> [B, T, d_model]; see module docstring for the stages."""

    def __init__(self, cfg: ModelConfig, depth: int):
        super().__init__()
        self.n_head, self.head_dim, self.d_model = cfg.n_head, cfg.head_dim, cfg.d_model
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        variant = get_variant(cfg.variant)
        self.qk_transform: nn.Module = variant.make_qk_transform(cfg)
        self.scoring: nn.Module = variant.make_scoring(cfg, depth)
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
    def attention_map(self, x: torch.Tensor, lam: float | None = None) -> torch.Tensor:
        """Explicit attention maps [B, heads, T, T] for diagnostics (heads = n_head, or
        n_head/2 differential heads); lam: see `DifferentialScoring.attention_map`."""
        q, k, _ = self._qkv(x)
        return cast(ScoringStage, self.scoring).attention_map(q, k, lam)

    def num_flops_per_token(self, seq_len: int, executed: bool = False) -> int:
        """Forward FLOPs per token: QKV 6*d^2 + output 2*d^2 + transform + scoring (model
        FLOPs; executed=True: what the kernels run, `model.registry.stage_flops`)."""
        d = self.d_model
        return 2 * d * 3 * d + 2 * d * d + stage_flops(self.qk_transform, seq_len, executed) + stage_flops(self.scoring, seq_len, executed)
