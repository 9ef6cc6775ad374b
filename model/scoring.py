"""Scoring kernels: turn (q, k, v) into the attention output, always through fused SDPA.

* `SDPAScoring`: softmax(q k^T / sqrt(head_dim)) v with a causal mask, via
  `torch.nn.functional.scaled_dot_product_attention` (flash kernels on GPU and CPU).
* `DifferentialScoring`: Differential Attention (Ye et al. 2024, arXiv 2410.05258;
  reference microsoft/unilm Diff-Transformer `multihead_diffattn.py`). The n_head query/key
  heads of head_dim form n_head/2 differential heads, each with two softmax maps A1, A2 and
  one value head of width 2*head_dim:
      out_h = (1 - lambda_init) * RMSNorm_2hd((A1 - lambda * A2) v_h)
      lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init
      lambda_init = 0.8 - 0.6 * exp(-0.3 * depth)      (depth = 0-based layer index)
  lambda_q1, lambda_k1, lambda_q2, lambda_k2 are head_dim vectors shared by the layer's
  heads, initialised N(0, 0.1); RMSNorm has eps 1e-5 and a learned weight (as the
  reference). Projections are the same as standard attention, so parameters match
  `standard` up to 6 * head_dim per layer.
  Fused form: by linearity (A1 - lambda A2) v = A1 v - lambda A2 v, so one SDPA call over
  all n_head component heads, each reading its differential head's 2*head_dim value, gives
  both terms without materialising the maps (the reference's FlashDiff does the same).
  GPU SDPA kernels accept a value width != query/key width; the CPU flash kernel does not
  (SDPA would fall back to its unfused math path, ~1.8x slower per layer), so on CPU with
  flash enabled q and k are zero-padded to 2*head_dim with the scale kept at
  1/sqrt(head_dim): scores are unchanged, and the padded half (multiplications by zero) is
  not model FLOPs and is not counted.

FLOPs (forward, per token, per layer, full sequence T, matmuls only) are model FLOPs, the
definition's (DESIGN.md), never what a kernel executes: standard scores 2*T*d_model and AV
2*T*d_model; differential the same, scores 2*T*d_model (n_head component heads of head_dim)
and AV 2*T*d_model ((A1 - lambda A2) v: n_head/2 maps times values of 2*head_dim), so
FLOP-matched budgets treat it exactly like standard. `executed_flops_per_token` is a
separate number, never used in budgets: what the fused form runs, AV 4*T*d_model (both maps
are applied to the value), which is also what FlopCounterMode counts under the math backend;
the CPU flash path's zero padding of q, k (another 2*T*d_model of scores) is in neither.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.contract import StageConfig
from model.init import normal_


def lambda_init_fn(depth: int) -> float:
    """lambda_init = 0.8 - 0.6 * exp(-0.3 * depth), depth = 0-based layer index (Ye et al. 2024)."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _causal_softmax(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Explicit causal attention probabilities; q, k [B, H, T, hd] -> [B, H, T, T] (>= float32)."""
    T = q.shape[-2]
    scores = (_at_least_fp32(q) @ _at_least_fp32(k).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


class SDPAScoring(nn.Module):
    """Causal multi-head softmax attention.

    forward(q, k, v): q, k [B, T, H, head_dim], v [B, T, d_model] -> [B, T, d_model].
    """

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.d_model, self.n_head = d_model, n_head

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, T, H, D = q.shape
        v = v.view(B, T, H, D).transpose(1, 2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v, is_causal=True)
        return y.transpose(1, 2).reshape(B, T, H * D)

    def attention_map(self, q: torch.Tensor, k: torch.Tensor, lam: float | None = None) -> torch.Tensor:
        """Attention probabilities [B, H, T, T] (rows sum to 1) for diagnostics; lam is
        unused (standard attention has no lambda)."""
        return _causal_softmax(q.transpose(1, 2), k.transpose(1, 2))

    def num_flops_per_token(self, seq_len: int) -> int:
        """Model FLOPs per token: scores 2*T*d + AV 2*T*d."""
        return 2 * seq_len * self.d_model + 2 * seq_len * self.d_model


class DifferentialScoring(nn.Module):
    """Differential attention for one layer (see module docstring).

    forward(q, k, v): q, k [B, T, n_head, head_dim] with component heads (2i, 2i+1) forming
    differential head i, v [B, T, d_model] viewed as n_head/2 heads of 2*head_dim
    -> [B, T, d_model].
    """

    def __init__(self, d_model: int, n_head: int, depth: int):
        super().__init__()
        if n_head % 2:
            raise ValueError(f"differential attention needs an even n_head, got {n_head}")
        self.d_model, self.n_head = d_model, n_head
        self.head_dim = d_model // n_head
        self.lambda_init = lambda_init_fn(depth)
        self.lambda_q1 = nn.Parameter(torch.empty(self.head_dim))
        self.lambda_k1 = nn.Parameter(torch.empty(self.head_dim))
        self.lambda_q2 = nn.Parameter(torch.empty(self.head_dim))
        self.lambda_k2 = nn.Parameter(torch.empty(self.head_dim))
        self.subln = nn.RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=True)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Redraw lambda_q1, lambda_k1, lambda_q2, lambda_k2 (in that order) from N(0, 0.1^2)
        with generator (None: the global RNG); RMSNorm weight back to ones."""
        for p in self.lambda_parameters():
            normal_(p, 0.1, generator)
        self.subln.reset_parameters()

    def lambda_parameters(self) -> list[nn.Parameter]:
        """The four lambda vectors [head_dim] that `lambda_full` reads."""
        return [self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2]

    def lambda_full(self) -> torch.Tensor:
        """Scalar lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init."""
        l1 = torch.exp(_at_least_fp32(torch.sum(self.lambda_q1 * self.lambda_k1)))
        l2 = torch.exp(_at_least_fp32(torch.sum(self.lambda_q2 * self.lambda_k2)))
        return l1 - l2 + self.lambda_init

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, T, H, D = q.shape
        # each component head reads its differential head's value (width 2*head_dim)
        v = v.view(B, T, H // 2, 2 * D).transpose(1, 2).repeat_interleave(2, dim=1)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if q.device.type == "cpu" and torch.backends.cuda.flash_sdp_enabled():
            q, k = F.pad(q, (0, D)), F.pad(k, (0, D))  # CPU flash needs equal head dims
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=D**-0.5)
        y = y.view(B, H // 2, 2, T, 2 * D)
        y = y[:, :, 0] - self.lambda_full().to(y.dtype) * y[:, :, 1]
        y = self.subln(y) * (1.0 - self.lambda_init)
        return y.transpose(1, 2).reshape(B, T, H * D)

    def attention_map(self, q: torch.Tensor, k: torch.Tensor, lam: float | None = None) -> torch.Tensor:
        """Differential maps A1 - lambda * A2, [B, n_head/2, T, T] (signed; rows sum to
        1 - lambda). lam: lambda's value if the caller read it already (e.g. with ZeRO-3
        partitioned parameters gathered, `model.diagnostics`); None: `lambda_full()`."""
        a = _causal_softmax(q.transpose(1, 2), k.transpose(1, 2))
        B, H, T, _ = a.shape
        a = a.view(B, H // 2, 2, T, T)
        return a[:, :, 0] - (self.lambda_full() if lam is None else lam) * a[:, :, 1]

    def num_flops_per_token(self, seq_len: int) -> int:
        """Model FLOPs per token: scores 2*T*d + AV 2*T*d, as standard (module docstring)."""
        return 2 * seq_len * self.d_model + 2 * seq_len * self.d_model

    def executed_flops_per_token(self, seq_len: int) -> int:
        """FLOPs the fused form executes per token: scores 2*T*d + AV 4*T*d (never in budgets)."""
        return 2 * seq_len * self.d_model + 4 * seq_len * self.d_model


def differential_scoring(cfg: StageConfig, depth: int) -> DifferentialScoring:
    """The `DifferentialScoring` of layer `depth` (0-based) of a config."""
    return DifferentialScoring(cfg.d_model, cfg.n_head, depth)
