"""Tuning runs as RunSpecs, and the main plan at the tuned learning rates.

Why: ``orchestrator.plan.tuning`` holds the grid, the runs' descriptors and the choice, but
the runner trains RunSpecs. `plan_tuning` turns each `TuningRun` into a RunSpec of kind
``tune`` derived from its arm's x1 main run (first corpus, first study seed) as planned at the
recipe's LR: same model, corpus, tokenizer, data and recipe; its own LR, seed, step count,
warmup and eval cadence. Its ``run_id`` hashes the untuned main run's id (which covers all
of those) with ``TuningRun.identity()`` (kind, variant, scale, lr, seed, steps): stable
across resubmits, so finished tuning runs are found by id, and independent of the LR tuning
picks (no circle). The main runs are then planned with ``plan(..., tuned_lr=tuned_lrs(...))``
so the chosen LR enters their identity through ``train.lr``.

Order of a tuned study (``orchestrator.run.driver.study``): plan untuned -> `plan_tuning` ->
train those -> `choose` on their final val losses -> `tuned_lrs` -> plan -> train those.
Pure: no Ray, no MLflow.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.plan.contract import RunSpec, run_identity
from orchestrator.plan.spec import Study
from orchestrator.plan.tuning import Arm, LrChoice, TuningResult, TuningRun, choose_lr, tuning_runs


def arm_bases(study: Study, untuned: Iterable[RunSpec]) -> dict[tuple[str, str], RunSpec]:
    """Per (variant, scale) the main x1 run tuning derives from: the first corpus, the
    first study seed (``untuned``: ``plan(study)`` without ``tuned_lr``)."""
    corpus = next(iter(study.corpus_map))
    out: dict[tuple[str, str], RunSpec] = {}
    for r in untuned:
        if r.corpus_name == corpus and r.seed == study.seeds[0] and r.extend == 1.0 and r.kind == "train":
            out.setdefault((r.variant, r.scale), r)
    return out


def plan_tuning(study: Study, untuned: list[RunSpec]) -> list[RunSpec]:
    """The tuning RunSpecs of ``study`` (empty without a ``tune:`` section), per arm, LR
    (ascending) and tuning seed. Raises FieldError (``tune.tokens``) below one step."""
    if study.tune is None:
        return []
    bases = arm_bases(study, untuned)
    arms = [Arm(v, s, b.steps, b.train.tokens_per_step, b.flops_per_token) for (v, s), b in bases.items()]
    return [_tuning_spec(study, bases[t.variant, t.scale], t) for t in tuning_runs(study.tune, arms, study.seeds)]


def _tuning_spec(study: Study, base: RunSpec, t: TuningRun) -> RunSpec:
    """RunSpec of tuning run ``t`` derived from its arm's untuned x1 run ``base``."""
    train = base.train.model_copy(update={"lr": t.lr, "warmup_steps": int(round(study.train.warmup_fraction * t.steps))})
    eval_every = max(1, t.steps // study.eval.num_evals)
    return base.model_copy(
        update={
            "run_id": run_identity({"base": base.run_id, **t.identity()}),
            "kind": t.kind,
            "seed": t.seed,
            "extend": 1.0,
            "steps": t.steps,
            "tokens": t.tokens,
            "total_flops": t.total_flops,
            "train": train,
            "eval_every_steps": eval_every,
            "trunk": None,
            "branch_step": None,
            "branch_points": [],  # a tuning run branches from nothing
        }
    )


def tuning_results(runs: Iterable[RunSpec], outcomes: dict[str, tuple[float | None, str]]) -> list[TuningResult]:
    """`TuningResult` of every tuning run from ``outcomes``: run_id -> (final val loss in
    nats/token or None, status); a run without an outcome is ``queued`` (no result yet)."""
    return [
        TuningResult(r.variant, r.scale, r.train.lr, r.seed, *outcomes.get(r.run_id, (None, "queued"))) for r in runs if r.kind == "tune"
    ]


def tuned_lrs(study: Study, choices: dict[tuple[str, str], LrChoice]) -> dict[tuple[str, str], float]:
    """(variant, scale) -> chosen LR of every arm that has one. Raises ValueError naming the
    arms whose every tuning run failed or diverged (no LR to train at)."""
    lost = sorted(k for k, c in choices.items() if c.lr is None)
    if lost:
        raise ValueError(f"tuning found no usable LR for {lost} (every grid point failed or diverged)")
    return {k: c.lr for k, c in choices.items() if c.lr is not None}


def choose(study: Study, tuning: list[RunSpec], outcomes: dict[str, tuple[float | None, str]]) -> dict[tuple[str, str], LrChoice]:
    """``choose_lr`` over the study's grid and tuning seeds, from the runs' outcomes."""
    assert study.tune is not None
    seeds = study.tune.seeds or study.seeds[:1]
    return choose_lr(tuning_results(tuning, outcomes), study.tune.lr, seeds)


def tuning_summary(study: Study, untuned: list[RunSpec]) -> str:
    """``qkstudy plan``'s line for tuning compute, apart from the main budget: runs, tokens,
    training FLOPs and their share of the main runs' FLOPs. The main runs listed with it are
    at the recipe LR: their trained ids follow the LR tuning chooses."""
    tuning = plan_tuning(study, untuned)
    flops, main = sum(r.total_flops for r in tuning), sum(r.total_flops for r in untuned)
    return (
        f"tuning (not in the main budget): {len(tuning)} runs, {sum(r.tokens for r in tuning):,} tokens, "
        f"{flops:.3e} FLOPs ({flops / main:.1%} of the main runs' FLOPs); the main runs train at each "
        "(variant, scale)'s tuned LR, so their ids change from those listed"
    )
