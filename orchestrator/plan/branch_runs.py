"""The reference's RunSpecs under ``protocol: branches``: one trunk and its cooldown branches.

Why: ``orchestrator.plan.branches`` holds the step arithmetic (trunk length, branch points,
the WSD LR of every budget); the runner trains RunSpecs. The trunk is the longest budget's
run itself (its first b_max steps are the constant-LR trunk, then its own cooldown: its
``branch_step`` is b_max, its ``trunk`` None), so no new run kind is needed: it trains like any
run and, on the way, saves a retained checkpoint at every other branch's branch point (``RunSpec.branch_points``). Every other budget m is a
branch: its RunSpec is an independent WSD run of S_m steps (so its LR at every step is the
independent run's, ``test_branches``) plus ``trunk`` (the trunk's run_id) and
``branch_step`` = b_m, both in its identity: a resubmit finds it, and a changed trunk gives
its branches new ids. All budgets warm up over the x1 budget's warmup (one step count:
the identity needs it, ``branches`` module docstring). ``branch_family`` says which runs a
family holds (``BranchFamily``); the planner makes their RunSpecs. Pure: no Ray, no MLflow.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from orchestrator.plan.branches import Branch, BranchPlan, plan_branches
from orchestrator.plan.contract import PlanError, RunSpec, TrainRecipe
from orchestrator.plan.ladder import FieldError
from orchestrator.plan.spec import Study


class BranchFamily(NamedTuple):
    """One (scale, seed)'s reference runs under ``protocol: branches``, before their RunSpecs:
    the recipe they share (its warmup the plan's common one), the trunk (the longest budget)
    and the other branches by ascending multiplier."""

    recipe: TrainRecipe
    trunk: Branch
    branches: tuple[Branch, ...]

    def trunk_fields(self) -> dict[str, Any]:
        """The trunk's RunSpec branch fields (in its identity): its own decay start and every
        other branch's branch point."""
        return {"branch_points": sorted({b.branch_step for b in self.branches}), "branch_step": self.trunk.branch_step}

    @staticmethod
    def branch_fields(branch: Branch, trunk: RunSpec) -> dict[str, Any]:
        """A branch's RunSpec branch fields (in its identity): its trunk's run_id and its step."""
        return {"trunk": trunk.run_id, "branch_step": branch.branch_step}


def reference_branches(study: Study, reference_tokens: float, tokens_per_step: int) -> BranchPlan:
    """``plan_branches`` with the study's extend list and ``train`` schedule.

    Raises PlanError (from the FieldError: the field and why) when the budgets cannot branch."""
    t = study.train
    try:
        return plan_branches(
            reference_tokens,
            study.extend,
            tokens_per_step,
            warmup_fraction=t.warmup_fraction,
            decay_fraction=t.decay_fraction,
            min_lr_ratio=t.min_lr_ratio,
        )
    except FieldError as e:
        raise PlanError(f"protocol: branches: {e}", "protocol") from None  # str(e) is "<field>: <why>"


def branch_family(study: Study, reference_tokens: float, train: TrainRecipe) -> BranchFamily:
    """The runs of one (scale, seed)'s reference: the trunk (the longest budget) and the
    branches by ascending multiplier. ``train``: the resolved recipe (its warmup is replaced by
    the plan's common warmup)."""
    bp = reference_branches(study, reference_tokens, train.tokens_per_step)
    *others, longest = bp.branches
    return BranchFamily(train.model_copy(update={"warmup_steps": bp.warmup_steps}), longest, tuple(others))


def reference_compute(study: Study, runs: list[RunSpec]) -> str:
    """``qkstudy plan``'s line on the reference's training steps under each protocol, summed
    over every (corpus, scale, seed) from its planned x1 run: branched = trunk + cooldowns,
    independent = the sum of the budgets (``BranchPlan``; budgets re-rounded from the x1
    run's steps, so within a step of the plan's). Empty when the study has no extend list."""
    if not study.extend:
        return ""
    branched = independent = 0
    for r in runs:
        if r.variant == study.reference and r.kind == "train" and r.extend == 1.0:
            bp = reference_branches(study, r.tokens, r.train.tokens_per_step)
            branched, independent = branched + bp.branched_steps, independent + bp.independent_steps
    return (
        f"reference compute (this study: protocol {study.protocol}): branches {branched:,} optimizer steps, "
        f"independent {independent:,} ({branched / max(independent, 1):.2f}x)"
    )
