"""`model_info`: analytic size of a (preset, variant) next to a FlopCounterMode measurement.

The measurement runs one real forward and backward pass of the model (random weights and
tokens, batch 1, float32, on CPU) under `torch.utils.flop_counter.FlopCounterMode` and
divides the counted FLOPs by the tokens in the batch. It runs with SDPA forced onto its
math backend: FlopCounterMode has no formula for the CPU flash kernel
(`aten._scaled_dot_product_flash_attention_for_cpu` counts 0 FLOPs in torch 2.13), while
the math backend decomposes into `bmm` ops that it counts exactly, over the full (unmasked)
T x T sequence as the analytic convention does. Backward matmuls count twice the forward,
so the measurement is directly comparable with analytic training FLOPs (3 x forward).
It measures what the kernels execute, so it is compared with the executed count
(`ModelCounts.executed_flops_per_token`); that equals the model-FLOP count except where a
stage documents the difference (Differential's fused AV, `model.scoring`).

`check_flop_delta` is the cross-check that can catch a wrong variant count: at a small
vocabulary the LM head no longer dominates, and the variant-minus-standard difference
(measured vs analytic) isolates exactly what the variant adds; matmul FLOPs are integers, so
the two agree exactly when the count is right.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from model.config import ModelConfig
from model.counts import count_model
from model.gpt import GPT
from model.presets import DEFAULT_VOCAB_SIZE, PRESETS, build_config


def measure_flops_per_token(cfg: ModelConfig, seq_len: int | None = None, seed: int = 0) -> float:
    """Training FLOPs per token counted by FlopCounterMode over one forward + backward pass
    of `GPT(cfg)` on one random sequence of seq_len tokens (default cfg.seq_len)."""
    T = seq_len or cfg.seq_len
    torch.manual_seed(seed)  # the tokens
    model = GPT(cfg, seed=seed)
    idx = torch.randint(0, cfg.vocab_size, (1, T))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        _, loss = model(idx, targets=idx)
        loss.backward()
    return counter.get_total_flops() / T


def model_info(preset: str, variant: str, seq_len: int | None = None, vocab_size: int | None = None, **variant_options: Any) -> dict:
    """Sizes of a preset/variant (what `qkstudy model info --json` prints).

    Returns keys preset, variant, seq_len, vocab_size, n_params (N, non-embedding),
    n_params_total, flops_per_token (analytic training model FLOPs per token at seq_len, what
    budgets use), executed_flops_per_token (analytic, what the kernels run) and
    flops_per_token_measured (FlopCounterMode, see module docstring).
    Raises ValueError for an unknown preset, variant or option (see `build_config`).
    Runs a real forward + backward: milliseconds at cpu-xs, tens of seconds at 350m, T=1024.
    """
    if preset not in PRESETS:  # checked here too, so the error precedes any work
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    cfg = build_config(preset, variant, vocab_size=vocab_size or DEFAULT_VOCAB_SIZE, seq_len=seq_len, **variant_options)
    counts = count_model(cfg)
    return {
        "preset": preset,
        "variant": variant,
        "seq_len": cfg.seq_len,
        "vocab_size": cfg.vocab_size,
        "n_params": counts.n_params,
        "n_params_total": counts.n_params_total,
        "flops_per_token": counts.flops_per_token,
        "executed_flops_per_token": counts.executed_flops_per_token,
        "flops_per_token_measured": measure_flops_per_token(cfg),
    }


class FlopDelta(NamedTuple):
    """Variant-minus-standard training FLOPs per token: measured (FlopCounterMode) and
    analytic (executed count); ok when they agree within rel_tol (of the analytic delta,
    at least 1 FLOP)."""

    measured: float
    analytic: int
    rel_tol: float

    @property
    def ok(self) -> bool:
        return abs(self.measured - self.analytic) <= self.rel_tol * max(abs(self.analytic), 1)


def check_flop_delta(cfg: ModelConfig, rel_tol: float = 1e-6) -> FlopDelta:
    """Compare what cfg's variant adds to standard attention, measured vs analytic.

    Both models have cfg's shape and seq_len; the analytic side is `count_model`'s executed
    training FLOPs, so a count that drops or miscounts the variant's work (e.g. one
    evaluation of f too few) makes `.ok` False. Use a small vocab_size (the LM head is
    common to both and cancels, but dominates the totals). Runs two forward + backward passes.
    """
    std = cfg.model_copy(update={"variant": "standard", "options": {}})
    measured = measure_flops_per_token(cfg) - measure_flops_per_token(std)
    analytic = count_model(cfg).executed_flops_per_token - count_model(std).executed_flops_per_token
    return FlopDelta(measured, analytic, rel_tol)
