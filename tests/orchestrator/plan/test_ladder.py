"""Custom scales: inline shapes, ladders by target N, the custom recipe, tokens-per-parameter budgets."""

import math

import numpy as np
import pytest
from pydantic import ValidationError

from model import PRESETS, VARIANTS, build_config, count_model
from orchestrator.plan.ladder import (
    LR_COEFFICIENT,
    LR_EXPONENT,
    FieldError,
    LadderSpec,
    ScaleShape,
    custom_recipe,
    generate_ladder,
    non_embedding_params,
    preset_params,
    shape_config,
    shape_problems,
    shape_recipe,
    tokens_per_param_budget,
)
from orchestrator.plan.recipe import RECIPES


def _n(preset, variant="standard"):
    return count_model(build_config(preset, variant)).n_params


def _loc_msg(exc_info):
    e = exc_info.value.errors()[0]
    return e["loc"], e["msg"]


# -- inline shapes ----------------------------------------------------------------------------


def test_shape_refuses_heads_that_do_not_divide_naming_n_head():
    with pytest.raises(ValidationError) as e:
        ScaleShape(name="s1", n_layer=4, d_model=200, n_head=6)
    loc, msg = _loc_msg(e)
    assert loc == ("n_head",) and "d_model=200 is not divisible by n_head=6" in msg
    assert ScaleShape(name="s1", n_layer=4, d_model=192, n_head=6).head_dim == 32


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"name": "cpu-s"}, "name"),
        ({"name": "a b"}, "name"),
        ({"n_layer": 0}, "n_layer"),
        ({"lr": -1e-3}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"global_batch": 0}, "global_batch"),
        ({"seq_len": 0}, "seq_len"),
        ({"colour": 1}, "colour"),
    ],
)
def test_shape_field_errors_name_the_field(bad, field):
    with pytest.raises(ValidationError) as e:
        ScaleShape(**{"name": "s1", "n_layer": 2, "d_model": 64, "n_head": 2, **bad})
    assert _loc_msg(e)[0] == (field,)


def test_differential_needs_even_heads_with_the_field_path():
    odd = ScaleShape(name="s1", n_layer=2, d_model=96, n_head=3)
    probs = shape_problems(odd, ["standard", "differential", "coupled_differential"], ("scales", 1))
    assert [p[0] for p in probs] == [("scales", 1, "n_head")] * 2
    assert "variant 'differential' pairs heads" in probs[0][1] and "n_head=3 must be even" in probs[0][1]
    assert shape_problems(odd, ["standard", "coupled"], ("scales", 1)) == []
    even = ScaleShape(name="s2", n_layer=2, d_model=128, n_head=4)
    assert shape_problems(even, ["differential"], ("scales", 0)) == []
    # the check agrees with the model's own: the odd shape really cannot be built as differential
    with pytest.raises(ValueError, match="must be even"):
        shape_config(odd, "differential", vocab_size=64, seq_len=16)


def test_shape_config_counts_like_the_preset_it_copies():
    for p in ("cpu-s", "60m"):
        s = PRESETS[p]
        shape = ScaleShape(name=f"my-{p}", n_layer=s.n_layer, d_model=s.d_model, n_head=s.n_head, seq_len=s.seq_len)
        for v in ("standard", "coupled", "differential"):
            assert count_model(shape_config(shape, v, vocab_size=32_000)) == count_model(build_config(p, v))
            assert non_embedding_params(s.n_layer, s.d_model, s.n_head, v) == _n(p, v)
    with pytest.raises(ValueError, match="give seq_len"):
        shape_config(ScaleShape(name="x", n_layer=1, d_model=32, n_head=1), "standard", vocab_size=8)


# -- ladders ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_layer_has_the_same_parameter_count(variant):
    # the ladder search's assumption: N(L, d) = base(d) + L per_layer(d), for every variant
    for d, h in ((64, 2), (96, 4)):
        one, two = (non_embedding_params(L, d, h, variant) for L in (1, 2))
        for L in (3, 7):
            assert non_embedding_params(L, d, h, variant) == (2 * one - two) + L * (two - one)


@pytest.mark.parametrize("preset, head_dim", [("cpu-xs", 32), ("cpu-s", 32), ("cpu-m", 32), ("60m", 64), ("150m", 64), ("350m", 64)])
def test_ladder_at_a_presets_n_and_aspect_reproduces_the_preset(preset, head_dim):
    p = PRESETS[preset]
    (rung,) = generate_ladder(LadderSpec(targets=[_n(preset)], head_dim=head_dim, aspect_ratio=p.d_model / p.n_layer))
    assert (rung.shape.n_layer, rung.shape.d_model, rung.shape.n_head) == (p.n_layer, p.d_model, p.n_head)
    assert rung.n_params == _n(preset) and rung.rel_error == 0


def test_ladder_for_the_cpu_presets_n_at_one_aspect_ratio():
    targets = [_n(p) for p in ("cpu-xs", "cpu-s", "cpu-m")]
    spec = LadderSpec(targets=targets, head_dim=32, aspect_ratio=40, seq_len=128)
    rungs = generate_ladder(spec)
    assert [r.shape.name for r in rungs] == ["n591k", "n2.21M", "n6.3M"]
    for r, t in zip(rungs, targets):
        s = r.shape
        assert s.d_model % 32 == 0 and s.head_dim == 32 and s.seq_len == 128
        assert abs(r.n_params / t - 1) <= 0.05 and r.rel_error == pytest.approx(r.n_params / t - 1)
        assert 40 / 2 <= s.aspect_ratio <= 40 * 2
        # N is the planner's: count_model of the shape's config
        assert r.n_params == count_model(shape_config(s, "standard", vocab_size=2048)).n_params
    assert [r.n_params for r in rungs] == sorted(r.n_params for r in rungs)


def test_ladder_counts_the_reference_variant_and_pairs_heads_when_asked():
    spec = LadderSpec(targets=["600k", "2.2M", "6.3M", "25M"], head_dim=32, aspect_ratio=40)
    rungs = generate_ladder(spec, variant="differential", even_heads=True)
    for r in rungs:
        assert r.shape.n_head % 2 == 0 and abs(r.rel_error) <= 0.05
        assert r.n_params == count_model(shape_config(r.shape, "differential", vocab_size=64, seq_len=16)).n_params
        assert not shape_problems(r.shape, ["differential"], ("scales", 0))
    assert [r.target for r in rungs] == [6e5, 2.2e6, 6.3e6, 25e6]


def test_ladder_refuses_a_target_no_shape_reaches_naming_the_field():
    with pytest.raises(FieldError) as e:
        generate_ladder(LadderSpec(targets=[6e5, 5000], head_dim=32, aspect_ratio=40), loc=("scales", 2, "ladder"))
    assert e.value.loc == ("scales", 2, "ladder", "targets", 1)
    assert str(e.value).startswith("scales[2].ladder.targets[1]: no shape with head_dim 32 has N within 5% of 5,000")
    assert "nearest: 1 x 32" in str(e.value)
    # reachable in N, but only far from the aspect ratio (300k needs 3 x 96 at +10.7%, or a deep narrow stack)
    with pytest.raises(FieldError, match="at an aspect ratio within 2x of 40"):
        generate_ladder(LadderSpec(targets=[3e5], head_dim=32, aspect_ratio=40))
    # negative control: a looser aspect tolerance reaches it
    (rung,) = generate_ladder(LadderSpec(targets=[3e5], head_dim=32, aspect_ratio=40, aspect_tolerance=4))
    assert abs(rung.rel_error) <= 0.05


def test_ladder_refuses_two_targets_with_one_shape():
    with pytest.raises(FieldError) as e:
        generate_ladder(LadderSpec(targets=[590_000, 592_000], head_dim=32, aspect_ratio=40))
    assert e.value.loc == ("ladder", "targets", 1) and "same shape (3 x 128) as targets[0]" in str(e.value)


@pytest.mark.parametrize(
    "targets, msg",
    [
        ([], "at least 1"),
        ([-5], "entry 0 (-5.0) is not a positive"),
        (["lots"], "'lots' is not a parameter count"),
        ([1e6, "1M"], "repeat"),
    ],
)
def test_ladder_spec_refuses_bad_targets(targets, msg):
    with pytest.raises(ValidationError) as e:
        LadderSpec(targets=targets, head_dim=32, aspect_ratio=40)
    loc, m = _loc_msg(e)
    assert loc == ("targets",) and msg in m


def test_ladder_spec_parses_counts_and_checks_names():
    assert LadderSpec(targets=["500k", "2.2M", "3e5", "1B", 7], head_dim=8, aspect_ratio=1).targets == [5e5, 2.2e6, 3e5, 1e9, 7]
    with pytest.raises(ValidationError, match="2 names for 1 targets"):
        LadderSpec(targets=[1e6], head_dim=32, aspect_ratio=40, names=["a", "b"])
    assert LadderSpec(targets=[1e6], head_dim=32, aspect_ratio=40, names=["big"]).rung_names() == ["big"]


# -- the custom recipe ------------------------------------------------------------------------


def test_custom_recipe_constants_are_the_fit_of_the_presets():
    n = preset_params()
    presets = list(RECIPES)
    assert set(n) == set(presets)
    cpu = np.array([p.startswith("cpu") for p in presets], float)
    X = np.c_[np.log([n[p] for p in presets]), cpu, 1 - cpu]
    coef = np.linalg.lstsq(X, np.log([RECIPES[p].lr for p in presets]), rcond=None)[0]
    assert coef[0] == pytest.approx(LR_EXPONENT, abs=5e-4)
    assert math.exp(coef[1]) == pytest.approx(LR_COEFFICIENT["cpu"], rel=5e-3)
    assert math.exp(coef[2]) == pytest.approx(LR_COEFFICIENT["paper"], rel=5e-3)


@pytest.mark.parametrize("preset", list(RECIPES))
def test_custom_recipe_at_a_presets_n_matches_its_recipe(preset):
    r, c = RECIPES[preset], custom_recipe(preset_params()[preset])
    assert c.lr == pytest.approx(r.lr, rel=0.015)
    assert (c.global_batch, c.micro_batch) == (r.global_batch, r.micro_batch)
    assert c.seq_len == (r.seq_len or PRESETS[preset].seq_len)


def test_custom_recipe_lr_falls_with_n_and_overrides_win():
    ns = np.geomspace(3e5, 1e9, 30)
    lrs = [custom_recipe(int(x)).lr for x in ns]
    cpu = [lr for x, lr in zip(ns, lrs) if x < 12.6e6]
    assert all(a > b for a, b in zip(lrs, lrs[1:])) and len(cpu) > 5
    assert custom_recipe(4e6).lr == pytest.approx(0.1432 * 4e6**-0.2915)
    big = custom_recipe(2e9)
    assert big.global_batch == 512 and big.micro_batch == 2 and big.seq_len == 1024  # 350m's 8, N 7.2x: 2 halvings
    assert custom_recipe(2.4e6).micro_batch == 16 and custom_recipe(600e6).micro_batch == 4  # 350m: 8, N 2.2x
    o = custom_recipe(4e6, lr=1e-2, global_batch=8, seq_len=64)
    assert (o.lr, o.global_batch, o.micro_batch, o.seq_len) == (1e-2, 8, 8, 64)
    shape = ScaleShape(name="s", n_layer=4, d_model=128, n_head=4, lr=5e-3)
    assert shape_recipe(shape, 800_000).lr == 5e-3 and shape_recipe(shape, 800_000).global_batch == 16
    with pytest.raises(ValueError):
        custom_recipe(0)


# -- tokens per parameter ---------------------------------------------------------------------


def test_tokens_per_param_rounds_to_whole_steps_and_grows_with_n():
    tps = 16 * 128
    b = tokens_per_param_budget(20, 590_720, tps)
    assert b.steps == 5769 and b.tokens == 5769 * tps  # 20 x 590720 / 2048 = 5768.75
    big = tokens_per_param_budget(20, 6_295_808, tps)
    for budget, n in ((b, 590_720), (big, 6_295_808)):  # each within half a step of k N
        assert abs(budget.tokens - 20 * n) <= tps / 2
    assert big.steps > 10 * b.steps
    with pytest.raises(FieldError) as e:
        tokens_per_param_budget(0.001, 590_720, tps)
    assert e.value.loc == ("budget", "tokens_per_param") and "less than one optimizer step (2,048 tokens)" in str(e.value)
    with pytest.raises(FieldError, match="must be positive"):
        tokens_per_param_budget(-1, 590_720, tps)
