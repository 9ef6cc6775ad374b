"""Causal self-attention assembled from stages: query input -> projection -> [QK-norm] ->
[RoPE before] QK transform [RoPE after] -> scoring -> output projection (the bracketed parts
per the config's `model.config.Architecture`; GPT-2's layout has none of them).

A variant swaps the query input (`model.query`), the QK transform (`model.coupled`) and/or the
scoring kernel (`model.scoring`), as its `model.registry` entry says; the QKV projection
(one d_model x 3 d_model weight) and the output projection are shared by all.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.contract import ScoringStage
from model.layers import RMS_EPS, Rotary
from model.query import IdentityQuery
from model.registry import get_variant, stage_flops


class QKVProjection(nn.Linear):
    """The stacked query/key/value projection [W_Q; W_K; W_V] (no bias): x [B, T, d] -> [B, T, 3d].

    forward(x, x_q): W_Q reads x_q, W_K and W_V read x (the same weight, split; one fused matmul
    when x_q is None). Slicing happens inside this module's forward so that ZeRO-3, which gathers
    a module's weight around its own forward, gathers it.
    """

    def __init__(self, d_model: int):
        super().__init__(d_model, 3 * d_model, bias=False)

    def forward(self, x: torch.Tensor, x_q: torch.Tensor | None = None) -> torch.Tensor:
        if x_q is None:
            return super().forward(x)
        d = self.in_features
        return torch.cat([F.linear(x_q, self.weight[:d]), F.linear(x, self.weight[d:])], dim=-1)


class CausalSelfAttention(nn.Module):
    """x [B, T, d_model] -> [B, T, d_model]; see module docstring for the stages."""

    def __init__(self, cfg: ModelConfig, depth: int):
        super().__init__()
        self.n_head, self.head_dim, self.d_model = cfg.n_head, cfg.head_dim, cfg.d_model
        self.qkv = QKVProjection(cfg.d_model)
        variant = get_variant(cfg.variant)
        self.query_input: nn.Module = variant.make_query_input(cfg)
        self.qk_transform: nn.Module = variant.make_qk_transform(cfg)
        self.scoring: nn.Module = variant.make_scoring(cfg, depth)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        # backbone, not a stage: the same in every variant of one architecture
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=RMS_EPS) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=RMS_EPS) if cfg.qk_norm else None
        self.rotary = Rotary(cfg) if cfg.positions == "rope" else None
        self.rope_first = cfg.rope_at == "before_transform"

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        x_q = None if isinstance(self.query_input, IdentityQuery) else self.query_input(x)
        q, k, v = self.qkv(x, x_q).split(self.d_model, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_head, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None and self.rope_first:
            q, k = self.rotary(q, k)
        q, k = self.qk_transform(q, k)
        if self.rotary is not None and not self.rope_first:
            q, k = self.rotary(q, k)
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
        """Forward FLOPs per token: QKV 6*d^2 + output 2*d^2 + query input + transform + scoring
        (model FLOPs; executed=True: what the kernels run, `model.registry.stage_flops`)."""
        d = self.d_model
        stages = (self.query_input, self.qk_transform, self.scoring)
        return 2 * d * 3 * d + 2 * d * d + sum(stage_flops(s, seq_len, executed) for s in stages)
