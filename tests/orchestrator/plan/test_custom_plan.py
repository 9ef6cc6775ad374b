"""Planning custom scales (inline shapes, ladders), tokens_per_param budgets, and LR tuning."""

import math

import pytest
import yaml

from model import count_model
from orchestrator.plan.ladder import custom_recipe
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.plan.tune_plan import choose, extensions, plan_tuned, plan_tuning, tuned_lrs, tuning_summary
from orchestrator.plan.tuning import KIND

LADDER = {"ladder": {"targets": ["600k", "2.2M", "6.3M"], "head_dim": 32, "aspect_ratio": 40, "seq_len": 128}}
BASE = {
    "name": "lad",
    "scales": [LADDER],
    "variants": ["standard", "differential"],
    "seeds": [0, 1],
    "budget": {"mode": "flops", "tokens_per_param": 4.0},
    "extend": [],
}


def _study(**over):
    return parse_spec({**BASE, **over})


def test_ladder_with_tokens_per_param_plans_tokens_proportional_to_n():
    study = _study()
    runs = plan(study)
    ref = {r.scale: r for r in runs if r.variant == "standard" and r.seed == 0}
    assert list(ref) == ["n600k", "n2.2M", "n6.3M"]
    for name, target in zip(ref, (6e5, 2.2e6, 6.3e6)):
        r = ref[name]
        assert abs(r.n_params / target - 1) <= 0.05  # the rung's shape is within tolerance of its target
        assert r.n_params == study.ladder_rungs[name].n_params
        shape = study.scale_shapes[name]
        assert (r.model["n_layer"], r.model["d_model"], r.model["n_head"]) == (shape.n_layer, shape.d_model, shape.n_head)
        tps = r.train.tokens_per_step
        assert abs(r.tokens - 4.0 * r.n_params) <= tps / 2  # D = k N within half a step of rounding
        rec = custom_recipe(r.n_params, seq_len=128)
        assert (r.train.lr, r.train.global_batch, r.train.seq_len) == (rec.lr, rec.global_batch, 128)
    # bigger rungs get proportionally more tokens, and smaller learning rates (the recipe's rule)
    ratios = [ref[s].tokens / ref[s].n_params for s in ref]
    assert max(ratios) / min(ratios) - 1 < 0.05
    assert ref["n600k"].tokens < ref["n2.2M"].tokens < ref["n6.3M"].tokens
    assert ref["n600k"].train.lr > ref["n2.2M"].train.lr > ref["n6.3M"].train.lr
    # differential at its own N and FLOPs, FLOP-matched to the reference at each rung
    for r in runs:
        if r.variant == "differential":
            assert r.n_params == count_model(_cfg(r)).n_params
            assert abs(r.total_flops - ref[r.scale].total_flops) <= r.train.tokens_per_step * r.flops_per_token


def _cfg(r):
    from model import ModelConfig

    return ModelConfig.model_validate(r.model)


def test_inline_shape_overrides_win_and_presets_plan_as_before():
    shape = {"name": "tiny", "n_layer": 2, "d_model": 64, "n_head": 2, "seq_len": 64, "lr": 0.004, "global_batch": 8}
    runs = plan(_study(scales=["cpu-xs", shape], budget={"mode": "tokens", "tokens": 65536}))
    tiny = next(r for r in runs if r.scale == "tiny")
    assert (tiny.train.lr, tiny.train.global_batch, tiny.train.seq_len) == (0.004, 8, 64)
    assert tiny.steps == 65536 // (8 * 64) and tiny.model["d_model"] == 64
    xs = next(r for r in runs if r.scale == "cpu-xs")
    assert xs.train.lr == 3e-3  # the preset's recipe


def test_tuned_lr_enters_identity_only_for_its_arm():
    study = _study(scales=["cpu-xs"], budget={"mode": "tokens", "tokens": 65536})
    base = plan(study)
    assert [r.run_id for r in plan(study, tuned_lr={})] == [r.run_id for r in base]
    assert all(r.kind == "train" for r in base)
    tuned = plan(study, tuned_lr={("differential", "cpu-xs"): 0.01})
    for a, b in zip(base, tuned):
        if a.variant == "differential":
            assert b.train.lr == 0.01 and b.run_id != a.run_id
        else:
            assert b == a


TUNE = {"lr": [0.001, 0.003, 0.01], "tokens": 0.25, "seeds": [7], "min_steps": 8}


def test_tuning_runs_are_their_own_kind_with_stable_ids():
    study = _study(scales=["cpu-xs"], budget={"mode": "tokens", "tokens": 65536}, tune=TUNE)
    untuned = plan(study)
    tuning = plan_tuning(study, untuned)
    assert [(r.variant, r.train.lr) for r in tuning] == [(v, lr) for v in ("standard", "differential") for lr in TUNE["lr"]]
    main = {r.variant: r for r in untuned if r.seed == 0}
    for r in tuning:
        assert r.kind == KIND and r.seed == 7 and r.extend == 1.0
        assert r.steps == round(0.25 * main[r.variant].steps) and r.tokens == r.steps * r.train.tokens_per_step
        assert r.model == main[r.variant].model and r.corpus == main[r.variant].corpus
        assert r.run_name == f"tune-{r.variant}-cpu-xs-lr{r.train.lr:g}-s7"
    ids = [r.run_id for r in tuning]
    assert len(set(ids)) == len(ids) and not set(ids) & {r.run_id for r in untuned}
    assert ids == [r.run_id for r in plan_tuning(study, plan(study))]  # a resubmit finds them by id
    assert plan_tuning(_study(scales=["cpu-xs"], budget={"mode": "tokens", "tokens": 65536}), untuned) == []
    # `qkstudy plan`'s tuning line: compute apart from the main budget
    flops = sum(r.steps * r.train.tokens_per_step * r.flops_per_token for r in tuning)
    share = flops / sum(r.total_flops for r in untuned)
    line = tuning_summary(study, untuned)
    assert f"{len(tuning)} runs" in line and f"{flops:.3e} FLOPs" in line and f"({share:.1%} of the main" in line
    assert share == pytest.approx(3 * 0.25 / 2, abs=0.01)  # per arm 3 LRs x 1/4 budget vs 2 seeds x 1 budget


def test_chosen_lr_is_the_grid_argmin_and_drives_the_main_runs():
    study = _study(scales=["cpu-xs"], budget={"mode": "tokens", "tokens": 65536}, tune=TUNE)
    tuning = plan_tuning(study, plan(study))
    # synthetic losses with a known answer: standard best at 0.003 (interior), differential at 0.001 (edge);
    # differential's 0.01 diverged
    loss = {
        ("standard", 0.001): 3.0,
        ("standard", 0.003): 2.5,
        ("standard", 0.01): 2.8,
        ("differential", 0.001): 2.6,
        ("differential", 0.003): 2.7,
    }
    outcomes = {
        r.run_id: (loss.get((r.variant, r.train.lr)), "finished" if (r.variant, r.train.lr) in loss else "diverged") for r in tuning
    }
    choices = choose(study, tuning, outcomes)
    assert (choices["standard", "cpu-xs"].lr, choices["standard", "cpu-xs"].edge) == (0.003, None)
    assert (choices["differential", "cpu-xs"].lr, choices["differential", "cpu-xs"].edge) == (0.001, "lowest")
    assert math.isinf(choices["differential", "cpu-xs"].table[0.01])
    lrs = tuned_lrs(study, choices)
    main = plan(study, tuned_lr=lrs)
    assert {(r.variant, r.train.lr) for r in main} == {("standard", 0.003), ("differential", 0.001)}
    # every seed diverging leaves no LR: refused, naming the arm
    with pytest.raises(ValueError, match="standard"):
        tuned_lrs(study, choose(study, tuning, {r.run_id: (None, "diverged") for r in tuning}))


def _outcomes(tuning, curve):
    """Synthetic finished outcomes: each tuning run's loss from ``curve(variant, lr)``."""
    return {r.run_id: (curve(r.variant, r.train.lr), "finished") for r in tuning}


def test_an_edge_arm_plans_one_more_point_per_round_at_the_grid_ratio_and_keeps_the_old_ids():
    study = _study(scales=["cpu-xs"], budget={"mode": "tokens", "tokens": 65536}, tune={**TUNE, "extend_edges": 1})
    untuned = plan(study)
    tuning = plan_tuning(study, untuned)
    # standard's optimum lies below the grid (known answer 3.333e-4); differential's inside it (0.003)
    best = {"standard": 3.333e-4, "differential": 0.003}
    curve = lambda v, lr: 3.0 + math.log(lr / best[v]) ** 2  # noqa: E731
    choices = choose(study, tuning, _outcomes(tuning, curve))
    extra = extensions(study, tuning, choices)
    assert extra == {("standard", "cpu-xs"): [3.333e-4]}  # the interior arm does not extend
    grown = plan_tuning(study, untuned, extra)
    new = [r for r in grown if r.run_id not in {t.run_id for t in tuning}]
    assert [(r.variant, r.train.lr, r.steps) for r in new] == [("standard", 3.333e-4, tuning[0].steps)]
    assert new[0].run_name == "tune-standard-cpu-xs-lr0.0003333-s7"
    assert {r.run_id for r in tuning} <= {r.run_id for r in grown}  # the grid's runs keep their ids
    choices = choose(study, grown, _outcomes(grown, curve))
    assert choices["standard", "cpu-xs"].lr == 3.333e-4 and choices["standard", "cpu-xs"].note == "at the lowest edge after 1 extension"
    assert extensions(study, grown, choices) == {}  # the bound: one extension per side


def test_per_corpus_tuning_tunes_and_trains_each_corpus_at_its_own_lr():
    corpora = {"code": {"source": "stdlib"}, "prose": {"source": "stdlib", "max_documents": 50}}
    study = _study(scales=["cpu-xs"], corpora=corpora, budget={"mode": "tokens", "tokens": 65536}, tune={**TUNE, "per_corpus": True})
    untuned = plan(study)
    tuning = plan_tuning(study, untuned)
    assert len(tuning) == 2 * 2 * 3 and {r.corpus_name for r in tuning} == {"code", "prose"}
    assert len({r.run_id for r in tuning}) == len(tuning) and all(r.run_name.endswith(f"@{r.corpus_name}") for r in tuning)
    best = {"code": 0.01, "prose": 0.001}
    outcomes = {r.run_id: (3.0 + math.log(r.train.lr / best[r.corpus_name]) ** 2, "finished") for r in tuning}
    lrs = tuned_lrs(study, choose(study, tuning, outcomes))
    assert lrs == {(v, "cpu-xs", c): best[c] for v in ("standard", "differential") for c in best}
    main = plan_tuned(study, None, None, lrs)
    assert [r.run_id for r in main] != [r.run_id for r in untuned] and len(main) == len(untuned)
    assert {(r.corpus_name, r.train.lr) for r in main} == {("code", 0.01), ("prose", 0.001)}
    # negative control: without per_corpus the arms are tuned on the first corpus only, one LR each
    shared = _study(scales=["cpu-xs"], corpora=corpora, budget={"mode": "tokens", "tokens": 65536}, tune=TUNE)
    assert {r.corpus_name for r in plan_tuning(shared, plan(shared))} == {"code"}


def test_validate_refuses_tuning_runs_shorter_than_min_steps_naming_the_file_and_field(tmp_path):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    doc = {**BASE, "scales": ["cpu-xs"], "budget": {"mode": "tokens", "tokens": 65536}, "tune": {"lr": [0.001, 0.003], "tokens": 0.25}}
    spec = tmp_path / "short.yaml"
    spec.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["validate", str(spec)])
    flat = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert f"{spec}: tune.tokens: tuning runs of standard @ cpu-xs would be 8 optimizer steps, fewer than tune.min_steps (50)" in flat
    # negative control: at a minimum the runs reach, the spec is valid
    spec.write_text(yaml.safe_dump({**doc, "tune": {**doc["tune"], "min_steps": 8}}))
    assert CliRunner().invoke(app, ["validate", str(spec)]).exit_code == 0
