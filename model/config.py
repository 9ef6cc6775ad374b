"""Model configuration: one validated, immutable record per model.

Every number that changes the parameter or FLOP count lives here, so a config
(plus a seed) fully determines a model. Build configs from a named preset with
`model.presets.build_config`; construct `ModelConfig` directly only in tests.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

VARIANTS: tuple[str, ...] = (
    "standard",
    "coupled",
    "uncoupled_mlp",
    "differential",
    "coupled_differential",
)
"""Attention variants selectable by name in a study spec."""

Variant = Literal["standard", "coupled", "uncoupled_mlp", "differential", "coupled_differential"]


class ModelConfig(BaseModel):
    """Decoder-only transformer (GPT-2 layout: pre-LayerNorm, learned positions, untied head).

    Fields (units in brackets):
        vocab_size: tokens in the vocabulary.
        seq_len: maximum context length [tokens]; size of the learned position table.
        n_layer, d_model, n_head: depth, width, attention heads; head_dim = d_model / n_head.
        variant: one of `VARIANTS`.
        integrator: "euler" or "leapfrog" (coupled variants only).
        n_steps: integration steps of the QK transform, 1..7 (coupled and uncoupled_mlp).
        coupling_hidden: hidden width of the coupling MLP f; None means head_dim.
        coupling_sharing: "layer" (one f shared by the layer's heads) or "head" (one f per head).
        dt_init: initial value of the learned per-head step dt.

    Raises pydantic.ValidationError (a ValueError) naming the offending field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    vocab_size: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    n_layer: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_head: int = Field(gt=0)
    variant: Variant = "standard"
    integrator: Literal["euler", "leapfrog"] = "euler"
    n_steps: int = Field(default=1, ge=1, le=7)
    coupling_hidden: int | None = Field(default=None, gt=0)
    coupling_sharing: Literal["layer", "head"] = "layer"
    dt_init: float = 0.1

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.variant in ("differential", "coupled_differential") and self.n_head % 2:
            raise ValueError(
                f"variant {self.variant!r} splits heads into pairs: n_head={self.n_head} must be even"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def hidden(self) -> int:
        """Hidden width of the coupling MLP f (defaults to head_dim)."""
        return self.coupling_hidden or self.head_dim
