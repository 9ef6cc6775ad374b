"""Whole-model parameter and FLOP counts of a config: what `GPT(cfg)` holds and computes.

`count_model` counts by arithmetic without building the model, torch-free (the planner,
`qkstudy validate` / `plan`, the ladder generator): the backbone's formula below plus what
the variant's stages add (`model.contract.Contributions`): its registry entry's
``counts``, or, for a variant registered without them, its own stages built on the meta
device (`Variant.contributions`, torch), never a second count of the whole model.
`count_instantiated` reads the same numbers off the whole model built on the meta device: the
reference tests/model/test_counts.py holds `count_model` to, for every preset, variant and
option grid. This module sits above `model.registry` and `model.gpt`; nothing in `model/`
below it imports it.

Conventions (DESIGN.md, `model.gpt`): N excludes the token embedding, the position table and
the untied LM head; FLOPs are model FLOPs, matmuls only (2 per multiply-add), one forward pass
per token at context T, scores and AV over the full sequence; training = 3 x forward.

Backbone, per layer (d = d_model, no biases): QKV 3d^2 + output d^2 + MLP 8d^2 weights and two
LayerNorm weights 2d; forward FLOPs QKV 6d^2 + output 2d^2 + MLP 16d^2 + scores 2Td + AV 2Td.
Plus the final LayerNorm (d), embeddings (V d + T d), LM head (V d weights, 2 d V FLOPs).
The `model.config.Architecture` options change: SwiGLU 3dh weights and 6dh FLOPs instead of
the MLP's (h = `swiglu_hidden(d)`); QK-norm + 2 head_dim weights per layer; RoPE no position
table (T d fewer in the total); a tied head V d fewer in the total (N excludes the head either
way); RMSNorm nothing (d weights, as LayerNorm's). Norms and RoPE add no model FLOPs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from model.config import swiglu_hidden
from model.registry import get_variant

if TYPE_CHECKING:
    from model.config import ModelConfig

__all__ = ["ModelCounts", "count_instantiated", "count_model"]


class ModelCounts(NamedTuple):
    """Analytic size of a config: N (non-embedding), total parameters, FLOPs per token.
    flops_per_token (training, 3 x forward, model FLOPs) is what budgets use;
    executed_flops_per_token (training, 3 x executed forward) is reported beside it only."""

    n_params: int
    n_params_total: int
    flops_per_token_fwd: int
    flops_per_token: int  # training = 3 x forward
    executed_flops_per_token: int


def count_model(cfg: ModelConfig) -> ModelCounts:
    """Parameter and FLOP counts of `GPT(cfg)` at cfg.seq_len (module docstring), by arithmetic.

    A variant whose registry entry gives no ``counts`` adds what its own stages, built on the
    meta device, hold and compute (`Variant.contributions`, which imports torch)."""
    variant = get_variant(cfg.variant)
    extra = variant.analytic_contributions(cfg)
    if extra is None:
        extra = variant.contributions(cfg)
    L, d, T, V = cfg.n_layer, cfg.d_model, cfg.seq_len, cfg.vocab_size
    mlp_params = 3 * d * swiglu_hidden(d) if cfg.mlp == "swiglu" else 8 * d * d
    qk_norm = 2 * cfg.head_dim if cfg.qk_norm else 0
    n = L * (4 * d * d + mlp_params + 2 * d + qk_norm) + d + extra.n_params
    embeddings = V * d + (T * d if cfg.positions == "learned" else 0) + (0 if cfg.tied_head else V * d)
    base_fwd = L * (8 * d * d + 2 * mlp_params + 4 * T * d) + 2 * d * V  # each MLP weight: one multiply-add per token
    fwd, executed = base_fwd + extra.flops_per_token_fwd, base_fwd + extra.executed_flops_per_token_fwd
    return ModelCounts(n, n + embeddings, fwd, 3 * fwd, 3 * executed)


def count_instantiated(cfg: ModelConfig) -> ModelCounts:
    """Parameter and FLOP counts of `GPT(cfg)` at cfg.seq_len, read off the whole model built on
    the meta device (no weights allocated; milliseconds even at 350m; imports torch): the
    reference `count_model` is tested against."""
    import torch

    from model.gpt import GPT
    from model.init import NoInitOnMeta

    with torch.device("meta"), NoInitOnMeta():
        m = GPT(cfg, seed=0)
    fwd = m.num_flops_per_token()
    return ModelCounts(m.num_params(True), m.num_params(False), fwd, 3 * fwd, 3 * m.num_flops_per_token(executed=True))
