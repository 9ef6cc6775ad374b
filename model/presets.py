"""Named model scales and `build_config`, the one way specs turn (scale, variant) into a config.

Paper scales (arXiv 2604.01683 reports 60M, 150M, 350M; its shapes are not stated, these are
ours, head_dim 64, 32,000-token vocabulary, untied head, totals for `standard`):

| preset | n_layer | d_model | n_head | seq_len | N (non-emb.) | total  |
|--------|---------|---------|--------|---------|--------------|--------|
| 60m    | 8       | 512     | 8      | 512     | 25.2M        | 58.2M  |
| 150m   | 14      | 768     | 12     | 1024    | 99.1M        | 149.1M |
| 350m   | 22      | 1024    | 16     | 1024    | 276.9M       | 343.4M |

Coupled at 60m (one shared f per layer, hidden = head_dim = 64, plus 8 dt per layer) adds
8 x (2*64*64 + 2*64 + 8) = 66,624 parameters: +0.114% of the total (58.2M), +0.265% of N;
the paper reports +0.11%, which is how the per-layer sharing default was inferred.

CPU scales (head_dim 32, train in minutes on a laptop; N for `standard`):
cpu-xs 3 x 128 (4 heads, T 128, N 0.59M), cpu-s 5 x 192 (6 heads, T 256, N 2.2M),
cpu-m 8 x 256 (8 heads, T 256, N 6.3M).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.config import Architecture, ModelConfig
from model.registry import resolve_options

DEFAULT_VOCAB_SIZE = 32_000


@dataclass(frozen=True)
class Preset:
    """Shape of a named scale; `nominal` is the advertised size (total params for paper
    scales, non-embedding N for CPU scales)."""

    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    nominal: str


PRESETS: dict[str, Preset] = {
    "cpu-xs": Preset(3, 128, 4, 128, "~0.5M non-embedding"),
    "cpu-s": Preset(5, 192, 6, 256, "~2M non-embedding"),
    "cpu-m": Preset(8, 256, 8, 256, "~6M non-embedding"),
    "60m": Preset(8, 512, 8, 512, "60M total"),
    "150m": Preset(14, 768, 12, 1024, "150M total"),
    "350m": Preset(22, 1024, 16, 1024, "350M total"),
}


def build_config(
    scale: str,
    variant: str,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seq_len: int | None = None,
    architecture: Architecture | None = None,
    **variant_options: Any,
) -> ModelConfig:
    """Config for a preset scale and variant.

    Args:
        scale: a key of `PRESETS`.
        variant: a name in `VARIANTS` (`model.registry`).
        vocab_size: tokens in the tokenizer's vocabulary (presets assume 32,000).
        seq_len: context length in tokens (default: the preset's).
        architecture: the backbone's layout (default GPT-2's, `model.config.Architecture`).
        variant_options: options of the variant's registry entry, e.g. integrator="leapfrog",
            n_steps=3 (`Variant.allowed()` lists them with their defaults).

    Raises ValueError naming the bad scale, variant or option and the allowed values.
    """
    if scale not in PRESETS:
        raise ValueError(f"unknown scale {scale!r}; allowed: {', '.join(PRESETS)}")
    options = resolve_options(variant, variant_options)  # plain ValueError before pydantic's
    p = PRESETS[scale]
    return ModelConfig(
        vocab_size=vocab_size,
        seq_len=seq_len or p.seq_len,
        n_layer=p.n_layer,
        d_model=p.d_model,
        n_head=p.n_head,
        variant=variant,
        options=options,
        **(architecture or Architecture()).model_dump(),
    )
