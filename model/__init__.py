"""model: the study's attention variants as one pure-PyTorch, single-device GPT.

Attention is query input -> projection -> QK transform -> scoring kernel, so a variant swaps
a stage and keeps the fused SDPA path: `standard` (identity + SDPA), `coupled` (coupled QK
dynamics, Euler or leapfrog), `uncoupled_mlp` (q-only MLP control), `differential`
(Differential Attention), `coupled_differential` (both) and `nonlinear_q` (W_Q reads x + f(x),
the nonlinear-query control of arXiv 2603.13381). Each variant is one entry of
`model.registry` (its stages, options and defaults); adding one is a module plus a
`register` call, in this repository or outside it (`model.plugins`; `model.check` holds any
variant to the built-ins' guarantees). The backbone is GPT-2's unless the config's
`Architecture` swaps in RoPE, RMSNorm, SwiGLU, QK-norm or a tied head (`model.layers`).
Every module reports its parameters and `num_flops_per_token(seq_len)` (model FLOPs, the
definition's); the model sums them, and `model.info` cross-checks the sum against torch's
FlopCounterMode. The same seed gives every variant the same backbone weights (`model.init`).
Configs, presets, the registry and the counts (`model.counts`) import no torch; `GPT` loads it
on first use. No distributed code lives here.
"""

from typing import Any

from model.config import VARIANTS, Architecture, ModelConfig
from model.counts import ModelCounts, count_model
from model.presets import PRESETS, build_config
from model.registry import REGISTRY, Variant, get_variant, register

__all__ = [
    "Architecture",
    "GPT",  # noqa: F822 - loaded by __getattr__ on first use, so importing model loads no torch
    "ModelConfig",
    "ModelCounts",
    "PRESETS",
    "REGISTRY",
    "VARIANTS",
    "Variant",
    "build_config",
    "count_model",
    "get_variant",
    "register",
]


def __getattr__(name: str) -> Any:
    # GPT (torch) loads on first use (PEP 562): configs, presets and counts are torch-free,
    # so `qkstudy validate` / `plan` import no torch.
    if name == "GPT":
        from model.gpt import GPT

        return GPT
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
