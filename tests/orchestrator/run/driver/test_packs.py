"""Packs: the runs of a study in groups, one Ray Train worker group each. By default one pack
per slot of the cluster, the runs dealt longest first; with a number, the plan's launch order
cut into fixed groups. A run launched in a pack goes back to it on a resubmit (its
checkpoints live under the pack's name), whatever the cluster or the spec says now."""

import pytest

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.packing import launch_order, make_packs
from tests.helpers import REPO


def _runs(per_trainer=None):
    spec = {
        "name": "packs",
        "scales": ["cpu-xs", "cpu-s"],
        "variants": ["standard", "coupled", "differential"],
        "seeds": [0, 1],
        "budget": {"mode": "flops", "tokens": 40960},
        "extend": [2],
    }
    if per_trainer is not None:
        spec["resources"] = {"runs_per_trainer": per_trainer}
    return launch_order(plan(parse_spec(spec)))


def _work(pack):
    return sum(r.total_flops / r.resources.workers for r in pack.runs)


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
    with pytest.raises(ValueError, match=r"must be an integer >= 1 or 'auto' \(got 0\)"):
        _runs(0)


def test_default_is_one_pack_per_slot_dealt_longest_first_to_the_least_loaded():
    order = _runs()  # 16 runs: cpu-s ones several times longer than cpu-xs ones
    assert order[0].resources.runs_per_trainer == "auto"
    ids = {r.run_id for r in order}
    packs = make_packs(order, ids, slots=3)
    assert len(packs) == 3 and sorted(r.run_id for p in packs for r in p.runs) == sorted(ids)
    # LPT: the first three runs open the three packs, and no pack ends more than one run's
    # work after the least loaded one
    assert [p.runs[0].run_id for p in packs] == [r.run_id for r in order[:3]]
    works = [_work(p) for p in packs]
    longest = max(r.total_flops for r in order)
    assert max(works) - min(works) <= longest
    # within a pack, longest first (the launch order)
    pos = {r.run_id: i for i, r in enumerate(order)}
    assert all([pos[r.run_id] for r in p.runs] == sorted(pos[r.run_id] for r in p.runs) for p in packs)
    # the consecutive cut of the same order (the other policy) is far less balanced
    cut = [order[i : i + 6] for i in range(0, 16, 6)]
    cut_works = [sum(r.total_flops for r in c) for c in cut]
    assert max(cut_works) - min(cut_works) > max(works) - min(works)


def test_auto_with_more_slots_than_runs_gives_each_run_its_own_pack():
    order = _runs("auto")
    packs = make_packs(order, {r.run_id for r in order[:5]}, slots=8)
    assert [len(p.runs) for p in packs] == [1] * 5
    assert [p.name for p in packs] == [p.runs[0].run_id for p in packs] == [r.run_id for r in order[:5]]


def test_a_run_goes_back_to_the_pack_it_was_launched_in_whatever_the_spec_and_cluster_say_now():
    first = make_packs(_runs(), {r.run_id for r in _runs()}, slots=2)
    recorded = {r.run_id: p.name for p in first for r in p.runs}
    done = {first[0].runs[0].run_id, first[1].runs[0].run_id}
    # resubmitted under another policy and another cluster: the unfinished runs keep their packs
    for order, slots in ((_runs(), 5), (_runs(3), 1)):
        todo = {r.run_id for r in order} - done
        again = make_packs(order, todo, slots=slots, recorded=recorded)
        assert [(p.name, [r.run_id for r in p.runs]) for p in again] == [(p.name, [r.run_id for r in p.runs[1:]]) for p in first]
        # negative control: without the record the same resubmit packs them under other names
        fresh = make_packs(order, todo, slots=slots)
        assert {p.name for p in fresh}.isdisjoint(p.name for p in first)


def test_runs_never_launched_are_packed_afresh_beside_recorded_ones():
    order = _runs()
    ids = [r.run_id for r in order]
    recorded = {ids[0]: "pack-old"}
    packs = make_packs(order, set(ids), slots=2, recorded=recorded)
    assert packs[0].name == "pack-old" and [r.run_id for r in packs[0].runs] == [ids[0]]
    assert len(packs) == 3 and sorted(r.run_id for p in packs[1:] for r in p.runs) == sorted(ids[1:])
    # a record of a run not to do (finished since) changes nothing
    assert make_packs(order, set(ids[1:]), slots=2, recorded=recorded) == make_packs(order, set(ids[1:]), slots=2)


@pytest.mark.parametrize("bad", ["some", "Auto", True, "2", 2.0, 1.5, [2], None])
def test_runs_per_trainer_takes_a_positive_number_or_auto_and_coerces_nothing(bad):
    with pytest.raises(ValueError, match=r"resources.runs_per_trainer: must be an integer >= 1 or 'auto' \(got "):
        _runs(bad if bad is not None else "null")


def test_the_demo_on_one_slot_packs_as_it_did_with_runs_per_trainer_8():
    """jobs/cpu-demo.yaml left runs_per_trainer to auto: on this machine's one slot (two 1-CPU
    workers on 2 CPUs) its 8 runs make the same pack, under the same name, as the 8 it set."""
    from orchestrator.plan.spec import load_spec

    study = load_spec(str(REPO / "jobs" / "cpu-demo.yaml"))
    auto = launch_order(plan(study))
    fixed = launch_order(plan(study.model_copy(update={"resources": study.resources.model_copy(update={"runs_per_trainer": 8})})))
    ids = {r.run_id for r in auto}
    (one,) = make_packs(auto, ids, slots=1)
    (eight,) = make_packs(fixed, ids)
    assert len(one.runs) == 8 and (eight.name, [r.run_id for r in eight.runs]) == (one.name, [r.run_id for r in one.runs])
    assert len(make_packs(auto, ids, slots=2)) == 2  # a bigger machine trains two groups at once
