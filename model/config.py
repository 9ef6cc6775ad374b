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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from model.registry import ARCHITECTURE_FIELDS, CONFIG_FIELDS, VARIANTS, get_variant, resolve_options

__all__ = ["VARIANTS", "Architecture", "ModelConfig"]


class Architecture(BaseModel):
    """The backbone's layout, common to every variant of a study; the defaults are GPT-2's
    (learned positions, pre-LayerNorm, 4x GELU MLP, untied head). The modern recipe
    (LLaMA-style; `jobs/base/modern.yaml`) turns on each of:

    positions: "learned" (a [seq_len, d_model] table added to the token embedding) or "rope"
        (rotary positions, Su et al. 2021, on q and k [B, T, n_head, head_dim], base
        ``rope_base``; no parameters, no model FLOPs: elementwise).
    rope_at: where RoPE sits relative to the variant's QK transform: "after_transform" (the
        transform sees position-free q, k; scoring sees rotated ones) or "before_transform".
    norm: "layernorm" (no bias) or "rmsnorm" (Zhang & Sennrich 2019); both d_model weights.
    mlp: "gelu" (d -> 4d -> d) or "swiglu" (Shazeer 2020: silu(x W_g) * (x W_u) W_o, hidden h
        = 8d/3 rounded to a multiple of 8, i.e. 8 round(d/3): its 3 d h weights are GELU's
        8 d^2 within 1/d (+0.8% at d = 128, +0.2% at 512; LLaMA rounds up to a multiple of
        256 instead, which at d = 128 would add half the MLP).
    qk_norm: RMSNorm over head_dim of q and of k right after the projection (Dehghani et al.
        2023; one head_dim weight each per layer, shared by the heads).
    tied_head: the LM head is the token embedding (one V x d_model weight).

    Raises pydantic.ValidationError for an unknown value, or rope_base / rope_at given
    without positions "rope".
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    positions: Literal["learned", "rope"] = "learned"
    rope_base: float = Field(default=10_000.0, gt=1)
    rope_at: Literal["after_transform", "before_transform"] = "after_transform"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    mlp: Literal["gelu", "swiglu"] = "gelu"
    qk_norm: bool = False
    tied_head: bool = False

    @model_validator(mode="after")
    def _rope_fields_need_rope(self) -> Architecture:
        moved = [f for f in ("rope_base", "rope_at") if getattr(self, f) != Architecture.model_fields[f].default]
        if self.positions != "rope" and moved:
            raise ValueError(f'{" and ".join(moved)} apply to positions: "rope" only')
        return self

    def architecture(self) -> Architecture:
        """These fields alone (a ModelConfig's backbone layout)."""
        return Architecture(**{f: getattr(self, f) for f in ARCHITECTURE_FIELDS})


def swiglu_hidden(d_model: int) -> int:
    """The SwiGLU MLP's hidden width at d_model: 8 round(d_model / 3) (`Architecture`)."""
    return 8 * ((d_model + 1) // 3)  # d/3 is never halfway between integers: (d + 1) // 3 rounds it


class ModelConfig(Architecture):
    """Decoder-only transformer; its backbone layout is `Architecture`'s fields (default GPT-2:
    pre-LayerNorm, learned positions, untied head).

    Fields (units in brackets):
        vocab_size: tokens in the vocabulary.
        seq_len: maximum context length [tokens]; size of the learned position table.
        n_layer, d_model, n_head: depth, width, attention heads; head_dim = d_model / n_head.
        variant: a name in `VARIANTS` (`model.registry`).
        options: the variant's options with defaults filled in (see its registry entry);
            given either as options={...} or flat as keyword arguments.
        positions, rope_base, rope_at, norm, mlp, qk_norm, tied_head: `Architecture`. Left
            out of ``model_dump`` at their defaults, so a GPT-2-layout config dumps (and its
            runs are identified) as before these fields existed.

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
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"positions rope rotates pairs of channels: head_dim={self.head_dim} must be even")
        if get_variant(self.variant).paired_heads and self.n_head % 2:
            raise ValueError(f"variant {self.variant!r} splits heads into pairs: n_head={self.n_head} must be even")
        return self

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        options = data.pop("options", {})
        defaults = {f: Architecture.model_fields[f].default for f in ARCHITECTURE_FIELDS}
        return {**{k: v for k, v in data.items() if not (k in defaults and v == defaults[k])}, **options}

    def __hash__(self) -> int:  # options is a dict: hash the canonical flat form (frozen, so stable)
        return hash(json.dumps(self.model_dump(), sort_keys=True))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head
