"""Command-line overrides set over a spec (``orchestrator.plan.overrides``): YAML-typed values,
mappings merged and lists replaced as in an ``extends`` chain, errors naming the override, and
run ids that change only when the config does."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.plan.overrides import override_source, parse_override
from orchestrator.plan.planner import plan as plan_study
from orchestrator.plan.spec import SpecError, load_spec

SPEC = {
    "name": "ov",
    "scales": ["cpu-xs"],
    "variants": ["standard", "coupled"],
    "seeds": [0],
    "budget": {"mode": "flops", "tokens": 40960},
    "train": {"lr": 0.003},
}


def _write(tmp_path, name="s.yaml", **over):
    f = tmp_path / name
    f.write_text(yaml.safe_dump({**SPEC, **over}))
    return f


def _ids(study):
    return {(r.variant, r.seed): r.run_id for r in plan_study(study)}


def test_values_parse_as_yaml_and_mappings_merge(tmp_path):
    s = load_spec(_write(tmp_path), ["seeds=[0,1,2]", "train.lr=1e-3", "budget={tokens: 81920}", "variants.1=uncoupled_mlp"])
    assert s.seeds == [0, 1, 2]
    assert s.train.lr == pytest.approx(1e-3)
    assert (s.budget.mode, s.budget.tokens) == ("flops", 81920)  # a mapping merges: mode kept
    assert [v.name for v in s.variants] == ["standard", "uncoupled_mlp"]  # a list entry by index
    assert s.overrides == ["seeds=[0,1,2]", "train.lr=1e-3", "budget={tokens: 81920}", "variants.1=uncoupled_mlp"]


def test_later_override_wins_and_none_leaves_the_spec_as_is(tmp_path):
    f = _write(tmp_path)
    assert load_spec(f, ["seeds=[3]", "seeds=[4]"]).seeds == [4]
    plain = load_spec(f)
    assert plain.seeds == [0] and plain.overrides == []


def test_ids_change_only_when_the_config_changes(tmp_path):
    f = _write(tmp_path)
    base = _ids(load_spec(f))
    assert _ids(load_spec(f, ["train.lr=0.003", "budget.mode=flops"])) == base  # same values: same runs
    more = _ids(load_spec(f, ["seeds=[0,1]"]))
    assert {k: v for k, v in more.items() if k[1] == 0} == base  # the seeds the file had keep their ids
    assert {k[1] for k in more} == {0, 1} and {v for k, v in more.items() if k[1] == 1}.isdisjoint(base.values())
    longer = load_spec(f, ["budget.tokens=81920"])
    assert set(_ids(longer).values()).isdisjoint(base.values())  # more tokens: other runs
    assert [r.tokens for r in plan_study(longer)][0] == 2 * plan_study(load_spec(f))[0].tokens


def test_an_override_equals_the_same_value_in_the_file(tmp_path):
    # `lr: 1e-3` in a file and train.lr=1e-3 on the command line are one run
    in_file = _write(tmp_path, "a.yaml", train={"lr": "1e-3"})
    assert _ids(load_spec(_write(tmp_path, "b.yaml"), ["train.lr=1e-3"])) == _ids(load_spec(in_file))


def test_unknown_field_names_the_override_and_the_field(tmp_path):
    with pytest.raises(SpecError) as e:
        load_spec(_write(tmp_path), ["budget.tokns=10"])
    assert str(e.value).startswith("override 'budget.tokns=10': budget.tokns: unknown field (did you mean 'tokens'?")


def test_a_bad_value_names_the_override_and_others_still_name_their_file(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"eval": {"num_evals": "many"}}))
    f = _write(tmp_path, extends="base.yaml")
    with pytest.raises(SpecError) as e:
        load_spec(f, ["budget.mode=banana"])
    lines = str(e.value).splitlines()
    assert any(line.startswith("override 'budget.mode=banana': budget.mode: Input should be") for line in lines)
    assert any(line.startswith(f"{base}: eval.num_evals:") for line in lines)  # not the override's: its file's


def test_without_the_override_no_line_names_one(tmp_path):
    f = _write(tmp_path, budget={"mode": "banana", "tokens": 40960})
    with pytest.raises(SpecError) as e:
        load_spec(f, ["seeds=[0,1]"])
    assert str(e.value).startswith(f"{f}: budget.mode:") and "override '" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("budget", "expected KEY=VALUE"),
        ("=3", "expected KEY=VALUE"),
        ("budget..tokens=3", "malformed key"),
        ("seeds=[0, 1", "cannot parse"),
        ("seeds.4=1", "seeds is a list of 1"),
        ("name.x=1", "name is str 'ov', not a mapping or list"),
    ],
)
def test_a_malformed_override_is_refused_by_its_text(tmp_path, text, says):
    with pytest.raises(SpecError) as e:
        load_spec(_write(tmp_path), [text])
    assert str(e.value).startswith(f"override {text!r}: ") and says in str(e.value)


def test_the_override_that_set_a_field_or_one_above_it_owns_it():
    a, b = parse_override("budget={tokens: 5}", "s"), parse_override("budget.tokens=6", "s")
    assert override_source([a, b], ("budget", "tokens")) is b  # the later one
    assert override_source([a, b], "budget.mode") is a
    assert override_source([a, b], "seeds[0]") is None
    assert parse_override("variants[1].options.n_steps=2", "s").path == ("variants", "1", "options", "n_steps")


def test_a_problem_of_a_mapping_an_override_set_inside_names_both(tmp_path):
    f = _write(tmp_path)
    with pytest.raises(SpecError) as e:
        load_spec(f, ["budget.tokens_per_param=10"])  # the file already gives budget.tokens
    assert (
        str(e.value)
        == f"{f}: budget: give exactly one of budget.tokens or budget.tokens_per_param (with override 'budget.tokens_per_param=10')"
    )
