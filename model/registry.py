"""Variant registry: the one table that turns a variant name into model code.

Attention is query input -> projection -> QK transform -> scoring -> output projection
(`model.attention`); a variant swaps the query input, the QK transform, the scoring kernel, or
several. Each variant is one `Variant` entry: its name, the factories of the stages it swaps
(None keeps standard attention's: `IdentityQuery`, `IdentityQK`, `SDPAScoring`), the options it accepts with their types and defaults (a
pydantic model), and whether it pairs heads. Adding a variant is one module holding its
stages plus one `register(Variant(...))` (built-ins: the calls at the end of this file);
config validation, `build_config`, the attention layer and the counts all read this table.

The stage contract (shapes, what a factory reads, what a stage reports) is `model.contract`:
factories and counts take its `StageConfig`, which `model.config.ModelConfig` satisfies. An
entry's `counts(cfg)` gives the stages' contributions by arithmetic (`model.stage_counts`,
torch-free: what the planner uses; tests/model/test_registry.py checks them against the
built stages). Whole-model counts (`model.counts`) sit above this table: they add the
entry's counts, or `Variant.contributions` where it gives none, to the backbone's.
Stage factories are named lazily (`lazy("module:function")`), so this table imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from model.contract import Contributions, Stage, StageConfig
from model.options import CoupledOptions, DynamicsOptions, NonlinearQOptions
from model.stage_counts import coupled_counts, coupled_differential_counts, differential_counts, nonlinear_q_counts, uncoupled_counts

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "ARCHITECTURE_FIELDS",
    "CONFIG_FIELDS",
    "REGISTRY",
    "VARIANTS",
    "Variant",
    "get_variant",
    "register",
    "resolve_options",
    "stage_flops",
]

# model.config.Architecture's fields (the backbone's layout), part of every ModelConfig
ARCHITECTURE_FIELDS = ("positions", "rope_base", "rope_at", "norm", "mlp", "qk_norm", "tied_head")
# ModelConfig's own fields: options may not reuse these names (they travel flat beside them).
CONFIG_FIELDS = frozenset({"vocab_size", "seq_len", "n_layer", "d_model", "n_head", "variant", "options", *ARCHITECTURE_FIELDS})


class NoOptions(BaseModel):
    """The options of a variant that takes none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Variant:
    """One attention variant (module docstring).

    query_input(cfg), qk_transform(cfg) and scoring(cfg, depth) build the swapped stages
    (depth = 0-based layer index); options is a pydantic model whose fields are the accepted options and defaults.
    paired_heads: the variant groups heads in pairs, so n_head must be even.
    counts(cfg): what the stages add to standard attention over all layers, by arithmetic
    (`model.stage_counts`; torch-free, what the planner uses); None: counted on the built stages.
    """

    name: str
    summary: str
    options: type[BaseModel] = NoOptions
    qk_transform: Callable[[StageConfig], nn.Module] | None = None
    scoring: Callable[[StageConfig, int], nn.Module] | None = None
    paired_heads: bool = False
    counts: Callable[[StageConfig], Contributions] | None = None
    query_input: Callable[[StageConfig], nn.Module] | None = None

    def make_query_input(self, cfg: StageConfig) -> nn.Module:
        """The variant's query-input stage for cfg (`IdentityQuery` if it keeps standard's)."""
        from model.query import IdentityQuery

        return IdentityQuery() if self.query_input is None else self.query_input(cfg)

    def make_qk_transform(self, cfg: StageConfig) -> nn.Module:
        """The variant's QK transform for cfg (`IdentityQK` if it keeps standard's)."""
        from model.coupled import IdentityQK

        return IdentityQK() if self.qk_transform is None else self.qk_transform(cfg)

    def make_scoring(self, cfg: StageConfig, depth: int) -> nn.Module:
        """The variant's scoring kernel for layer depth (`SDPAScoring` if it keeps standard's)."""
        from model.scoring import SDPAScoring

        return SDPAScoring(cfg.d_model, cfg.n_head) if self.scoring is None else self.scoring(cfg, depth)

    def analytic_contributions(self, cfg: StageConfig) -> Contributions | None:
        """`counts(cfg)` (zero for a variant that swaps no stage), or None when the variant
        swaps a stage and gives no counts (then only `contributions` can tell)."""
        if self.query_input is None and self.qk_transform is None and self.scoring is None:
            return Contributions(0, 0, 0)
        return self.counts(cfg) if self.counts is not None else None

    def allowed(self) -> str:
        """'name=default, ...' of the accepted options ('none' if there are none)."""
        fields = self.options.model_fields
        return ", ".join(f"{k}={f.default!r}" for k, f in fields.items()) or "none"

    def contributions(self, cfg: StageConfig) -> Contributions:
        """Parameters and forward FLOPs per token (at cfg.seq_len) that this variant's stages
        add to standard attention, summed over cfg.n_layer layers (stages built on meta: torch)."""
        import torch

        from model.init import NoInitOnMeta
        from model.scoring import SDPAScoring

        T, base = cfg.seq_len, SDPAScoring(cfg.d_model, cfg.n_head).num_flops_per_token(cfg.seq_len)
        n = flops = executed = 0
        with torch.device("meta"), NoInitOnMeta():
            for depth in range(cfg.n_layer):
                stages = (self.make_query_input(cfg), self.make_qk_transform(cfg), self.make_scoring(cfg, depth))
                n += sum(p.numel() for s in stages for p in s.parameters())
                flops += sum(stage_flops(s, T) for s in stages) - base
                executed += sum(stage_flops(s, T, executed=True) for s in stages) - base
        return Contributions(n, flops, executed)


def stage_flops(stage: nn.Module, seq_len: int, executed: bool = False) -> int:
    """A stage's forward FLOPs per token: model FLOPs, or (executed=True) what its kernel runs
    (`executed_flops_per_token` where the stage defines it, else its model FLOPs)."""
    count = getattr(stage, "executed_flops_per_token", None) if executed else None
    return int((count or cast(Stage, stage).num_flops_per_token)(seq_len))


REGISTRY: dict[str, Variant] = {}
VARIANTS = REGISTRY.keys()
"""Names of the registered variants, in registration order (a live view of `REGISTRY`)."""


def register(variant: Variant) -> Variant:
    """Add a variant to the registry and return it.

    Raises ValueError if the name is taken or an option reuses a ModelConfig field name.
    """
    if variant.name in REGISTRY:
        raise ValueError(f"variant {variant.name!r} is already registered")
    clash = sorted(CONFIG_FIELDS & set(variant.options.model_fields))
    if clash:
        raise ValueError(f"variant {variant.name!r}: option(s) {', '.join(clash)} reuse ModelConfig field names")
    REGISTRY[variant.name] = variant
    return variant


def get_variant(name: str) -> Variant:
    """The registered variant called name; ValueError naming the allowed names otherwise."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown variant {name!r}; allowed: {', '.join(REGISTRY)}") from None


def resolve_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The variant's options with every default filled in, validated by its options model.

    Raises ValueError naming the variant, the bad option and the allowed options (unknown
    name) or the expected values (bad value, e.g. n_steps=8: "less than or equal to 7").
    """
    variant = get_variant(name)
    bad = sorted(set(options) - set(variant.options.model_fields))
    if bad:
        raise ValueError(f"option(s) {', '.join(bad)} not valid for variant {name!r}; allowed: {variant.allowed()}")
    try:
        return variant.options(**options).model_dump()
    except ValidationError as e:
        problems = "; ".join(f"option {'.'.join(map(str, err['loc']))}: {err['msg']} (got {err['input']!r})" for err in e.errors())
        raise ValueError(f"variant {name!r}: {problems}") from None


def lazy(path: str) -> Callable[..., Any]:
    """A stage factory named "module:function", imported on its first call, so the table (and
    config validation, the planner) loads no torch until a model is built."""
    module, name = path.split(":")

    def make(*args: Any) -> Any:
        return getattr(import_module(module), name)(*args)

    make.__qualname__ = make.__name__ = path
    return make


_COUPLED, _DIFFERENTIAL = lazy("model.coupled:coupled_qk"), lazy("model.scoring:differential_scoring")
register(Variant("standard", "softmax attention through fused SDPA"))
register(
    Variant("coupled", "coupled QK dynamics (Euler or leapfrog), then SDPA", CoupledOptions, qk_transform=_COUPLED, counts=coupled_counts)
)
register(
    Variant(
        "uncoupled_mlp",
        "control: q' = q + dt * f(q), k unchanged, then SDPA",
        DynamicsOptions,
        qk_transform=lazy("model.coupled:uncoupled_qk"),
        counts=uncoupled_counts,
    )
)
register(
    Variant(
        "differential",
        "Differential Attention (A1 - lambda * A2 over head pairs)",
        scoring=_DIFFERENTIAL,
        paired_heads=True,
        counts=differential_counts,
    )
)
register(
    Variant(
        "coupled_differential",
        "coupled QK dynamics, then differential scoring",
        CoupledOptions,
        qk_transform=_COUPLED,
        scoring=_DIFFERENTIAL,
        paired_heads=True,
        counts=coupled_differential_counts,
    )
)
register(
    Variant(
        "nonlinear_q",
        "control: W_Q reads x + f(x), f a bottleneck MLP (zero at init), then SDPA",
        NonlinearQOptions,
        counts=nonlinear_q_counts,
        query_input=lazy("model.query:nonlinear_query"),
    )
)
