"""The backbone layers a `model.config.Architecture` chooses beyond GPT-2's: RMSNorm (or
LayerNorm), the SwiGLU MLP, rotary positions (RoPE) and QK-norm.

Counting (DESIGN.md's model-FLOP convention: matmuls only, 2 per multiply-add): norms and RoPE
are elementwise, no model FLOPs; SwiGLU is three d x h matmuls, 6 d h forward FLOPs per token.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig, swiglu_hidden

__all__ = ["Rotary", "SwiGLU", "make_norm"]

RMS_EPS = 1e-6  # LLaMA's


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    """The architecture's norm over the last ``dim`` channels: LayerNorm without bias, or
    RMSNorm; either holds one [dim] weight (initialised to 1 by `GPT.init_weights`)."""
    return nn.RMSNorm(dim, eps=RMS_EPS) if cfg.norm == "rmsnorm" else nn.LayerNorm(dim, bias=False)


class SwiGLU(nn.Module):
    """silu(x W_g) * (x W_u) W_o (Shazeer 2020, "GLU Variants Improve Transformer"); x [B, T, d] -> [B, T, d].

    ``fc`` stacks [W_g; W_u] (2h x d, one matmul), ``proj`` is W_o (d x h); h = `swiglu_hidden(d)`.
    The names are the GELU MLP's, so the residual-projection init (by name) applies to ``proj``.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.hidden = swiglu_hidden(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 2 * self.hidden, bias=False)
        self.proj = nn.Linear(self.hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)

    def num_flops_per_token(self) -> int:
        return 2 * 3 * self.fc.in_features * self.hidden  # three d x h matmuls


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021, RoFormer; the rotate-half layout of GPT-NeoX /
    LLaMA): channel i pairs with i + head_dim/2 and turns by angle t * base^(-2i/head_dim).

    forward(q, k) with q, k [B, T, n_head, head_dim] -> (q', k'), same shapes; T <= seq_len.
    The angles are buffers (not saved in checkpoints: a function of the config), no parameters.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hd = cfg.head_dim
        inv_freq = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float32), inv_freq)  # [T, hd/2]
        self.register_buffer("cos", angles.cos()[:, None, :], persistent=False)  # [T, 1, hd/2]
        self.register_buffer("sin", angles.sin()[:, None, :], persistent=False)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        cos, sin = cast(torch.Tensor, self.cos)[:T].to(x.dtype), cast(torch.Tensor, self.sin)[:T].to(x.dtype)
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rotate(q), self._rotate(k)
