"""The branched protocol: trunk and cooldown branches, the schedule identity, compute, validation."""

import pytest

from orchestrator.plan.branches import Branch, plan_branches, protocol_problems
from orchestrator.plan.ladder import FieldError
from orchestrator.run.worker.optim import lr_multiplier

TPS = 16 * 128
SCHED = {"warmup_fraction": 0.05, "decay_fraction": 0.2, "min_lr_ratio": 0.1}


def branch_lr(b: Branch, step: int) -> float:
    """The oracle: the LR multiplier before optimizer step ``step`` (0-based) of a branch read
    from its plan alone: linear warmup (step + 1) / warmup_steps, 1.0 on the trunk up to the
    branch point, then its own cooldown, linear to min_lr_ratio at its last step. Raises
    ValueError outside [0, total_steps)."""
    if not 0 <= step < b.total_steps:
        raise ValueError(f"step {step} is outside the run's [0, {b.total_steps})")
    if b.warmup_steps > 0 and step < b.warmup_steps:
        return (step + 1) / b.warmup_steps
    if step < b.branch_step:
        return 1.0
    return 1.0 - (1 - b.min_lr_ratio) * min(1.0, (step - b.branch_step + 1) / b.decay_steps)


def test_trunk_branch_points_and_compute_for_the_acceptance_extends():
    p = plan_branches(100 * TPS, [1.5, 2, 3], TPS, **SCHED)
    assert [b.multiplier for b in p.branches] == [1, 1.5, 2, 3]
    assert [b.total_steps for b in p.branches] == [100, 150, 200, 300]
    assert [b.decay_steps for b in p.branches] == [20, 30, 40, 60]
    assert [b.branch_step for b in p.branches] == [80, 120, 160, 240]
    assert p.trunk_steps == 240 and p.warmup_steps == 5 and p.trunk_steps == max(b.branch_step for b in p.branches)
    assert p.branched_steps == 240 + 150 and p.independent_steps == 750
    ratio = p.branched_steps / p.independent_steps  # reference compute, branched / independent
    assert ratio == pytest.approx(0.52) and ratio <= 0.55
    assert {b.tokens_per_step for b in p.branches} == {TPS}


def test_ratio_formula_for_other_fractions():
    # (1 - f) x max + f x sum, over the sum of budgets
    for f, extend in ((0.1, [2]), (0.2, [1.5, 2, 3]), (0.3, [2, 4])):
        p = plan_branches(1000 * TPS, extend, TPS, warmup_fraction=0.0, decay_fraction=f, min_lr_ratio=0.0)
        budgets = [1, *extend]
        ratio = p.branched_steps / p.independent_steps
        assert ratio == pytest.approx(((1 - f) * max(budgets) + f * sum(budgets)) / sum(budgets))


@pytest.mark.parametrize(
    "ref_steps, extend, sched",
    [
        (100, [1.5, 2, 3], SCHED),
        (37, [1.5, 2.5, 3], {"warmup_fraction": 0.1, "decay_fraction": 0.25, "min_lr_ratio": 0.0}),  # odd roundings
        (64.4, [1.3, 7], {"warmup_fraction": 0.0, "decay_fraction": 0.15, "min_lr_ratio": 0.05}),
    ],
)
def test_every_branch_has_exactly_the_lr_of_an_independent_wsd_run(ref_steps, extend, sched):
    p = plan_branches(ref_steps * TPS, extend, TPS, **sched)
    longest = p.branches[-1]
    for b in p.branches:
        for step in range(b.total_steps):
            want = lr_multiplier(step, b.total_steps, p.warmup_steps, "wsd", sched["min_lr_ratio"], sched["decay_fraction"])
            assert branch_lr(b, step) == want, (b.multiplier, step)
            if step < b.branch_step:  # before its branch point the run IS the trunk
                assert branch_lr(b, step) == branch_lr(longest, step)
        assert branch_lr(b, b.total_steps - 1) == pytest.approx(sched["min_lr_ratio"])
        with pytest.raises(ValueError):
            branch_lr(b, b.total_steps)


def test_negative_control_per_budget_warmups_would_break_the_identity():
    # today's independent protocol warms each budget up over 5% of its own steps: x3 warms up
    # over 15 steps, the trunk over 5, so x3 could not branch from the trunk
    p = plan_branches(100 * TPS, [3], TPS, **SCHED)
    b = p.branches[-1]
    own = [lr_multiplier(s, 300, 15, "wsd", 0.1, 0.2) for s in range(300)]
    assert any(branch_lr(b, s) != own[s] for s in range(300))


def test_protocol_validation_names_the_field():
    assert protocol_problems("independent", "cosine", []) == []
    assert protocol_problems("branches", "wsd", [2]) == []
    ((loc, msg),) = protocol_problems("branches", "cosine", [2])
    assert loc == ("train", "schedule") and "needs the wsd schedule" in msg and "'cosine'" in msg
    ((loc, msg),) = protocol_problems("branches", "wsd", [])
    assert loc == ("extend",) and "needs extend multipliers" in msg
    assert [p[0] for p in protocol_problems("branches", "cosine", [])] == [("train", "schedule"), ("extend",)]


@pytest.mark.parametrize(
    "kw, loc, msg",
    [
        ({"extend": []}, ("extend",), "need extend multipliers > 1"),
        ({"extend": [1.0, 2]}, ("extend",), "need extend multipliers > 1"),
        ({"extend": [1.01]}, ("extend",), "x1 and x1.01 round to the same 10 optimizer steps"),
        ({"decay_fraction": 1.0}, ("train", "decay_fraction"), "in (0, 1)"),
        ({"warmup_fraction": 0.9}, ("train", "warmup_fraction"), "must end before the x1 run's decay starts (step 8)"),
        ({"reference_tokens": 100}, ("budget",), "less than one optimizer step"),
    ],
)
def test_plan_refuses_unbranchable_budgets(kw, loc, msg):
    args = {"reference_tokens": 10 * TPS, "extend": [2], "tokens_per_step": TPS, **SCHED, **kw}
    with pytest.raises(FieldError) as e:
        plan_branches(**args)
    assert e.value.loc == loc and msg in str(e.value)
