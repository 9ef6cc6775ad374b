"""protocol: branches in the planner: trunk and branch RunSpecs, their compute, LRs and identities."""

import pytest

from orchestrator.plan.branch_runs import reference_compute
from orchestrator.plan.contract import PlanError
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.packing import make_packs
from orchestrator.run.worker.optim import lr_multiplier

TPS = 8 * 64
BASE = {
    "name": "b",
    "scales": ["cpu-xs"],
    "variants": ["standard", "coupled"],
    "seeds": [0, 1],
    "budget": {"mode": "tokens", "tokens": 100 * TPS},
    "extend": [1.5, 2, 3],
    "train": {"global_batch": 8, "seq_len": 64, "schedule": "wsd"},
}


def _plan(protocol, **over):
    return plan(parse_spec({**BASE, "protocol": protocol, **over}))


def _ref(runs, seed=0):
    return sorted((r for r in runs if r.variant == "standard" and r.seed == seed), key=lambda r: r.extend)


def _lr(r, step):
    t = r.train
    return lr_multiplier(step, r.steps, t.warmup_steps, t.schedule, t.min_lr_ratio, t.decay_fraction)


def test_branched_reference_trains_at_most_055x_of_the_independent_steps():
    ind, br = _plan("independent"), _plan("branches")
    assert [(r.extend, r.steps) for r in _ref(ind)] == [(r.extend, r.steps) for r in _ref(br)]  # same budgets
    ind_steps = sum(r.steps for r in ind if r.variant == "standard")
    # what the branched plan trains: each trunk whole, each branch from its branch point on
    br_steps = sum(r.steps - (r.branch_step if r.trunk else 0) for r in br if r.variant == "standard")
    assert (ind_steps, br_steps) == (2 * 750, 2 * 390)
    assert br_steps / ind_steps == pytest.approx(0.52) and br_steps / ind_steps <= 0.55
    # the variants are planned alike in both protocols
    assert [r.run_id for r in ind if r.variant == "coupled"] == [r.run_id for r in br if r.variant == "coupled"]
    assert "branches 780 optimizer steps, independent 1,500 (0.52x)" in reference_compute(parse_spec({**BASE, "protocol": "branches"}), br)


def test_each_branch_has_the_lr_of_an_independent_wsd_run_and_is_the_trunk_before_its_branch_point():
    runs = _ref(_plan("branches"))
    trunk = runs[-1]
    assert trunk.extend == 3 and trunk.trunk is None and trunk.branch_points == [80, 120, 160] and trunk.branch_step == 240
    for r in runs[:-1]:
        assert r.trunk == trunk.run_id and r.branch_step == r.steps - round(0.2 * r.steps)
        assert r.train.warmup_steps == trunk.train.warmup_steps == 5  # x1's warmup: 5% of 100 steps
        for step in range(r.steps):
            independent = lr_multiplier(step, r.steps, 5, "wsd", r.train.min_lr_ratio, 0.2)
            assert _lr(r, step) == independent, (r.extend, step)
            if step < r.branch_step:
                assert _lr(r, step) == _lr(trunk, step)
        assert _lr(r, r.branch_step) < _lr(trunk, r.branch_step) == 1.0  # the cooldown starts there


def test_branch_identity_holds_its_trunk_and_branch_point_and_independent_ids_are_unchanged():
    a, b = _plan("branches"), _plan("branches")
    assert [r.run_id for r in a] == [r.run_id for r in b]  # a resubmit finds every run
    ids = {r.run_id for r in a}
    assert len(ids) == len(a)
    ind = {r.run_id for r in _plan("independent")}
    assert not {r.run_id for r in _ref(a)} & ind  # the branched reference runs are other runs
    # another trunk (other seeds' trunks differ): each branch names its own seed's trunk
    t0, t1 = _ref(a, 0)[-1], _ref(a, 1)[-1]
    assert {r.trunk for r in _ref(a, 1)[:-1]} == {t1.run_id} != {t0.run_id}


def test_a_trunk_and_its_branches_are_one_pack_trunk_first():
    runs = _plan("branches", resources={"runs_per_trainer": 1})
    packs = make_packs(runs, {r.run_id for r in runs})
    fam = [p for p in packs if len(p.runs) > 1]
    assert len(fam) == 2 and all(p.runs[0].branch_points and [r.extend for r in p.runs] == [3, 1, 1.5, 2] for p in fam)
    assert sorted(len(p.runs) for p in packs) == [1, 1, 4, 4]  # the coupled runs as before
    # a resubmit with the trunk done keeps the pack's name (its Ray Train checkpoints)
    left = make_packs(runs, {r.run_id for r in fam[0].runs[1:]})
    assert left[0].name == fam[0].name and left[0].runs == fam[0].runs[1:]


def test_budgets_too_small_to_branch_are_refused_naming_the_field():
    with pytest.raises(PlanError, match=r"^protocol: branches: extend: x1.5 and x2 round to the same 2 optimizer steps"):
        _plan("branches", budget={"mode": "tokens", "tokens": 1 * TPS})
