"""The branched protocol: every reference budget from one constant-LR trunk and its cooldowns.

Why: the token ratio needs the reference at several budgets (x1 and each ``extend``
multiplier). Trained independently that is the sum of the budgets (x1 + 1.5 + 2 + 3 = 7.5
x1 budgets per seed and scale). With a WSD schedule (warmup, constant LR, linear decay over
the last ``decay_fraction`` of the steps; Hu et al. 2024) the runs of every budget share the
constant-LR part, so one trunk trained to the start of the longest budget's decay, plus one
cooldown branch per budget from the trunk's checkpoint at that budget's decay start, gives
every budget's run (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond
Fixed Training Durations"). Cost: (1 - f) x the longest budget plus
f x the sum of the budgets (f = decay_fraction): 0.52x the independent runs for
extend [1.5, 2, 3] and f = 0.2.

Schedule identity: branch m follows, at every step, exactly the LR of an independent WSD
run of its budget S_m with the same warmup (``optim.lr_multiplier(step, S_m, warmup, "wsd",
min_lr_ratio, decay_fraction)``; ``test_branches`` checks every step). For that the warmup is
one step count for every budget (the x1 budget's: round(warmup_fraction x S_1)), and it must
end before the earliest branch point. Step counts: S_m = round(m x D_1 / tokens_per_step)
(the planner's rounding, D_1 the x1 budget in tokens); decay_m = max(1, round(f x S_m)) (the
schedule's); branch point b_m = S_m - decay_m; trunk = max b_m steps.

Pure: no Ray, no MLflow. The LR itself is the worker's (``optim.lr_multiplier`` of the
branch's own budget); this module plans only the step counts, and ``test_branches`` checks
that a trunk followed by its cooldown, step for step, has that LR.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator.plan.ladder import FieldError, whole_steps
from orchestrator.plan.specfile import Loc

PROTOCOLS = ("independent", "branches")
Protocol = Literal["independent", "branches"]


def protocol_problems(protocol: str, schedule: str, extend: Sequence[float]) -> list[tuple[Loc, str]]:
    """Spec checks of ``protocol: branches`` as (field path, message) pairs: it needs the
    ``wsd`` schedule (``train.schedule``) and at least one ``extend`` multiplier."""
    if protocol != "branches":
        return []
    problems: list[tuple[Loc, str]] = []
    if schedule != "wsd":
        problems.append(
            (
                ("train", "schedule"),
                f"protocol: branches needs the wsd schedule (warmup, constant LR, linear "
                f"decay over train.decay_fraction), got {schedule!r}",
            )
        )
    if not extend:
        problems.append(
            (("extend",), "protocol: branches needs extend multipliers (e.g. [1.5, 2, 3]): the branches are the reference's longer budgets")
        )
    return problems


@dataclass(frozen=True)
class Branch:
    """The run of one budget: trunk steps [0, branch_step), then its own cooldown.

    Fields: multiplier (of the x1 budget; 1 for the planned run), total_steps (S_m),
    branch_step (b_m, the trunk step whose checkpoint the branch starts from), decay_steps
    (S_m - b_m), warmup_steps, min_lr_ratio, tokens_per_step (global_batch x seq_len).
    """

    multiplier: float
    total_steps: int
    branch_step: int
    decay_steps: int
    warmup_steps: int
    min_lr_ratio: float
    tokens_per_step: int


@dataclass(frozen=True)
class BranchPlan:
    """The reference's runs under ``protocol: branches`` at one (scale, seed).

    trunk_steps: constant-LR steps of the trunk (the latest branch point); branches: one
    per multiplier, ascending, x1 first. Compute counts optimizer steps (x tokens_per_step
    for tokens, x FLOPs per token for FLOPs: one model, so the ratio is the same).
    """

    trunk_steps: int
    warmup_steps: int
    tokens_per_step: int
    branches: tuple[Branch, ...]

    @property
    def branched_steps(self) -> int:
        """Steps the branched protocol trains: the trunk plus every cooldown."""
        return self.trunk_steps + sum(b.decay_steps for b in self.branches)

    @property
    def independent_steps(self) -> int:
        """Steps the independent protocol trains for the same budgets: their sum."""
        return sum(b.total_steps for b in self.branches)


def plan_branches(
    reference_tokens: float,
    extend: Sequence[float],
    tokens_per_step: int,
    *,
    warmup_fraction: float,
    decay_fraction: float,
    min_lr_ratio: float,
) -> BranchPlan:
    """Trunk and branches of the reference (module docstring has the step arithmetic).

    Args:
        reference_tokens: the x1 budget D_1 in tokens, before rounding.
        extend: multipliers > 1 (the x1 branch is always added).
        tokens_per_step: global_batch x seq_len.
        warmup_fraction, decay_fraction, min_lr_ratio: the study's ``train`` schedule.

    Raises:
        FieldError: ``extend`` without a multiplier > 1, two multipliers that round to the
            same number of steps, a decay_fraction outside (0, 1), a budget below one step,
            or a warmup longer than the x1 run's constant phase (``train.warmup_fraction``).
    """
    if not 0 < decay_fraction < 1:
        raise FieldError(("train", "decay_fraction"), f"branches need a decay fraction in (0, 1), got {decay_fraction}")
    if not extend or any(not e > 1 for e in extend):
        raise FieldError(("extend",), f"branches need extend multipliers > 1, got {list(extend)}")
    multipliers = sorted({1.0, *map(float, extend)})
    steps = [whole_steps(m * reference_tokens, tokens_per_step, ("budget",)) for m in multipliers]
    for (m0, s0), (m1, s1) in zip(zip(multipliers, steps), zip(multipliers[1:], steps[1:])):
        if s0 == s1:
            raise FieldError(
                ("extend",), f"x{m0:g} and x{m1:g} round to the same {s0} optimizer steps: the budget is too small to tell them apart"
            )
    warmup = int(round(warmup_fraction * steps[0]))
    branches = []
    for m, s in zip(multipliers, steps):
        decay = max(1, int(round(decay_fraction * s)))  # optim.lr_multiplier's wsd decay length
        branches.append(Branch(m, s, s - decay, decay, warmup, min_lr_ratio, tokens_per_step))
    if warmup > branches[0].branch_step:
        raise FieldError(
            ("train", "warmup_fraction"),
            f"the warmup ({warmup} steps) must end before the x1 run's decay starts (step {branches[0].branch_step})",
        )
    return BranchPlan(max(b.branch_step for b in branches), warmup, tokens_per_step, tuple(branches))
