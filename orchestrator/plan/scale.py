"""One scale of a study, resolved once: shape, recipe, N and model config in one object.

Why: a scale is a preset name, an inline shape or a ladder rung, and each answers the same
questions differently (a preset from ``model.PRESETS`` and the recipe table in
``orchestrator.plan.recipe``; a custom shape from ``orchestrator.plan.ladder``, its recipe a
function of its N). `ResolvedScale` settles which when the spec is validated
(``orchestrator.plan.scales.resolve_scales``), so the planner and its callers ask one object
and never branch on the kind of scale themselves. Pure: no Ray, no MLflow; ``model``
imports no torch for configs and counts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from orchestrator.plan.ladder import LadderRung, ScaleShape, non_embedding_params, shape_config, shape_recipe
from orchestrator.plan.recipe import ScaleRecipe, recipe_for

if TYPE_CHECKING:
    from model import Architecture, ModelConfig


@dataclass(frozen=True)
class ResolvedScale:
    """Every per-scale answer of one scale (build it with `preset` or `custom`).

    Attributes:
        name: the scale's name (a preset's, an inline shape's or a ladder rung's).
        n_layer, d_model, n_head: the model shape (head_dim = d_model / n_head).
        recipe: the training defaults before a spec's ``train:`` overrides: ``seq_len``
            (tokens per window, always set: a preset's recipe falls back to its context),
            ``global_batch`` and ``micro_batch`` (sequences), peak ``lr`` (per AdamW step).
        n_params_reference: of a custom scale, N (non-embedding parameters) of the study's
            reference variant at GPT-2's default backbone, the N its recipe is a function of
            (a ladder rung's exact N); None for a preset, whose recipe is a table entry.
        shape: the custom shape as written or generated (with its recipe overrides); None
            for a preset.
        rung: the ladder rung (target N, exact N, relative error); None unless from a ladder.
    """

    name: str
    n_layer: int
    d_model: int
    n_head: int
    recipe: ScaleRecipe
    n_params_reference: int | None = None
    shape: ScaleShape | None = None
    rung: LadderRung | None = None

    @classmethod
    def preset(cls, name: str) -> ResolvedScale:
        """A preset scale: ``model.PRESETS[name]``'s shape, ``recipe_for(name)`` as its recipe.

        Raises KeyError naming the known recipes for a name without one.
        """
        from model import PRESETS

        r = recipe_for(name)
        p = PRESETS[name]
        return cls(name, p.n_layer, p.d_model, p.n_head, replace(r, seq_len=r.seq_len or p.seq_len))

    @classmethod
    def custom(
        cls, shape: ScaleShape, reference_variant: str, reference_options: dict[str, Any] | None = None, rung: LadderRung | None = None
    ) -> ResolvedScale:
        """A custom scale (inline shape or ladder rung): its recipe is ``shape_recipe`` of N,
        the rung's exact N when given, else N counted with the reference variant and options.

        Raises ValueError naming a bad variant option.
        """
        if rung is not None:
            n = rung.n_params
        else:
            n = non_embedding_params(shape.n_layer, shape.d_model, shape.n_head, reference_variant, reference_options)
        return cls(shape.name, shape.n_layer, shape.d_model, shape.n_head, shape_recipe(shape, n), n, shape, rung)

    @property
    def is_preset(self) -> bool:
        """Whether the scale is a named preset (no custom shape)."""
        return self.shape is None

    @property
    def head_dim(self) -> int:
        """d_model / n_head."""
        return self.d_model // self.n_head

    @property
    def seq_len(self) -> int:
        """The recipe's training window in tokens."""
        assert self.recipe.seq_len is not None  # both constructors fill it
        return self.recipe.seq_len

    def model_config(
        self, variant: str, *, vocab_size: int, seq_len: int, architecture: Architecture | None = None, **options: Any
    ) -> ModelConfig:
        """ModelConfig of this scale for model variant ``variant`` with ``options``, at context
        ``seq_len`` (tokens), vocabulary ``vocab_size`` and backbone ``architecture`` (default
        GPT-2's). Raises ValueError naming a bad variant option or a shape the architecture
        cannot take."""
        from model import Architecture, ModelConfig, build_config

        if self.shape is None:
            cfg = build_config(self.name, variant, vocab_size=vocab_size, seq_len=seq_len, **options)
        else:
            cfg = shape_config(self.shape, variant, vocab_size=vocab_size, seq_len=seq_len, **options)
        return ModelConfig(**{**cfg.model_dump(), **(architecture or Architecture()).model_dump()})

    def n_params(self, variant: str = "standard", options: dict[str, Any] | None = None) -> int:
        """N (non-embedding parameters) of this shape for ``variant`` with ``options`` at GPT-2's
        backbone (vocabulary and context do not enter N). Raises ValueError naming a bad option."""
        return non_embedding_params(self.n_layer, self.d_model, self.n_head, variant, options)
