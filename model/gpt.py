"""GPT: a decoder-only transformer whose attention variant is chosen by the config.

Layout (nanoGPT / GPT-2): token + learned position embeddings, n_layer pre-LayerNorm blocks
(attention, then a 4x GELU MLP), final LayerNorm, untied LM head; no biases, no dropout.
Init: N(0, 0.02) for linear and embedding weights, residual output projections scaled by
1/sqrt(2 * n_layer) (GPT-2); the QK-transform and differential parameters keep their own
init (see `model.coupled`, `model.scoring`).

Counting conventions (DESIGN.md):
* N (`num_params(non_embedding=True)`) excludes the token embedding, the position table and
  the untied LM head (the unembedding); `n_params_total` counts everything.
* FLOPs are matmul FLOPs (2 per multiply-add) of one forward pass per token, every matmul
  including the LM head, attention scores and AV over the full sequence (not causally
  halved); training FLOPs = 3 x forward. Elementwise work (norms, softmax, activations,
  the integrator's axpys) is not counted, as in Kaplan et al. 2020 / Chinchilla.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from model.attention import CausalSelfAttention
from model.config import ModelConfig


class MLP(nn.Module):
    """d_model -> 4*d_model -> d_model with GELU; x [B, T, d] -> [B, T, d]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))

    def num_flops_per_token(self) -> int:
        return 2 * 2 * self.fc.in_features * self.fc.out_features  # two matmuls, 16*d^2


class Block(nn.Module):
    """Pre-LN transformer block; x [B, T, d] -> [B, T, d]."""

    def __init__(self, cfg: ModelConfig, depth: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = CausalSelfAttention(cfg, depth)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def num_flops_per_token(self, seq_len: int) -> int:
        return self.attn.num_flops_per_token(seq_len) + self.mlp.num_flops_per_token()


class GPT(nn.Module):
    """Decoder-only LM. forward(idx [B, T] int64, targets [B, T] | None) -> (logits [B, T, V], loss).

    Deterministic given torch.manual_seed. Raises ValueError if T > cfg.seq_len.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, depth) for depth in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_backbone)
        for block in self.blocks:  # GPT-2: scale residual output projections by depth
            for proj in (block.attn.out, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_backbone(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds cfg.seq_len={self.cfg.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-100)
        return logits, loss

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; non_embedding=True gives N (no token/position embedding, no LM head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel() + self.lm_head.weight.numel()
        return n

    def num_flops_per_token(self, seq_len: int | None = None) -> int:
        """Forward matmul FLOPs per token at context seq_len (default cfg.seq_len):
        sum of the blocks' counts + LM head 2*d_model*vocab_size."""
        T = self.cfg.seq_len if seq_len is None else seq_len
        return sum(b.num_flops_per_token(T) for b in self.blocks) + 2 * self.cfg.d_model * self.cfg.vocab_size


class ModelCounts(NamedTuple):
    """Analytic size of a config: N (non-embedding), total parameters, FLOPs per token."""

    n_params: int
    n_params_total: int
    flops_per_token_fwd: int
    flops_per_token: int  # training = 3 x forward


class _NoInitOnMeta(TorchFunctionMode):
    """Skip in-place ops (initialisers such as nn.init.normal_, Tensor.uniform_) on meta
    tensors: they hold no values, and torch routes them through Python decompositions whose
    first call imports torch._dynamo (seconds)."""

    _INIT = {"normal_", "uniform_", "fill_", "zero_", "ones_", "zeros_", "constant_",
             "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "trunc_normal_"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self._INIT:
            target = args[0] if args else kwargs.get("tensor")  # nn.init passes tensor=
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


def count_model(cfg: ModelConfig) -> ModelCounts:
    """Parameter and FLOP counts of `GPT(cfg)` at cfg.seq_len without allocating weights
    (the model is built on the meta device; milliseconds even at 350m)."""
    with torch.device("meta"), _NoInitOnMeta():
        m = GPT(cfg)
    fwd = m.num_flops_per_token()
    return ModelCounts(m.num_params(True), m.num_params(False), fwd, 3 * fwd)
