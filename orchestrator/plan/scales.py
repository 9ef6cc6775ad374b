"""A study's ``scales:`` list: preset names, inline shapes and ladders, resolved to named scales.

Each entry is one of

* a preset name (``cpu-s``: ``model.PRESETS`` with a recipe in ``orchestrator.plan.recipe``);
* an inline shape ``{name, n_layer, d_model, n_head, seq_len?, lr?, global_batch?}``
  (``orchestrator.plan.ladder.ScaleShape``);
* ``{ladder: {targets, head_dim, aspect_ratio, ...}}`` (``LadderSpec``): one shape per target N.

Why a dispatch before pydantic's own validation: as a plain union, a bad entry would be
reported once per member of the union (``scales[1].str``, ``scales[1].ScaleShape.n_head``,
...). `dispatch_entries` picks the one model an entry is meant for (a string is a preset,
a mapping with ``ladder`` a ladder, any other mapping a shape) and reports that model's
errors at the entry's own path (``scales[1].n_head``).

Checks that need the study's variants run in `resolve_scales`, after the fields validated:
a ladder counts N with the reference variant (the planner's N) and keeps heads even when
a variant pairs heads (Differential Attention); an inline shape with odd heads is refused
for such a variant; names are unique across presets, shapes and rungs; each name becomes one
``orchestrator.plan.scale.ResolvedScale``, what the planner asks. Pure: no Ray, no
MLflow; ``model`` (torch) is imported only where parameters are counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, ValidationError
from pydantic_core import InitErrorDetails

from data_pipeline.config import NumbersStrict
from orchestrator.plan import recipe
from orchestrator.plan.ladder import FieldError, LadderSpec, ScaleShape, generate_ladder, shape_problems
from orchestrator.plan.scale import ResolvedScale
from orchestrator.plan.specfile import Loc, error_details, loc_str, value_error_details


class LadderScale(NumbersStrict):
    """A ``scales:`` entry ``{ladder: {...}}``: the rungs of ``LadderSpec`` become scales named
    by its ``names`` (default ``n<target>``, e.g. ``n590k``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ladder: LadderSpec


ScaleEntry = str | ScaleShape | LadderScale
"""One entry of ``scales:`` after `dispatch_entries`."""


def preset_scales() -> list[str]:
    """Preset names a spec may use: the model presets that have a training recipe."""
    from model import PRESETS

    return [p for p in PRESETS if p in recipe.RECIPES]


def _entry(i: int, x: Any) -> ScaleEntry:
    """Entry ``i`` validated as the one model it is meant for (module docstring)."""
    if isinstance(x, ScaleShape | LadderScale):
        return x
    if isinstance(x, str):
        allowed = preset_scales()
        if x not in allowed:
            raise FieldError(
                (i,),
                f"unknown scale {x!r}; allowed: {', '.join(allowed)} (or an inline shape "
                "{name, n_layer, d_model, n_head} or {ladder: {targets, head_dim, aspect_ratio}})",
            )
        return x
    if isinstance(x, dict):
        return LadderScale.model_validate(x) if "ladder" in x else ScaleShape.model_validate(x)
    raise FieldError((i,), f"expected a preset name, an inline shape {{name, n_layer, d_model, n_head}} or {{ladder: {{...}}}}, got {x!r}")


def dispatch_entries(v: Any) -> Any:
    """The body of ``Study``'s before-validator of ``scales``: each entry validated as a preset
    name, a `ScaleShape` or a `LadderScale`.

    Raises:
        ValidationError: every bad entry's errors, at paths relative to the list
            (``(1, "n_head")``; pydantic prefixes the field).
    """
    if not isinstance(v, list):
        return v  # pydantic's own "Input should be a valid list"
    out: list[Any] = []
    details: list[InitErrorDetails] = []
    for i, x in enumerate(v):
        try:
            out.append(_entry(i, x))
        except FieldError as e:
            details.append(value_error_details(e.loc, e.message, x))
        except ValidationError as e:
            details.extend(error_details(e, prefix=(i,)))
    if details:
        raise ValidationError.from_exception_data("scales", details)
    return out


@dataclass(frozen=True)
class ResolvedScales:
    """A study's scales in spec order: ``names`` (presets, shapes and ladder rungs), each name's
    `ResolvedScale` in ``scales`` (the first entry of a name given twice), and ``problems`` as
    (field path, message) pairs."""

    names: list[str] = field(default_factory=list)
    scales: dict[str, ResolvedScale] = field(default_factory=dict)
    problems: list[tuple[Loc, str]] = field(default_factory=list)


def resolve_scales(
    entries: list[ScaleEntry], model_variants: list[str], reference_variant: str, reference_options: dict[str, Any]
) -> ResolvedScales:
    """Every validated ``scales:`` entry resolved to `ResolvedScale` objects (`ResolvedScales`).

    Args:
        entries: the dispatched entries (`dispatch_entries`).
        model_variants: every arm's ``model.VARIANTS`` name (for paired heads).
        reference_variant, reference_options: the reference arm's model variant and options:
            a ladder's and a custom recipe's N is counted with them (the planner's N is the
            reference's).

    Problems reported (not raised): a ladder target no shape reaches or two targets giving
    one shape (``scales[i].ladder.targets[j]``), odd heads for a variant that pairs heads
    (``scales[i].n_head``), a name used twice (``scales[i].name``, ``scales[i]`` for a preset,
    ``scales[i].ladder.names[j]`` / ``.targets[j]`` for a rung).
    """
    from model import get_variant

    out = ResolvedScales()
    even = any(get_variant(v).paired_heads for v in model_variants)
    where: dict[str, Loc] = {}

    def add(name: str, loc: Loc) -> None:
        if name in where:
            out.problems.append((loc, f"scale {name!r} is already given at {loc_str(where[name])}: scale names must be unique"))
        else:
            where[name] = loc
            out.names.append(name)

    for i, e in enumerate(entries):
        loc: Loc = ("scales", i)
        if isinstance(e, str):
            add(e, loc)
            out.scales.setdefault(e, ResolvedScale.preset(e))
        elif isinstance(e, ScaleShape):
            bad = shape_problems(e, model_variants, loc)
            out.problems.extend(bad)
            add(e.name, loc + ("name",))
            if not bad:  # a shape a variant refuses cannot be counted; the study fails on `bad`
                out.scales.setdefault(e.name, ResolvedScale.custom(e, reference_variant, reference_options))
        else:
            try:
                rungs = generate_ladder(
                    e.ladder, variant=reference_variant, options=reference_options, even_heads=even, loc=loc + ("ladder",)
                )
            except FieldError as err:
                out.problems.append(err.problem())
                continue
            for j, r in enumerate(rungs):
                add(r.shape.name, loc + ("ladder", "names" if e.ladder.names is not None else "targets", j))
                out.scales.setdefault(r.shape.name, ResolvedScale.custom(r.shape, reference_variant, reference_options, rung=r))
    return out
