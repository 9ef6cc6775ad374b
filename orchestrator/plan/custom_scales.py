"""One lookup for every scale's model config and recipe, preset or custom.

Why: the planner resolved a scale by its preset name (``model.build_config`` and
``orchestrator.plan.recipe.recipe_for``), so an inline shape or a ladder rung of
``scales:`` (``Study.scale_shapes``) could not be planned. Here a custom scale goes through
``orchestrator.plan.ladder.shape_config`` / ``shape_recipe`` (learning rate and batch as
functions of N unless the shape overrides them) and a preset through its table, so both
plan alike. Pure: no Ray, no MLflow; ``model`` (torch) is imported where configs are built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.plan.ladder import non_embedding_params, shape_config, shape_recipe
from orchestrator.plan.recipe import ScaleRecipe, recipe_for

if TYPE_CHECKING:
    from model import ModelConfig
    from orchestrator.plan.spec import Study


def custom_n_params(study: Study, scale: str) -> int:
    """N (non-embedding parameters) of custom scale ``scale`` counted with the reference
    variant, the N its recipe is a function of (a ladder rung's own count when it has one).
    Raises KeyError for a scale that is not custom."""
    rung = study.ladder_rungs.get(scale)
    if rung is not None:
        return rung.n_params
    shape = study.scale_shapes[scale]
    ref = next(v for v in study.variants if v.name == study.reference)
    return non_embedding_params(shape.n_layer, shape.d_model, shape.n_head, ref.model_variant, ref.options)


def scale_recipe(study: Study, scale: str) -> ScaleRecipe:
    """The recipe of ``scale``: a preset's table entry, or ``shape_recipe`` of a custom shape.
    Raises KeyError for a name that is neither."""
    shape = study.scale_shapes.get(scale)
    if shape is None:
        return recipe_for(scale)
    return shape_recipe(shape, custom_n_params(study, scale))


def scale_config(study: Study, scale: str, model_variant: str, *, vocab_size: int, seq_len: int, **options: Any) -> ModelConfig:
    """ModelConfig of ``scale`` for one variant at context ``seq_len`` (tokens) in the study's
    ``architecture``: a preset's ``model.build_config``, or a custom shape's ``shape_config``.
    Raises ValueError naming a bad variant option, or a shape the architecture cannot take."""
    from model import ModelConfig, build_config

    shape = study.scale_shapes.get(scale)
    if shape is None:
        cfg = build_config(scale, model_variant, vocab_size=vocab_size, seq_len=seq_len, **options)
    else:
        cfg = shape_config(shape, model_variant, vocab_size=vocab_size, seq_len=seq_len, **options)
    return ModelConfig(**{**cfg.model_dump(), **study.architecture.model_dump()})
