"""Packs: the plan's launch order cut into fixed groups of runs, one Ray Train worker group
each. A pack's name must not depend on which of its runs are already done, or a resubmitted
study would not find its checkpoints."""

import pytest

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.packing import launch_order, make_packs


def _runs(per_trainer):
    return launch_order(
        plan(
            parse_spec(
                {
                    "name": "packs",
                    "scales": ["cpu-xs", "cpu-s"],
                    "variants": ["standard", "coupled", "differential"],
                    "seeds": [0, 1],
                    "budget": {"mode": "flops", "tokens": 40960},
                    "extend": [2],
                    "resources": {"runs_per_trainer": per_trainer},
                }
            )
        )
    )


def test_pack_of_one_is_named_after_its_run():
    order = _runs(1)
    packs = make_packs(order, {r.run_id for r in order})
    assert [p.name for p in packs] == [r.run_id for r in order]
    assert all(len(p.runs) == 1 for p in packs)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_packs_cover_the_order_in_fixed_groups(size):
    order = _runs(size)  # 2 scales x 2 seeds x (3 variants + 1 extend) = 16 runs
    packs = make_packs(order, {r.run_id for r in order})
    assert [r.run_id for p in packs for r in p.runs] == [r.run_id for r in order]
    assert [len(p.runs) for p in packs] == [size] * (16 // size) + ([16 % size] if 16 % size else [])
    assert len({p.name for p in packs}) == len(packs) and all(p.name.startswith("pack-") for p in packs)


def test_pack_names_survive_finished_runs():
    order = _runs(3)
    full = make_packs(order, {r.run_id for r in order})
    done = {order[0].run_id, order[1].run_id, order[2].run_id, order[4].run_id}  # all of pack 0, one of pack 1
    part = make_packs(order, {r.run_id for r in order} - done)
    assert [p.name for p in part] == [p.name for p in full[1:]]
    assert [r.run_id for r in part[0].runs] == [order[3].run_id, order[5].run_id]


def test_runs_per_trainer_must_be_positive():
    with pytest.raises(ValueError, match="runs_per_trainer"):
        _runs(0)
