"""Spec side of custom scales, N-scaled budgets, LR tuning and the branched protocol: what
validates, what the Study holds afterwards, and the field path of every refusal."""

import json

import pytest

from model import build_config, count_model
from orchestrator.plan.ladder import ScaleShape, non_embedding_params
from orchestrator.plan.spec import SpecError, Study, load_spec, parse_spec
from orchestrator.plan.tuning import TuneSpec

BASE = {"name": "t", "variants": ["standard", "coupled"], "budget": {"tokens": 40960}, "scales": ["cpu-xs"]}
SHAPE = {"name": "w96", "n_layer": 2, "d_model": 96, "n_head": 3}
LADDER = {"ladder": {"targets": ["1.2M", "2.2M", "6.3M"], "head_dim": 32, "aspect_ratio": 40}}


def _problems(spec: dict) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, **spec}, "s.yaml")
    return e.value.problems


def test_preset_only_study_keeps_names_and_has_no_shapes():
    s = parse_spec(BASE)
    assert s.scales == ["cpu-xs"] and s.scale_shapes == {} and s.ladder_rungs == {}
    assert s.protocol == "independent" and s.tune is None


def test_presets_shapes_and_ladders_resolve_to_names_in_spec_order():
    s = parse_spec({**BASE, "scales": ["cpu-xs", SHAPE, LADDER, "cpu-s"]})
    assert s.scales == ["cpu-xs", "w96", "n1.2M", "n2.2M", "n6.3M", "cpu-s"]
    assert set(s.scale_shapes) == {"w96", "n1.2M", "n2.2M", "n6.3M"}  # presets are not custom shapes
    assert s.scale_shapes["w96"] == ScaleShape(**SHAPE)
    for name, rung in s.ladder_rungs.items():
        sh = s.scale_shapes[name]
        assert rung.shape == sh and abs(rung.rel_error) <= 0.05
        assert rung.n_params == non_embedding_params(sh.n_layer, sh.d_model, sh.n_head, "standard")
    # 2.2M at head_dim 32 and aspect ratio 40 is cpu-s's own shape: same N as the preset
    assert s.ladder_rungs["n2.2M"].n_params == count_model(build_config("cpu-s", "standard")).n_params


def test_ladder_counts_n_with_the_reference_variant_and_pairs_heads_for_differential():
    s = parse_spec({**BASE, "variants": ["standard", "coupled", "differential"], "reference": "coupled", "scales": [LADDER]})
    for rung in s.ladder_rungs.values():
        sh = rung.shape
        assert rung.n_params == non_embedding_params(sh.n_layer, sh.d_model, sh.n_head, "coupled")
        assert rung.n_params != non_embedding_params(sh.n_layer, sh.d_model, sh.n_head, "standard")
        assert sh.n_head % 2 == 0  # differential pairs heads


def test_shape_that_does_not_divide_names_n_head():
    bad = {**SHAPE, "d_model": 100}
    assert _problems({"scales": ["cpu-xs", bad]}) == [("scales[1].n_head", "d_model=100 is not divisible by n_head=3")]


def test_odd_heads_refused_for_a_variant_that_pairs_heads_only():
    parse_spec({**BASE, "scales": [SHAPE]})  # 3 heads are fine for standard and coupled
    for v in ("differential", "coupled_differential"):
        ((loc, msg),) = _problems({"variants": ["standard", v], "scales": ["cpu-xs", SHAPE]})
        assert loc == "scales[1].n_head" and f"variant {v!r} pairs heads" in msg and "n_head=3 must be even" in msg


def test_unreachable_ladder_target_names_the_target():
    ((loc, msg),) = _problems({"scales": ["cpu-xs", {"ladder": {"targets": ["2.2M", 100], "head_dim": 32, "aspect_ratio": 40}}]})
    assert loc == "scales[1].ladder.targets[1]" and "no shape with head_dim 32 has N within 5% of 100" in msg


def test_scale_names_are_unique_across_presets_shapes_and_rungs():
    probs = _problems(
        {"scales": ["cpu-xs", "cpu-xs", SHAPE, {**SHAPE, "n_layer": 3}, {"ladder": {**LADDER["ladder"], "names": ["w96", "b", "c"]}}]}
    )
    assert [loc for loc, _ in probs] == ["scales[1]", "scales[3].name", "scales[4].ladder.names[0]"]
    assert probs[1][1] == "scale 'w96' is already given at scales[2].name: scale names must be unique"


@pytest.mark.parametrize(
    "entry, loc, text",
    [
        (5, "scales[0]", "expected a preset name, an inline shape"),
        ("cpu-xxl", "scales[0]", "unknown scale 'cpu-xxl'; allowed: cpu-xs"),
        ({**SHAPE, "name": "cpu-s"}, "scales[0].name", "'cpu-s' is a preset's name"),
        ({**SHAPE, "colour": 1}, "scales[0].colour", "unknown field (allowed: d_model, global_batch"),
        ({"ladder": {**LADDER["ladder"], "colour": 1}}, "scales[0].ladder.colour", "unknown field (allowed: aspect_ratio"),
        ({"ladder": {**LADDER["ladder"], "names": ["60m", "b", "c"]}}, "scales[0].ladder.names", "'60m' is a preset's name"),
        ({"ladder": {**LADDER["ladder"], "head_dim": 0}}, "scales[0].ladder.head_dim", "greater than 0"),
    ],
)
def test_each_bad_entry_is_reported_once_at_its_own_path(entry, loc, text):
    probs = _problems({"scales": [entry]})
    assert len(probs) == 1 and probs[0][0] == loc and text in probs[0][1], probs


def test_tokens_per_param_budget_and_its_refusals():
    s = parse_spec({**BASE, "scales": [LADDER], "budget": {"tokens_per_param": 20}})
    assert s.budget.tokens_per_param == 20 and s.budget.tokens is None
    assert _problems({"budget": {"tokens_per_param": 0}}) == [("budget.tokens_per_param", "Input should be greater than 0")]
    assert _problems({"budget": {"tokens_per_param": 20, "tokens": 40960}}) == [
        ("budget", "give exactly one of budget.tokens or budget.tokens_per_param")
    ]


def test_per_scale_tokens_name_custom_scales():
    ok = parse_spec({**BASE, "scales": ["cpu-xs", SHAPE], "budget": {"tokens": {"cpu-xs": 40960, "w96": 20480}}})
    assert ok.budget.tokens == {"cpu-xs": 40960, "w96": 20480}
    ((loc, msg),) = _problems({"scales": ["cpu-xs", SHAPE], "budget": {"tokens": {"cpu-xs": 40960}}})
    assert msg == "budget.tokens has no entry for scales ['w96']"


def test_tune_section_parses_and_refuses_bad_grids_at_tune_lr():
    s = parse_spec({**BASE, "tune": {"lr": [3e-3, 1e-3], "tokens": 0.25, "seeds": [0, 1]}})
    assert s.tune == TuneSpec(lr=[1e-3, 3e-3], tokens=0.25, seeds=[0, 1])
    for grid in ([1e-3, 0.0], [-1e-3]):
        ((loc, msg),) = _problems({"tune": {"lr": grid, "tokens": 0.25}})
        assert loc == "tune.lr" and "is not a positive learning rate" in msg
    assert _problems({"tune": {"lr": [1e-3], "tokens": 1.5}})[0][0] == "tune.tokens"


def test_tune_refuses_every_fixed_peak_lr_it_would_override():
    tune = {"lr": [1e-3, 3e-3], "tokens": 20480}
    probs = _problems(
        {
            "tune": tune,
            "variants": ["standard", {"name": "coupled", "lr": 1e-3}],
            "scales": ["cpu-xs", {**SHAPE, "lr": 2e-3}],
            "train": {"lr": 1e-3},
        }
    )
    assert [loc for loc, _ in probs] == ["variants[1].lr", "scales[1].lr", "train.lr"]
    assert all("tune: chooses the peak LR of every (variant, scale)" in msg for _, msg in probs)
    # without tune the same fixed LRs are the spec's to give
    parse_spec({**BASE, "variants": ["standard", {"name": "coupled", "lr": 1e-3}], "scales": ["cpu-xs", {**SHAPE, "lr": 2e-3}]})


def test_branches_protocol_needs_wsd_and_extend():
    ok = parse_spec({**BASE, "protocol": "branches", "train": {"schedule": "wsd"}, "extend": [1.5, 2, 3]})
    assert ok.protocol == "branches" and ok.extend == [1.5, 2, 3]
    assert [loc for loc, _ in _problems({"protocol": "branches"})] == ["train.schedule", "extend"]
    ((loc, msg),) = _problems({"protocol": "branches", "train": {"schedule": "wsd"}})
    assert loc == "extend" and "needs extend multipliers" in msg
    ((loc, msg),) = _problems({"protocol": "branches", "extend": [2]})
    assert loc == "train.schedule" and "needs the wsd schedule" in msg and "'cosine'" in msg
    assert _problems({"protocol": "branched"})[0][0] == "protocol"


def test_bad_shape_in_a_base_names_the_base(tmp_path):
    (tmp_path / "base.yaml").write_text(f"scales: [cpu-xs, {json.dumps({**SHAPE, 'd_model': 100})}]\n")
    (tmp_path / "s.yaml").write_text("extends: base.yaml\nname: t\nvariants: [standard]\nbudget: {tokens: 40960}\n")
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "s.yaml")
    assert e.value.files == [str(tmp_path / "base.yaml")] and e.value.problems[0][0] == "scales[1].n_head"


def test_schema_lists_the_new_fields():
    schema = Study.model_json_schema()
    props = schema["properties"]
    assert props["protocol"]["enum"] == ["independent", "branches"] and props["protocol"]["default"] == "independent"
    assert {"$ref": "#/$defs/TuneSpec"} in props["tune"]["anyOf"]
    items = props["scales"]["items"]["anyOf"]
    assert items == [{"type": "string"}, {"$ref": "#/$defs/ScaleShape"}, {"$ref": "#/$defs/LadderScale"}]
    assert {"targets", "head_dim", "aspect_ratio"} <= set(schema["$defs"]["LadderSpec"]["required"])
    assert schema["$defs"]["BudgetSpec"]["properties"]["tokens_per_param"]["anyOf"][0]["exclusiveMinimum"] == 0
