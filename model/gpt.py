"""GPT: a decoder-only transformer whose attention variant is chosen by the config.

Layout (nanoGPT / GPT-2 by default): token + learned position embeddings, n_layer pre-LayerNorm
blocks (attention, then a 4x GELU MLP), final LayerNorm, untied LM head; no biases, no dropout.
The config's `model.config.Architecture` swaps in RoPE (no position table), RMSNorm, a SwiGLU
MLP, QK-norm and a tied head (`model.layers`), for every variant alike.
Init (`GPT.init_weights`): N(0, 0.02) for linear and embedding weights, residual output
projections N(0, 0.02 / sqrt(2 * n_layer)) (GPT-2), LayerNorm weights 1. Each backbone
tensor draws from its own generator seeded from (seed, parameter name), and each variant
stage (query input, QK transform, scoring kernel) redraws its own parameters from a generator seeded
from (seed, stage name) (`model.init`). So at one seed every variant has the same
`tok_emb`, `pos_emb`, projections, MLPs and LM head as `standard` (all of the backbone: the
QKV projection is d_model x 3 d_model for every variant, differential included, which
regroups the same heads in pairs), and variants that share a stage (coupled and
coupled_differential's f and dt; differential and coupled_differential's lambdas) share its
initial values too: comparisons are paired by seed.

Counting conventions (DESIGN.md):
* N (`num_params(non_embedding=True)`) excludes the token embedding, the position table and
  the untied LM head (the unembedding); `n_params_total` counts everything.
* FLOPs are model FLOPs: matmul FLOPs (2 per multiply-add) of one forward pass per token
  of the definition, every matmul including the LM head, attention scores and AV over the
  full sequence (not causally halved); training FLOPs = 3 x forward. Elementwise work
  (norms, softmax, activations, the integrator's axpys) is not counted, as in Kaplan et al.
  2020 / Chinchilla. Budgets use these only; executed FLOPs (what fused kernels run,
  `executed=True`, `model.counts.ModelCounts.executed_flops_per_token`) are a separate number.
Whole-model counts of a config, without building it, are `model.counts` (above this module).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import CausalSelfAttention
from model.config import ModelConfig
from model.coupled import DynamicsQK
from model.fused_qk import check_impl
from model.init import normal_, seeded_generator
from model.layers import SwiGLU, make_norm

__all__ = ["GPT", "MLP", "STAGES", "Block"]

STAGES = ("query_input", "qk_transform", "scoring")
"""The attention sub-modules a variant swaps (`model.registry`); the rest is the backbone."""


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
    """Pre-norm transformer block; x [B, T, d] -> [B, T, d]."""

    def __init__(self, cfg: ModelConfig, depth: int):
        super().__init__()
        self.ln_1 = make_norm(cfg, cfg.d_model)
        self.attn = CausalSelfAttention(cfg, depth)
        self.ln_2 = make_norm(cfg, cfg.d_model)
        self.mlp: MLP | SwiGLU = SwiGLU(cfg) if cfg.mlp == "swiglu" else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def num_flops_per_token(self, seq_len: int, executed: bool = False) -> int:
        return self.attn.num_flops_per_token(seq_len, executed) + self.mlp.num_flops_per_token()


class GPT(nn.Module):
    """Decoder-only LM. forward(idx [B, T] int64, targets [B, T] | None) -> (logits [B, T, V], loss).

    seed: the initial weights are a function of (cfg, seed) (`init_weights`); None draws the
    seed from torch's global RNG before anything else is built, so `torch.manual_seed(s)`
    followed by `GPT(cfg)` is deterministic and paired across variants too.
    qk_impl: how learned QK transforms run, one of `model.fused_qk.QK_IMPLS` ("auto": the
    fused path for CPU training, compiled on CUDA; `set_qk_impl`). It changes speed, not
    the function computed (equal to float tolerance), so it is not part of the config.
    Raises ValueError if T > cfg.seq_len or qk_impl is unknown.
    """

    def __init__(self, cfg: ModelConfig, seed: int | None = None, qk_impl: str = "auto"):
        super().__init__()
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), device="cpu"))
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg, depth) for depth in range(cfg.n_layer))
        self.ln_f = make_norm(cfg, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied_head:  # one tensor: named tok_emb.weight (named_parameters lists it once)
            self.lm_head.weight = self.tok_emb.weight
        self.init_weights(seed)
        self.set_qk_impl(qk_impl)

    def set_qk_impl(self, impl: str) -> None:
        """Run every learned QK transform with impl (`model.fused_qk.QK_IMPLS`); ValueError if unknown."""
        check_impl(impl)
        for m in self.modules():
            if isinstance(m, DynamicsQK):
                m.impl = impl

    def init_weights(self, seed: int) -> None:
        """(Re)draw every parameter from generators seeded by (seed, name), see the module
        docstring: backbone weights from `backbone_parameters`, then each layer's variant
        stages through their reset_parameters(generator)."""
        std_resid = 0.02 / math.sqrt(2 * self.cfg.n_layer)  # GPT-2: residual projections by depth
        for name, p in self.backbone_parameters().items():
            if p.dim() == 1:  # a norm's weight (LayerNorm, RMSNorm, QK-norm)
                with torch.no_grad():
                    p.fill_(1.0)
                continue
            resid = name.endswith(("attn.out.weight", "mlp.proj.weight"))
            normal_(p, std_resid if resid else 0.02, seeded_generator(seed, name))
        for i, block in enumerate(self.blocks):
            for stage_name in STAGES:
                stage = getattr(block.attn, stage_name)
                if any(True for _ in stage.parameters()):
                    stage.reset_parameters(generator=seeded_generator(seed, f"blocks.{i}.attn.{stage_name}"))

    def backbone_parameters(self) -> dict[str, nn.Parameter]:
        """Parameters outside the variant stages, by name: the same names and shapes in
        every variant of one shape (embeddings, LayerNorms, QKV/output projections, MLPs,
        LM head)."""
        stage = tuple(f".attn.{s}." for s in STAGES)
        return {n: p for n, p in self.named_parameters() if not any(s in n for s in stage)}

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds cfg.seq_len={self.cfg.seq_len}")
        x = self.tok_emb(idx)
        if self.pos_emb is not None:  # RoPE instead: positions enter in attention
            x = x + self.pos_emb(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-100)
        return logits, loss

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (a tied head's weight once); non_embedding=True gives N (no token or
        position embedding, no LM head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
            n -= 0 if self.pos_emb is None else self.pos_emb.weight.numel()
            n -= 0 if self.cfg.tied_head else self.lm_head.weight.numel()
        return n

    def num_flops_per_token(self, seq_len: int | None = None, executed: bool = False) -> int:
        """Forward model FLOPs per token at context seq_len (default cfg.seq_len): sum of the
        blocks' counts + LM head 2*d_model*vocab_size. executed=True: what the kernels run
        instead (differs only where a stage defines executed_flops_per_token; never for budgets)."""
        T = self.cfg.seq_len if seq_len is None else seq_len
        blocks: list[Block] = list(self.blocks)  # type: ignore[arg-type]
        return sum(b.num_flops_per_token(T, executed) for b in blocks) + 2 * self.cfg.d_model * self.cfg.vocab_size
