"""The study protocols' decisions, driven stage by stage with made-up outcomes (no Ray, no
MLflow, no training): the LR grid extends at an edge optimum and not at an interior one, a
point above the unigram perplexity is never chosen, too-short tuning runs are refused, a
missing tuning result plans no main runs, the gate stops an arm whose paired Δ is above the
bound with an interval excluding zero and keeps every other, the reference trains every rung,
a stopped arm is neither tuned nor trained at the larger rungs, and the branched protocol
trains each trunk with its branches' branch points."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from orchestrator.plan.gate import GateEvidence
from orchestrator.plan.inputs import FitError
from orchestrator.plan.planner import plan
from orchestrator.plan.protocol import (
    Finished,
    GateRan,
    GateVerdict,
    Reply,
    RunOutcome,
    Say,
    Stage,
    StudyProtocol,
    TuneRule,
    branched,
    gated,
    independent,
    tuned,
)
from orchestrator.plan.spec import Study, parse_spec

CORPUS = {"source": "stdlib", "max_documents": 60}
SHAPE = {"budget": {"mode": "tokens", "tokens": 4096, "max_epochs": 1000}, "train": {"global_batch": 8, "seq_len": 64}}
GRID = [1e-3, 2e-3, 4e-3, 8e-3]


def _drive(steps: StudyProtocol, reply: Callable[[Stage], Reply]) -> tuple[list[Stage], Finished]:
    """Every stage the protocol yields, answered by ``reply``, and its return value."""
    stages: list[Stage] = []
    try:
        stage = next(steps)
        while True:
            stages.append(stage)
            stage = steps.send(reply(stage))
    except StopIteration as stop:
        return stages, stop.value


def _said(stages: list[Stage], done: Finished) -> list[str]:
    return [e.text for s in stages for e in (*s.before, *s.after) if isinstance(e, Say)] + [
        e.text for e in done.after if isinstance(e, Say)
    ]


def _tuned_study(**tune) -> Study:
    return parse_spec(
        {
            "name": "tuned",
            "corpus": CORPUS,
            "scales": ["cpu-xs"],
            "variants": ["standard"],
            "seeds": [0, 1],
            **SHAPE,
            "tune": {"lr": GRID, "tokens": 0.5, "min_steps": 1, **tune},
        }
    )


def _tuning_reply(loss: Callable[[float, int], float | None], unigram: float | None = None) -> Callable[[Stage], Reply]:
    """Replies to the tuning stages from ``loss(lr, seed)`` (None: no result yet); other stages
    get nothing back, as the driver reads nothing for them."""

    def reply(stage: Stage) -> Reply:
        if not stage.wants_tuning:
            return Reply()
        runs = {r.run_id: RunOutcome("finished", x) for r in stage.runs if (x := loss(r.train.lr, r.seed)) is not None}
        return Reply(runs, {"stdlib": unigram} if unigram is not None else {})

    return reply


def _valley(best: float) -> Callable[[float, int], float]:
    return lambda lr, seed: 1.0 + abs(math.log(lr / best))


def _tune(study: Study, reply: Callable[[Stage], Reply]) -> tuple[list[Stage], Finished]:
    return _drive(tuned(study, (None, None), plan(study)), reply)


def test_an_interior_optimum_trains_the_main_runs_at_it_without_extending():
    study = _tuned_study()
    stages, done = _tune(study, _tuning_reply(_valley(4e-3)))
    assert [s.label for s in stages] == ["tuning", "main"]
    assert sorted({r.train.lr for r in stages[0].runs}) == GRID and {r.kind for r in stages[0].runs} == {"tune"}
    assert any(isinstance(e, TuneRule) and e.record["grid"] == GRID for e in stages[0].after)  # the rule recorded once
    main = stages[1].runs
    assert len(main) == 2 and {r.kind for r in main} == {"train"} and {r.train.lr for r in main} == {4e-3}
    assert list(done.lrs.values()) == [4e-3] and "tuned standard @ cpu-xs: lr 0.004 (tuning val loss 1.0000)" in _said(stages, done)


def test_an_edge_optimum_extends_the_grid_at_its_ratio_up_to_extend_edges():
    study = _tuned_study(extend_edges=2)
    stages, done = _tune(study, _tuning_reply(_valley(1.6e-2)))  # beyond the grid's top
    assert [s.label for s in stages] == ["tuning", "tuning: edge extension", "tuning: edge extension", "main"]
    lrs = [sorted({r.train.lr for r in s.runs}) for s in stages[:3]]
    assert lrs == [GRID, [*GRID, 1.6e-2], [*GRID, 1.6e-2, 3.2e-2]]  # every tuning run again, the new one added
    assert {r.train.lr for r in stages[3].runs} == {1.6e-2}  # interior after the second point
    assert any("extending standard/cpu-xs to lr 0.016" in line for line in _said(stages, done))


def test_the_extension_stops_at_extend_edges_and_trains_at_the_edge():
    study = _tuned_study(extend_edges=1)
    stages, done = _tune(study, _tuning_reply(_valley(1.0)))  # far above any reachable point
    assert [s.label for s in stages] == ["tuning", "tuning: edge extension", "main"]
    assert {r.train.lr for r in stages[-1].runs} == {1.6e-2}


def test_without_extend_edges_an_edge_optimum_is_trained_as_it_is():
    stages, done = _tune(_tuned_study(extend_edges=0), _tuning_reply(_valley(1.0)))
    assert [s.label for s in stages] == ["tuning", "main"] and {r.train.lr for r in stages[-1].runs} == {8e-3}


def _one_seed_above(lr: float, seed: int) -> float:
    """2e-3 has the lowest mean loss, but its seed 1 ends above a bar of 3 nats (20.09 ppl)."""
    if lr == 2e-3:
        return 0.1 if seed == 0 else 3.5
    return {1e-3: 2.2, 4e-3: 2.0, 8e-3: 2.3}[lr]


def test_a_point_above_the_unigram_perplexity_is_never_chosen():
    study = _tuned_study(seeds=[0, 1])
    stages, done = _tune(study, _tuning_reply(_one_seed_above, unigram=math.exp(3.0)))
    assert {r.train.lr for r in stages[-1].runs} == {4e-3}
    assert any("above unigram at lr 0.002" in line for line in _said(stages, done))
    # negative control: with no bar recorded the lower mean wins
    stages, _ = _tune(study, _tuning_reply(_one_seed_above))
    assert {r.train.lr for r in stages[-1].runs} == {2e-3}


def test_tuning_runs_shorter_than_min_steps_are_refused_before_any_stage():
    with pytest.raises(FitError, match="min_steps"):
        next(tuned(_tuned_study(min_steps=50), (None, None), plan(_tuned_study(min_steps=50))))
    assert next(tuned(_tuned_study(min_steps=1), (None, None), plan(_tuned_study(min_steps=1)))).label == "tuning"  # control


def test_a_tuning_run_without_a_result_plans_no_main_runs():
    study = _tuned_study()
    stages, done = _tune(study, _tuning_reply(lambda lr, seed: None if lr == 2e-3 else _valley(4e-3)(lr, seed)))
    assert [s.label for s in stages] == ["tuning"] and not done.lrs
    assert any("main runs not planned" in line and "no result yet" in line for line in _said(stages, done))


def _gated_study(**over) -> Study:
    return parse_spec(
        {
            "name": "gated",
            "corpora": {"a": CORPUS, "b": CORPUS},
            "scales": ["cpu-m", "cpu-xs", "cpu-s"],
            "variants": ["standard", "coupled"] if "tune" in over else ["standard", {"name": "slow", "kind": "standard", "lr": 1e-7}],
            "seeds": [0, 1],
            **SHAPE,
            "gate": {"worse_than": 0.02},
            **over,
        }
    )


def _evidence(corpus: str, variant: str, scale: str, rung: int, dloss: float, low: float) -> GateEvidence:
    # ``stopped`` False on purpose: the protocol applies the rule to the numbers itself
    return GateEvidence(corpus, variant, "standard", scale, rung, "tokens", 0.02, dloss, low, dloss + (dloss - low), 2, 0.01, 0.95, False)


def _gate_reply(numbers: Callable[[str, int], tuple[float, float]]) -> Callable[[Stage], Reply]:
    """Evidence for every asked arm on every corpus the stage trained, (Δ, low) = ``numbers(corpus, rung)``."""

    def reply(stage: Stage) -> Reply:
        ask = stage.gate
        if ask is None:
            return Reply()
        ev = tuple(
            _evidence(c, v, ask.scale, ask.rung, *numbers(c, ask.rung))
            for c in sorted({r.corpus_name for r in stage.runs})
            for v in ask.variants
            if v != "standard"
        )
        return Reply(gate=ev)

    return reply


def _arms(stage: Stage) -> set[tuple[str, str, str]]:
    return {(r.scale, r.corpus_name, r.variant) for r in stage.runs}


def test_the_gate_stops_an_arm_above_the_bound_with_an_interval_excluding_zero_on_its_corpus_only():
    study = _gated_study()
    numbers = {("a", 1): (0.05, 0.03)}  # a clearly worse arm on corpus a at rung 1; no verdict elsewhere
    stages, done = _drive(gated(study, (None, None), plan(study)), _gate_reply(lambda c, k: numbers.get((c, k), (math.nan, math.nan))))
    assert [sorted({s for s, _, _ in _arms(st)}) for st in stages] == [["cpu-xs"], ["cpu-s"], ["cpu-m"]]  # rungs by N
    assert [(s.gate.scale, s.gate.rung, s.gate.variants) if s.gate else None for s in stages] == [
        ("cpu-xs", 1, ("slow", "standard")),
        ("cpu-s", 2, ("slow", "standard")),
        None,  # never after the last rung
    ]
    for st in stages[1:]:
        assert ("a", "slow") not in {(c, v) for _, c, v in _arms(st)} and {("b", "slow"), ("a", "standard"), ("b", "standard")} <= {
            (c, v) for _, c, v in _arms(st)
        }
    verdicts = [e.evidence for e in stages[1].before if isinstance(e, GateVerdict)]
    assert [(v.corpus, v.stopped, v.skipped) for v in verdicts] == [("a", True, ("cpu-s", "cpu-m")), ("b", False, ())]
    assert isinstance(stages[1].before[2], GateRan) and stages[1].before[2].scale == "cpu-xs"
    assert [(v.corpus, v.stopped) for v in (e.evidence for e in stages[2].before if isinstance(e, GateVerdict))] == [("b", False)]
    assert len(done.gated) == 4 and set(done.stopped) == {("a", "slow")}  # two seeds at cpu-s and cpu-m
    assert all(why.startswith("stopped at rung 1 (cpu-xs)") for why in done.gated.values())


@pytest.mark.parametrize(
    "dloss, low", [(0.05, -0.01), (0.01, 0.005), (math.nan, math.nan)], ids=["interval-holds-zero", "below-the-bound", "no-verdict"]
)
def test_the_gate_keeps_every_other_arm_and_the_reference_trains_every_rung(dloss, low):
    study = _gated_study()
    stages, done = _drive(gated(study, (None, None), plan(study)), _gate_reply(lambda c, k: (dloss, low)))
    assert len(stages) == 3 and not done.gated and not done.stopped
    for st in stages:
        assert {(c, v) for _, c, v in _arms(st)} == {(c, v) for c in ("a", "b") for v in ("standard", "slow")}
        assert len(st.runs) == 8  # two corpora, two variants, two seeds


def test_a_tuned_gated_ladder_tunes_only_the_arms_still_training():
    study = _gated_study(
        corpora=None,
        corpus=CORPUS,
        scales=["cpu-s", "cpu-xs"],
        tune={"lr": [1e-3, 2e-3, 4e-3], "tokens": 0.5, "seeds": [0], "min_steps": 1},
    )
    tuning = _tuning_reply(_valley(2e-3))
    gate = _gate_reply(lambda c, k: (0.05, 0.03))

    def reply(stage: Stage) -> Reply:
        return tuning(stage) if stage.wants_tuning else gate(stage)

    stages, done = _drive(gated(study, (None, None), plan(study)), reply)
    seen = [sorted({(r.kind, r.scale, r.variant, r.train.lr) for r in st.runs}) for st in stages]
    grid = [1e-3, 2e-3, 4e-3]
    assert seen[0] == sorted(("tune", "cpu-xs", v, lr) for v in ("coupled", "standard") for lr in grid)
    assert seen[1] == [("train", "cpu-xs", "coupled", 2e-3), ("train", "cpu-xs", "standard", 2e-3)]
    assert seen[2] == [("tune", "cpu-s", "standard", lr) for lr in grid]  # coupled stopped: not tuned at cpu-s
    assert seen[3] == [("train", "cpu-s", "standard", 2e-3)] and len(stages) == 4
    assert len(done.gated) == 2 and done.lrs  # coupled at cpu-s, two seeds


def test_a_resubmit_with_the_same_outcomes_yields_the_same_stages_and_records():
    study = _gated_study()
    reply = _gate_reply(lambda c, k: (0.05, 0.03) if c == "a" else (0.0, -0.1))
    first, second = (_drive(gated(study, (None, None), plan(study)), reply) for _ in range(2))
    assert [([r.run_id for r in s.runs], s.before) for s in first[0]] == [([r.run_id for r in s.runs], s.before) for s in second[0]]
    assert first[1] == second[1]


def test_the_branched_protocol_trains_each_trunk_with_its_branch_points_in_one_stage():
    spec = {"name": "b", "scales": ["cpu-xs"], "variants": ["standard", "coupled"], "seeds": [0], "extend": [1.5, 2, 3], **SHAPE}
    spec["train"] = {**SHAPE["train"], "schedule": "wsd"}
    spec["budget"] = {"mode": "tokens", "tokens": 100 * 8 * 64}
    study = parse_spec({**spec, "protocol": "branches"})
    stages, done = _drive(branched(plan(study)), lambda s: Reply())
    assert len(stages) == 1 and done == Finished() and stages[0].gate is None and not stages[0].wants_tuning
    ref = sorted((r for r in stages[0].runs if r.variant == "standard"), key=lambda r: r.extend)
    trunk, branches = ref[-1], ref[:-1]
    assert trunk.trunk is None and trunk.branch_points == sorted(b.branch_step for b in branches) == [80, 120, 160]
    assert all(b.trunk == trunk.run_id and b.branch_step == b.steps - round(0.2 * b.steps) for b in branches)
    # negative control: the independent protocol trains every budget from scratch
    [only] = _drive(independent(plan(parse_spec(spec))), lambda s: Reply())[0]
    assert all(r.trunk is None and r.branch_step is None for r in only.runs)
