"""A resolved scale (orchestrator.plan.scale.ResolvedScale): a preset, an inline shape and a
ladder rung each answer shape, recipe, N and model config as the per-kind functions do."""

import pytest

from model import Architecture, build_config, count_model
from orchestrator.plan.ladder import ScaleShape, non_embedding_params, shape_config, shape_recipe
from orchestrator.plan.recipe import RECIPES
from orchestrator.plan.scale import ResolvedScale
from orchestrator.plan.spec import parse_spec

SHAPE = {"name": "w96", "n_layer": 2, "d_model": 96, "n_head": 3}
LADDER = {"ladder": {"targets": ["2.2M"], "head_dim": 32, "aspect_ratio": 40}}
STUDY = {"name": "t", "variants": ["standard", "coupled"], "budget": {"tokens": 40960}, "scales": ["cpu-s", "cpu-xs", SHAPE, LADDER]}
SHAPE_FIELDS = ("vocab_size", "seq_len", "n_layer", "d_model", "n_head", "variant", "options")
MODERN = Architecture(positions="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, tied_head=True)


def test_preset_answers_its_table_entry_and_build_config():
    s = parse_spec(STUDY).scale("cpu-s")
    assert (s.name, s.n_layer, s.d_model, s.n_head, s.head_dim) == ("cpu-s", 5, 192, 6, 32)
    assert s.is_preset and s.shape is None and s.rung is None and s.n_params_reference is None
    assert s.recipe == RECIPES["cpu-s"] and s.seq_len == 128
    for v, opts in (("standard", {}), ("coupled", {"integrator": "leapfrog"})):
        assert s.model_config(v, vocab_size=64, seq_len=128, **opts) == build_config("cpu-s", v, vocab_size=64, seq_len=128, **opts)
        assert s.n_params(v, opts) == count_model(build_config("cpu-s", v, **opts)).n_params
    # A preset recipe without a window trains at the preset's context (cpu-xs: 128 tokens).
    xs = parse_spec(STUDY).scale("cpu-xs")
    assert RECIPES["cpu-xs"].seq_len is None and xs.seq_len == 128 and xs.recipe.lr == 3e-3


def test_inline_shape_answers_shape_recipe_and_config_of_the_ladder_functions():
    s = parse_spec(STUDY).scale("w96")
    shape = ScaleShape(**SHAPE)
    n_ref = non_embedding_params(2, 96, 3, "standard")
    assert s.shape == shape and s.rung is None and not s.is_preset and s.head_dim == 32
    assert s.n_params_reference == n_ref == 221_664
    assert s.recipe == shape_recipe(shape, n_ref) and s.seq_len == 128
    assert s.recipe.lr == pytest.approx(0.1432 * n_ref**-0.2915)
    cfg = s.model_config("coupled", vocab_size=64, seq_len=32)
    assert cfg == shape_config(shape, "coupled", vocab_size=64, seq_len=32)
    assert s.n_params("coupled") == count_model(cfg).n_params == 225_894


def test_reference_variant_sets_the_n_a_custom_recipe_is_a_function_of():
    s = parse_spec({**STUDY, "reference": "coupled"}).scale("w96")
    assert s.n_params_reference == non_embedding_params(2, 96, 3, "coupled") == 225_894
    assert s.recipe == shape_recipe(ScaleShape(**SHAPE), 225_894)
    assert s.recipe.lr != parse_spec(STUDY).scale("w96").recipe.lr  # the standard reference's N is smaller


def test_ladder_rung_answers_its_own_exact_n():
    study = parse_spec(STUDY)
    s = study.scale("n2.2M")
    rung = study.ladder_rungs["n2.2M"]
    assert s.rung == rung and s.shape == rung.shape and (s.n_layer, s.d_model, s.n_head) == (5, 192, 6)
    assert s.n_params_reference == rung.n_params == s.n_params() == 2_213_952
    assert s.recipe == shape_recipe(rung.shape, rung.n_params)
    # The rung is cpu-s's shape: its N and config equal the preset's; only the recipe differs.
    preset = study.scale("cpu-s")
    assert s.n_params() == preset.n_params()
    assert s.model_config("standard", vocab_size=64, seq_len=128) == preset.model_config("standard", vocab_size=64, seq_len=128)


def test_a_wrong_shape_gives_a_different_n_and_recipe():
    right = parse_spec(STUDY).scale("w96")
    wrong = ResolvedScale.custom(ScaleShape(**{**SHAPE, "n_layer": 3}), "standard")
    assert wrong.n_params() != right.n_params() and wrong.n_params_reference != right.n_params_reference
    assert wrong.recipe.lr != right.recipe.lr


def test_architecture_enters_the_config_of_every_kind():
    study = parse_spec(STUDY)
    for name in ("cpu-s", "w96", "n2.2M"):
        s = study.scale(name)
        gpt2 = s.model_config("standard", vocab_size=64, seq_len=32)
        modern = s.model_config("standard", vocab_size=64, seq_len=32, architecture=MODERN)
        assert modern != gpt2 and {k: getattr(modern, k) for k in Architecture.model_fields} == dict(MODERN)
        assert [getattr(modern, k) for k in SHAPE_FIELDS] == [getattr(gpt2, k) for k in SHAPE_FIELDS]
    preset = study.scale("cpu-s").model_config("standard", vocab_size=64, seq_len=32, architecture=MODERN)
    assert preset == build_config("cpu-s", "standard", vocab_size=64, seq_len=32, architecture=MODERN)


def test_unknown_scale_is_a_key_error_naming_the_studys_scales():
    with pytest.raises(KeyError, match=r"no scale 'cpu-m' in study 't'; scales: \['cpu-s', 'cpu-xs', 'w96', 'n2.2M'\]"):
        parse_spec(STUDY).scale("cpu-m")
