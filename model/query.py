"""Query-input stages: what the query projection W_Q reads, x [B, T, d_model] -> [B, T, d_model].

* `IdentityQuery` (every variant but `nonlinear_q`): x itself, so attention keeps its one fused
  QKV matmul.
* `ResidualQueryMLP` (`nonlinear_q`, the nonlinear-query control of arXiv 2603.13381,
  Karbevski 2026): x + f(x), f a bottleneck MLP d_model -> r -> d_model with GELU (the
  backbone MLP's nonlinearity), one per layer; W_K and W_V read x unchanged. The paper replaces
  W_Q by Q(X) = X + f(X); here W_Q stays (q' = W_Q (x + f(x))), so the backbone, W_Q included,
  is standard's and paired by seed, and the control differs from standard attention only by f.
  It is the control coupled dynamics must beat: a nonlinearity on the query path without any
  coupling of queries and keys.

Identity at init: f's output weight and both biases start at zero, so f(x) = 0 and the first
forward equals standard attention's (the input weight is drawn like nn.Linear's, so f's output
weight gets a gradient from the first step).

FLOPs (forward, per token, per layer): 2 (2 d_model r), f's two matmuls; W_Q reads x + f(x) at
standard's cost (the residual add is elementwise, not counted; DESIGN.md's model-FLOP
convention). Parameters: 2 d_model r + r + d_model (`model.stage_counts.nonlinear_q_counts`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.contract import StageConfig
from model.init import uniform_
from model.options import NonlinearQOptions
from model.stage_counts import matched_bottleneck


class IdentityQuery(nn.Module):
    """x -> x: W_Q reads what W_K and W_V read (standard attention)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def num_flops_per_token(self, seq_len: int) -> int:
        return 0


class ResidualQueryMLP(nn.Module):
    """x -> x + f(x), f(x) = w2 gelu(w1 x + b1) + b2; x [B, T, d_model]; w1 [r, d_model],
    w2 [d_model, r] (nn.Linear layout). See the module docstring for init and counts."""

    def __init__(self, d_model: int, bottleneck: int):
        super().__init__()
        self.d_model, self.bottleneck = d_model, bottleneck
        self.w1 = nn.Parameter(torch.empty(bottleneck, d_model))
        self.b1 = nn.Parameter(torch.empty(bottleneck))
        self.w2 = nn.Parameter(torch.empty(d_model, bottleneck))
        self.b2 = nn.Parameter(torch.empty(d_model))
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Draw w1 like nn.Linear's (uniform, bound 1/sqrt(d_model)) from generator (None: the
        global RNG); zero w2 and both biases, so f(x) = 0 at init."""
        uniform_(self.w1, 1.0 / math.sqrt(self.d_model), generator)
        with torch.no_grad():
            for p in (self.b1, self.w2, self.b2):
                p.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2, self.b2)

    def num_flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token of f's two matmuls (2 * 2 d_model r)."""
        return 2 * 2 * self.d_model * self.bottleneck


def nonlinear_query(cfg: StageConfig) -> ResidualQueryMLP:
    """`nonlinear_q`'s query-input stage for cfg (`model.registry`); bottleneck None is
    `model.stage_counts.matched_bottleneck`."""
    o = NonlinearQOptions(**cfg.options)
    return ResidualQueryMLP(cfg.d_model, o.bottleneck or matched_bottleneck(cfg))
