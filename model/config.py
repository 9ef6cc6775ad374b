"""Model configuration: one validated, immutable record per model.

Every number that changes the parameter or FLOP count lives here, so a config (plus a
seed) fully determines a model. Build configs from a named preset with
`model.presets.build_config`; construct `ModelConfig` directly only in tests.

A variant's options (e.g. coupled's `integrator`, `n_steps`) are validated by the variant's
entry in `model.registry` and stored, every default filled in, in `options`. They travel
flat: `ModelConfig(variant="coupled", n_steps=3)` is accepted and `model_dump()` puts them
beside the shape fields, so `ModelConfig(**cfg.model_dump()) == cfg` and MLflow params
read `model.n_steps`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from model.registry import CONFIG_FIELDS, VARIANTS, get_variant, resolve_options

__all__ = ["VARIANTS", "ModelConfig"]


class ModelConfig(BaseModel):
    """Decoder-only transformer (GPT-2 layout: pre-LayerNorm, learned positions, untied head).

    Fields (units in brackets):
        vocab_size: tokens in the vocabulary.
        seq_len: maximum context length [tokens]; size of the learned position table.
        n_layer, d_model, n_head: depth, width, attention heads; head_dim = d_model / n_head.
        variant: a name in `VARIANTS` (`model.registry`).
        options: the variant's options with defaults filled in (see its registry entry);
            given either as options={...} or flat as keyword arguments.

    Raises pydantic.ValidationError (a ValueError) naming the offending field: an unknown
    variant or option lists the allowed ones.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    vocab_size: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    n_layer: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_head: int = Field(gt=0)
    variant: str = "standard"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _resolve_options(cls, data: Any) -> Any:
        """Collect flat option keywords into `options` and validate them with the registry."""
        if not isinstance(data, dict):
            return data
        out = {k: v for k, v in data.items() if k in CONFIG_FIELDS}
        flat = {k: v for k, v in data.items() if k not in CONFIG_FIELDS}
        out["options"] = resolve_options(out.get("variant", "standard"), {**(out.get("options") or {}), **flat})
        return out

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if get_variant(self.variant).paired_heads and self.n_head % 2:
            raise ValueError(f"variant {self.variant!r} splits heads into pairs: n_head={self.n_head} must be even")
        return self

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        return {**{k: v for k, v in data.items() if k != "options"}, **data.get("options", {})}

    def __hash__(self) -> int:  # options is a dict: hash the canonical flat form (frozen, so stable)
        return hash(json.dumps(self.model_dump(), sort_keys=True))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head
