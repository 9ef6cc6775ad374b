"""Scales a study defines itself: inline shapes, ladders by target N, their recipe, N-scaled budgets.

Why: the presets fix both shape and recipe, so a study could not put a scaling statement on
shapes of its own, and bigger presets got fewer steps. This module holds the pure logic the
spec and planner call:

* `ScaleShape`: an inline scale ``{name, n_layer, d_model, n_head, seq_len?}`` with optional
  recipe overrides ``lr`` and ``global_batch``, validated field by field; `shape_problems`
  adds the checks that depend on the study's variants (Differential Attention pairs heads).
  Positions are a learned table (``model.gpt``), not rotary, so head_dim may be odd.
* `LadderSpec` / `generate_ladder`: one shape per target N (non-embedding parameters, counted
  by ``model.count_model``, the planner's N) within ``tolerance`` of it, at a given head_dim,
  as close as the grid allows to a target aspect ratio d_model / n_layer.
* `custom_recipe`: peak learning rate and global batch of a custom scale as functions of N.
* `tokens_per_param_budget`: D = k x N rounded to whole optimizer steps.

Bad input raises `FieldError`, which carries the field path (``loc``) so the spec can name the
file and field. Pure: no Ray, no MLflow, nothing on disk.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from data_pipeline.config import NumbersStrict
from orchestrator.plan.recipe import RECIPES, ScaleRecipe
from orchestrator.plan.specfile import Loc, loc_str

if TYPE_CHECKING:
    from model import ModelConfig

# `model` (torch) is imported inside the functions that count, as in `orchestrator.plan.spec`:
# validating a spec must not pay for importing torch.

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class FieldError(ValueError):
    """Bad input at field path ``loc`` (e.g. ``("scales", 2, "ladder", "targets", 0)``).

    ``str(e)`` is ``"<field path>: <message>"``; ``problem()`` the ``(loc, message)`` pair that
    ``orchestrator.plan.spec`` turns into a SpecError naming the file.
    """

    def __init__(self, loc: Loc, message: str):
        self.loc, self.message = tuple(loc), message
        super().__init__(f"{loc_str(self.loc)}: {message}" if self.loc else message)

    def problem(self) -> tuple[Loc, str]:
        """The ``(field path, message)`` pair."""
        return self.loc, self.message


def check_scale_name(name: str) -> str:
    """``name`` if it may name a custom scale (letters, digits, ``_.-``, at most 64, starting
    alphanumeric; not a preset's name); ValueError saying why not."""
    from model import PRESETS

    if not _NAME_RE.match(name):
        raise ValueError(f"scale name {name!r}: use letters, digits, '_', '.', '-' (at most 64), starting alphanumeric")
    if name in PRESETS:
        raise ValueError(f"{name!r} is a preset's name; give the custom scale a name of its own")
    return name


def whole_steps(tokens: float, tokens_per_step: int, loc: Loc) -> int:
    """Optimizer steps of a token budget: round(tokens / tokens_per_step) (the planner's rounding).

    Raises FieldError at ``loc`` if that is less than one step.
    """
    steps = int(round(tokens / tokens_per_step))
    if steps < 1:
        raise FieldError(loc, f"{tokens:,.0f} tokens is less than one optimizer step ({tokens_per_step:,} tokens)")
    return steps


class Budget(NamedTuple):
    """A token budget in whole optimizer steps: ``tokens == steps * tokens_per_step``."""

    steps: int
    tokens: int


def tokens_per_param_budget(k: float, n_params: int, tokens_per_step: int, loc: Loc = ("budget", "tokens_per_param")) -> Budget:
    """Budget D = k x N tokens (N non-embedding parameters), rounded to whole optimizer steps.

    Chinchilla-style ladders train every scale at one tokens-per-parameter ratio (Hoffmann et
    al. 2022 find ~20 compute-optimal), so bigger models get proportionally more tokens. One
    rounding (of k N / tokens_per_step), not two. Raises FieldError at ``loc`` below one step
    or for k <= 0.
    """
    if not k > 0:
        raise FieldError(loc, f"tokens per parameter must be positive, got {k}")
    steps = whole_steps(k * n_params, tokens_per_step, loc)
    return Budget(steps, steps * tokens_per_step)


class ScaleShape(NumbersStrict):
    """An inline scale: a model shape and, optionally, recipe overrides.

    Fields: name (MLflow's ``scale`` tag; letters, digits, ``_.-``; not a preset's name),
    n_layer, d_model, n_head (head_dim = d_model / n_head), seq_len (training window and model
    context in tokens; default: `custom_recipe`'s), lr (peak AdamW learning rate) and
    global_batch (sequences per optimizer step), both defaulting to `custom_recipe`'s.
    Errors name the field (``n_head``: d_model not divisible by it).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    n_layer: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_head: int = Field(gt=0)
    seq_len: int | None = Field(default=None, gt=0)
    lr: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    global_batch: int | None = Field(default=None, gt=0)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return check_scale_name(v)

    @field_validator("n_head")
    @classmethod
    def _heads_divide(cls, v: int, info: ValidationInfo) -> int:
        d = info.data.get("d_model")
        if d is not None and d % v:
            raise ValueError(f"d_model={d} is not divisible by n_head={v}")
        return v

    @property
    def head_dim(self) -> int:
        """d_model / n_head."""
        return self.d_model // self.n_head

    @property
    def aspect_ratio(self) -> float:
        """d_model / n_layer (width per layer of depth)."""
        return self.d_model / self.n_layer


def shape_problems(shape: ScaleShape, model_variants: list[str], loc: Loc) -> list[tuple[Loc, str]]:
    """Checks of ``shape`` that depend on the study's variants, as (field path, message) pairs.

    A variant with ``paired_heads`` (Differential Attention: n_head/2 differential heads of
    two maps each) needs an even n_head. ``loc`` is the shape's path, e.g. ``("scales", 1)``.
    """
    from model import get_variant

    return [
        (loc + ("n_head",), f"variant {v!r} pairs heads (n_head/2 differential heads): n_head={shape.n_head} must be even")
        for v in dict.fromkeys(model_variants)
        if get_variant(v).paired_heads and shape.n_head % 2
    ]


def shape_config(shape: ScaleShape, variant: str, *, vocab_size: int, seq_len: int | None = None, **variant_options: Any) -> ModelConfig:
    """The ModelConfig of a custom shape and variant (what ``model.build_config`` is for presets).

    seq_len: the model context in tokens (default: the shape's). Raises ValueError if neither
    is given, or naming the bad variant option.
    """
    from model import ModelConfig

    T = seq_len or shape.seq_len
    if T is None:
        raise ValueError(f"scale {shape.name!r}: give seq_len (the planner passes the recipe's)")
    return ModelConfig(
        vocab_size=vocab_size,
        seq_len=T,
        n_layer=shape.n_layer,
        d_model=shape.d_model,
        n_head=shape.n_head,
        variant=variant,
        options=variant_options,
    )


def _parse_count(v: Any) -> Any:
    """500000, 5e5, "5e5", "500k", "2.2M", "1B" -> a number of parameters."""
    if isinstance(v, str):
        m = re.fullmatch(r"\s*([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMbB]?)\s*", v)
        if not m:
            raise ValueError(f"{v!r} is not a parameter count (e.g. 500000, 5e5, 500k, 2.2M)")
        return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9}[m.group(2).lower()]
    return v


class LadderSpec(NumbersStrict):
    """A ladder of scales by target N.

    Fields: targets (N, non-embedding parameters, per rung: numbers or "500k" / "2.2M"),
    head_dim (d_model is a multiple of it, n_head = d_model / head_dim), aspect_ratio (target
    d_model / n_layer), tolerance (largest |N / target - 1|, default 5%), aspect_tolerance
    (largest factor between the shape's and the target aspect ratio, default 2), seq_len
    (of every rung; default `custom_recipe`'s), names (default ``n<target>``, e.g. ``n590k``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    targets: list[float] = Field(min_length=1)
    head_dim: int = Field(gt=0)
    aspect_ratio: float = Field(gt=0, allow_inf_nan=False)
    tolerance: float = Field(default=0.05, gt=0, lt=1)
    aspect_tolerance: float = Field(default=2.0, ge=1, allow_inf_nan=False)
    seq_len: int | None = Field(default=None, gt=0)
    names: list[str] | None = None

    @field_validator("targets", mode="before")
    @classmethod
    def _counts(cls, v: Any) -> Any:
        return [_parse_count(x) for x in v] if isinstance(v, list) else v

    @field_validator("targets")
    @classmethod
    def _targets_ok(cls, v: list[float]) -> list[float]:
        for i, t in enumerate(v):
            if not (math.isfinite(t) and t > 0):
                raise ValueError(f"entry {i} ({t}) is not a positive parameter count")
        if len(set(v)) != len(v):
            raise ValueError("targets repeat")
        return v

    @field_validator("names")
    @classmethod
    def _names_ok(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [check_scale_name(n) for n in v]

    @model_validator(mode="after")
    def _names_match(self) -> LadderSpec:
        if self.names is not None and len(self.names) != len(self.targets):
            raise ValueError(f"names: {len(self.names)} names for {len(self.targets)} targets")
        return self

    def rung_names(self) -> list[str]:
        """The scale name of each rung (``names``, else ``n`` + the target, e.g. ``n2.21M``)."""
        return list(self.names) if self.names is not None else [f"n{_fmt_count(t)}" for t in self.targets]


def _fmt_count(n: float) -> str:
    for suffix, f in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= f:
            return f"{n / f:.3g}{suffix}"
    return f"{n:.3g}"


@dataclass(frozen=True)
class LadderRung:
    """One generated scale: its shape, the target N, the shape's exact N (``model.count_model``
    of the ladder's variant) and the relative error N / target - 1."""

    shape: ScaleShape
    target: float
    n_params: int
    rel_error: float


def non_embedding_params(n_layer: int, d_model: int, n_head: int, variant: str = "standard", options: dict[str, Any] | None = None) -> int:
    """N of a shape, from ``model.count_model`` (embeddings, position table and LM head are
    excluded, so vocabulary and context do not matter; a tiny one keeps it fast)."""
    from model import ModelConfig, count_model

    cfg = ModelConfig(vocab_size=8, seq_len=8, n_layer=n_layer, d_model=d_model, n_head=n_head, variant=variant, options=options or {})
    return count_model(cfg).n_params


def generate_ladder(
    spec: LadderSpec, *, variant: str = "standard", options: dict[str, Any] | None = None, even_heads: bool = False, loc: Loc = ("ladder",)
) -> list[LadderRung]:
    """One shape per target of ``spec`` (in target order).

    Search: d_model = k x head_dim (k even when ``even_heads``, for Differential Attention).
    Every layer has the same parameter count, so N(L, d) = base(d) + L per_layer(d) with
    base and per_layer from two ``count_model`` calls per width; for each width the depths
    L = floor and ceil of (target - base) / per_layer are candidates. Among candidates with
    |N / target - 1| <= tolerance and aspect ratio within aspect_tolerance of the target's,
    the one nearest the target aspect ratio (in log) wins, then the smaller N error; its N is
    recounted exactly (RuntimeError if that breaks the per-layer assumption).
    ``variant``/``options``: the planner's N is the reference variant's.

    Raises FieldError at ``loc + ("targets", i)`` for a target no shape reaches (the message
    gives the nearest shape), or one that yields the same shape as an earlier target.
    """
    counts: dict[int, tuple[int, int]] = {}

    def layer_counts(d: int) -> tuple[int, int]:
        if d not in counts:
            one, two = (non_embedding_params(L, d, d // spec.head_dim, variant, options) for L in (1, 2))
            counts[d] = (2 * one - two, two - one)
        return counts[d]

    rungs: list[LadderRung] = []
    for i, (target, name) in enumerate(zip(spec.targets, spec.rung_names())):
        L, d = _best_shape(spec, target, layer_counts, even_heads, loc + ("targets", i))
        n = non_embedding_params(L, d, d // spec.head_dim, variant, options)
        if n != layer_counts(d)[0] + L * layer_counts(d)[1]:  # test_ladder checks it for every variant
            raise RuntimeError(f"variant {variant!r}: layers differ in parameter count, which the ladder search assumes they do not")
        shape = ScaleShape(name=name, n_layer=L, d_model=d, n_head=d // spec.head_dim, seq_len=spec.seq_len)
        for j, r in enumerate(rungs):
            if (r.shape.n_layer, r.shape.d_model) == (L, d):
                raise FieldError(
                    loc + ("targets", i),
                    f"target {target:,.0f} gives the same shape ({L} x {d}) as "
                    f"targets[{j}] ({r.target:,.0f}): space the targets further apart",
                )
        rungs.append(LadderRung(shape, target, n, n / target - 1))
    return rungs


def _best_shape(
    spec: LadderSpec, target: float, layer_counts: Callable[[int], tuple[int, int]], even_heads: bool, loc: Loc
) -> tuple[int, int]:
    """(n_layer, d_model) of one rung (see `generate_ladder`); FieldError if none qualifies."""
    tried: list[tuple[float, float, int, int, float]] = []  # (|log aspect error|, |N error|, L, d, N error)
    step = 2 if even_heads else 1
    k = step
    while True:
        d = k * spec.head_dim
        base, per = layer_counts(d)
        exact = (target - base) / per
        for L in {max(1, math.floor(exact)), max(1, math.ceil(exact))}:
            err = (base + L * per) / target - 1
            tried.append((abs(math.log(d / L / spec.aspect_ratio)), abs(err), L, d, err))
        if base + per > target * (1 + spec.tolerance):
            break  # one layer of this width is already too big, and wider ones only grow
        k += step
    ok = sorted(t for t in tried if t[1] <= spec.tolerance and t[0] <= math.log(spec.aspect_tolerance))
    if ok:
        return ok[0][2], ok[0][3]
    close = [t for t in tried if t[1] <= spec.tolerance]  # near in N, but too far from the aspect ratio
    near = min(close) if close else min(tried, key=lambda t: (t[1], t[0]))
    aspect = f" at an aspect ratio within {spec.aspect_tolerance:g}x of {spec.aspect_ratio:g}" if close else ""
    raise FieldError(
        loc,
        f"no shape with head_dim {spec.head_dim} has N within {spec.tolerance:.0%} of {target:,.0f}"
        f"{aspect}; nearest: {near[2]} x {near[3]} (N {near[4]:+.1%}, aspect ratio "
        f"{near[3] / near[2]:.3g})",
    )


# -- the recipe of custom scales ------------------------------------------------------------

LR_EXPONENT = -0.2915
"""Exponent b of peak LR = A x N^b (module `custom_recipe`); fitted to the presets."""
LR_COEFFICIENT = {"cpu": 0.1432, "paper": 0.08613}
"""A per batch regime: the CPU presets (16 sequences per step) and the paper presets (512)."""
_REGIMES = {"cpu": ("cpu-xs", "cpu-s", "cpu-m"), "paper": ("60m", "150m", "350m")}


@cache
def preset_params() -> dict[str, int]:
    """N (non-embedding, ``standard``) of every preset that has a recipe."""
    from model import PRESETS, build_config, count_model

    return {p: count_model(build_config(p, "standard")).n_params for p in PRESETS if p in RECIPES}


def custom_recipe(n_params: int, *, lr: float | None = None, global_batch: int | None = None, seq_len: int | None = None) -> ScaleRecipe:
    """Recipe of a custom scale of N non-embedding parameters (overrides win where given).

    The rule follows the presets' own trend, so a custom shape the size of a preset trains
    like it and a ladder interpolates between them:

    * regime: ``cpu`` if N is below the geometric mean of cpu-m's and 60m's N (12.6M), else
      ``paper``; the preset nearest in log N within the regime gives the training window
      (seq_len: 128 tokens for CPU scales, 512 or 1024 for paper scales), the global batch
      (16 / 512 sequences: constant within each regime, as in the presets) and the
      micro-batch ceiling (the preset's, halved for every doubling of N above the preset's N:
      activation memory grows with the model).
    * peak LR = A_regime x N^-0.2915 (A_cpu = 0.1432, A_paper = 0.08613): the least-squares
      fit in log-log of the six presets' LRs against their N with one slope and one intercept
      per batch regime (every preset within 1.3%; ``test_ladder`` refits it). The presets
      follow GPT-3's table at paper scales (Brown et al. 2020, Table 2.1: 6e-4 / 3e-4 at
      125M / 350M). The exponent sits near the -0.25 that DeepSeek LLM's fit implies at a
      fixed tokens-per-parameter ratio (Bi et al. 2024, eq. 1: lr_opt = 0.3118 C^-0.125 with
      C = 6 k N^2); that fit itself is not used because it was made at 1e17-3e20 FLOPs on
      another architecture, three to seven decades above the CPU scales.

    Beyond the presets' range (N < 0.59M or > 277M) the rule extrapolates the power law with
    the end regime's batch (GPT-3 raises the batch to 1M tokens at 760M: override it there).
    Units: lr per AdamW step, global_batch and micro_batch in sequences, seq_len in tokens.
    """
    from model import PRESETS

    if not n_params > 0:
        raise ValueError(f"n_params must be positive, got {n_params}")
    n = preset_params()
    split = math.sqrt(n["cpu-m"] * n["60m"])
    regime = "cpu" if n_params < split else "paper"
    preset = min(_REGIMES[regime], key=lambda p: abs(math.log(n_params / n[p])))
    r = RECIPES[preset]
    batch = global_batch or r.global_batch
    micro = max(1, r.micro_batch >> max(0, math.floor(math.log2(n_params / n[preset]))))  # halved per doubling of N
    return ScaleRecipe(
        seq_len=seq_len or r.seq_len or PRESETS[preset].seq_len,
        global_batch=batch,
        micro_batch=min(micro, batch),
        lr=lr or LR_COEFFICIENT[regime] * n_params**LR_EXPONENT,
    )


def shape_recipe(shape: ScaleShape, n_params: int) -> ScaleRecipe:
    """`custom_recipe` of a shape of N = ``n_params``, with the shape's lr, global_batch and
    seq_len overrides."""
    return custom_recipe(n_params, lr=shape.lr, global_batch=shape.global_batch, seq_len=shape.seq_len)
