"""Training recipe defaults derived from the scale.

A study names only what it varies; everything else comes from here. The table is the
documented recipe: per scale a sequence length, a global batch (sequences per optimizer
step) and a peak learning rate. The shape follows common GPT practice (nanoGPT / the
Chinchilla-style ladders of OLMo): smaller models take larger learning rates; warmup is a
fixed fraction of the optimizer steps; cosine decays to ``min_lr_ratio`` of the peak.

CPU scales are sized so that a run of a few hundred optimizer steps takes a minute or two on
one core: 128-token windows (shorter than cpu-s / cpu-m's 256-token preset context, for
speed). The paper scales train at their preset's context (60m: 512; 150m, 350m: 1024) with
512 sequences per step (0.26M / 0.5M tokens), a GPT-2-small-like setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ScaleRecipe:
    """Defaults for one scale.

    Attributes:
        seq_len: tokens per training window; None: the model preset's context length.
        global_batch: sequences per optimizer step (all workers, all micro-batches).
        micro_batch: largest per-worker micro-batch (sequences) before gradient accumulation
            kicks in; memory bound, so it is a ceiling, not a target.
        lr: peak learning rate of AdamW.
    """

    seq_len: int | None
    global_batch: int
    micro_batch: int
    lr: float


RECIPES: dict[str, ScaleRecipe] = {
    "cpu-xs": ScaleRecipe(seq_len=None, global_batch=16, micro_batch=16, lr=3e-3),
    "cpu-s": ScaleRecipe(seq_len=128, global_batch=16, micro_batch=16, lr=2e-3),
    "cpu-m": ScaleRecipe(seq_len=128, global_batch=16, micro_batch=16, lr=1.5e-3),
    "60m": ScaleRecipe(seq_len=None, global_batch=512, micro_batch=32, lr=6e-4),
    "150m": ScaleRecipe(seq_len=None, global_batch=512, micro_batch=16, lr=4e-4),
    "350m": ScaleRecipe(seq_len=None, global_batch=512, micro_batch=8, lr=3e-4),
}

# Defaults of every scale (a spec's ``train:`` section overrides them; ``TrainSpec`` takes
# its defaults from here). ``DECAY_FRACTION``: the share of steps the ``wsd`` schedule spends
# in its final linear decay (Hägele et al. 2024 find ~20% matches cosine).
SCHEDULE: Final = "cosine"
WARMUP_FRACTION = 0.05
MIN_LR_RATIO = 0.1
DECAY_FRACTION = 0.2
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0


def recipe_for(scale: str) -> ScaleRecipe:
    """Return the recipe of ``scale``; raises KeyError naming the known scales."""
    try:
        return RECIPES[scale]
    except KeyError:
        raise KeyError(f"no training recipe for scale {scale!r}; known: {sorted(RECIPES)}") from None
