"""Tuning runs as RunSpecs, and the main plan at the tuned learning rates.

Why: ``orchestrator.plan.tuning`` holds the grid, the runs' descriptors and the choice, but
the runner trains RunSpecs. `plan_tuning` turns each `TuningRun` into a RunSpec of kind
``tune`` derived from its arm's x1 main run (first study seed; the first corpus, or the
arm's own under ``tune.per_corpus``) as planned at the recipe's LR: same model, corpus,
tokenizer, data and recipe; its own LR, seed, step count, warmup and eval cadence. Its
``run_id`` hashes the untuned main run's id (which covers all of those) with
``TuningRun.identity()`` (kind, variant, scale, lr, seed, steps): stable across resubmits, so
finished tuning runs are found by id, and independent of the LR tuning picks (no circle). A
grid point an edge extension added is a tuning run like any other (its LR is in its id, not
how it got there). The main runs are then planned with ``plan_tuned`` so the chosen LR enters
their identity through ``train.lr``.

Order of a tuned study (``orchestrator.plan.protocol.tuned``, which the driver runs): plan
untuned -> `plan_tuning` -> train those -> `choose` on their final val losses and the corpora's
unigram perplexities -> while `extensions` names new grid points: `plan_tuning` with them,
train the new runs, `choose` again -> `tuned_lrs` -> `plan_tuned` -> train those. Pure: no
Ray, no MLflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.plan.contract import RunSpec, run_identity
from orchestrator.plan.inputs import FitError
from orchestrator.plan.ladder import FieldError
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import Study
from orchestrator.plan.specfile import loc_str
from orchestrator.plan.throughput import ThroughputTable
from orchestrator.plan.tuning import (
    Arm,
    ArmKey,
    LrChoice,
    TuningResult,
    TuningRun,
    arm_key,
    choose_lr,
    extension_lrs,
    tuning_runs,
    tuning_steps,
)


def run_key(study: Study, r: RunSpec) -> ArmKey:
    """The tuning arm ``r`` belongs to: (variant, scale), plus its corpus under ``tune.per_corpus``."""
    per_corpus = study.tune is not None and study.tune.per_corpus
    return arm_key(r.variant, r.scale, r.corpus_name if per_corpus else None)


def arm_bases(study: Study, untuned: Iterable[RunSpec]) -> dict[ArmKey, RunSpec]:
    """Per arm the main x1 run tuning derives from: the first study seed's, on the first
    corpus (on every corpus, one arm each, under ``tune.per_corpus``). ``untuned``:
    ``plan(study)`` without ``tuned_lr``."""
    per_corpus = study.tune is not None and study.tune.per_corpus
    first = next(iter(study.corpus_map))
    out: dict[ArmKey, RunSpec] = {}
    for r in untuned:
        if (per_corpus or r.corpus_name == first) and r.seed == study.seeds[0] and r.extend == 1.0 and r.kind == "train":
            out.setdefault(run_key(study, r), r)
    return out


def _arms(study: Study, bases: Mapping[ArmKey, RunSpec]) -> list[Arm]:
    return [Arm(b.variant, b.scale, b.steps, b.train.tokens_per_step, b.flops_per_token, *k[2:]) for k, b in bases.items()]


def tuning_problems(study: Study, untuned: list[RunSpec]) -> list[tuple[str, str]]:
    """(spec field, message) for every arm whose tuning runs would be shorter than one
    optimizer step or ``tune.min_steps`` (``tuning.tuning_steps``); [] without ``tune:``."""
    if study.tune is None:
        return []
    out: list[tuple[str, str]] = []
    for arm in _arms(study, arm_bases(study, untuned)):
        try:
            tuning_steps(study.tune, arm)
        except FieldError as e:
            out.append((loc_str(e.loc), e.message))
    return out


def plan_tuning(study: Study, untuned: list[RunSpec], extra: Mapping[ArmKey, Iterable[float]] | None = None) -> list[RunSpec]:
    """The tuning RunSpecs of ``study`` (empty without a ``tune:`` section), per arm, LR
    (ascending: the grid and the arm's ``extra`` LRs, from `extensions`) and tuning seed.

    Raises FitError (``tune.tokens``, ``tuning_problems``) for runs below one step or
    ``tune.min_steps``."""
    if study.tune is None:
        return []
    if problems := tuning_problems(study, untuned):
        raise FitError(problems)
    bases = arm_bases(study, untuned)
    runs = tuning_runs(study.tune, _arms(study, bases), study.seeds, extra)
    return [_tuning_spec(study, bases[arm_key(t.variant, t.scale, t.corpus)], t) for t in runs]


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
        TuningResult(r.variant, r.scale, r.train.lr, r.seed, *outcomes.get(r.run_id, (None, "queued")), r.corpus_name)
        for r in runs
        if r.kind == "tune"
    ]


def _extra(study: Study, tuning: Iterable[RunSpec]) -> dict[ArmKey, list[float]]:
    """Per arm the LRs of its tuning runs outside the spec's grid (its edge extensions)."""
    assert study.tune is not None
    out: dict[ArmKey, list[float]] = {}
    for r in tuning:
        if r.kind == "tune" and r.train.lr not in study.tune.lr:
            out.setdefault(run_key(study, r), []).append(r.train.lr)
    return out


def choose(
    study: Study, tuning: list[RunSpec], outcomes: dict[str, tuple[float | None, str]], unigram: Mapping[str, float] | None = None
) -> dict[ArmKey, LrChoice]:
    """``choose_lr`` over each arm's grid (the spec's and the extensions among ``tuning``) and
    the tuning seeds, from the runs' outcomes; ``unigram``: corpus -> unigram perplexity per
    token (a point with a run above it is never chosen)."""
    assert study.tune is not None
    seeds = study.tune.seeds or study.seeds[:1]
    results = tuning_results(tuning, outcomes)
    return choose_lr(results, study.tune.lr, seeds, unigram=unigram, extra=_extra(study, tuning), per_corpus=study.tune.per_corpus)


def extensions(study: Study, tuning: list[RunSpec], choices: Mapping[ArmKey, LrChoice]) -> dict[ArmKey, list[float]]:
    """Per arm its extension LRs so far plus the next one when its best LR is at an edge with
    extensions left (``tuning.extension_lrs``); {} when no arm extends (the loop's end)."""
    assert study.tune is not None
    more = extension_lrs(choices, study.tune.lr, study.tune.extend_edges)
    if not more:
        return {}
    extra = _extra(study, tuning)
    for key, lr in more.items():
        extra.setdefault(key, []).append(lr)
    return extra


def tuned_lrs(study: Study, choices: dict[ArmKey, LrChoice]) -> dict[ArmKey, float]:
    """Arm key -> chosen LR of every arm that has one. Raises ValueError naming the arms
    whose every tuning run failed, diverged or ended above unigram (no LR to train at)."""
    lost = sorted(k for k, c in choices.items() if c.lr is None)
    if lost:
        raise ValueError(f"tuning found no usable LR for {lost} (every grid point failed, diverged or ended above the unigram perplexity)")
    return {k: c.lr for k, c in choices.items() if c.lr is not None}


def plan_tuned(
    study: Study, table: ThroughputTable | None, data: dict[str, str | None] | None, lrs: Mapping[ArmKey, float]
) -> list[RunSpec]:
    """The main runs at the tuned LRs (``plan(..., tuned_lr=...)``); under ``tune.per_corpus``
    each corpus's runs are planned with its own arms' LRs (same order as one ``plan``)."""
    if study.tune is None or not study.tune.per_corpus:
        return plan(study, table, data, tuned_lr={(k[0], k[1]): lr for k, lr in lrs.items()})
    out: list[RunSpec] = []
    for corpus in study.corpus_map:
        mine = {(k[0], k[1]): lr for k, lr in lrs.items() if k[2:] == (corpus,)}
        out.extend(r for r in plan(study, table, data, tuned_lr=mine) if r.corpus_name == corpus)
    return out


def tune_record(study: Study) -> dict[str, Any]:
    """The rule a tuned study's LRs are chosen by, as the driver records it for the report
    (``track.tracking.set_tune_tag``): the initial grid, the tuning seeds, ``extend_edges``,
    ``min_steps``, ``per_corpus``, and ``unigram_bar`` (a run above its corpus's unigram
    perplexity is never chosen)."""
    assert study.tune is not None
    t = study.tune
    seeds = t.seeds or study.seeds[:1]
    return {
        "grid": list(t.lr),
        "seeds": list(seeds),
        "extend_edges": t.extend_edges,
        "min_steps": t.min_steps,
        "per_corpus": t.per_corpus,
        "unigram_bar": True,
    }


def tuning_summary(study: Study, untuned: list[RunSpec]) -> str:
    """``qkstudy plan``'s line for tuning compute, apart from the main budget: runs, tokens,
    training FLOPs and their share of the main runs' FLOPs. The main runs listed with it are
    at the recipe LR: their trained ids follow the LR tuning chooses."""
    tuning = plan_tuning(study, untuned)
    flops, main = sum(r.total_flops for r in tuning), sum(r.total_flops for r in untuned)
    edges = study.tune.extend_edges if study.tune else 0
    grows = f"; an arm whose best LR is at an edge adds up to {edges} points per side" if edges else ""
    return (
        f"tuning (not in the main budget): {len(tuning)} runs, {sum(r.tokens for r in tuning):,} tokens, "
        f"{flops:.3e} FLOPs ({flops / main:.1%} of the main runs' FLOPs){grows}; the main runs train at each "
        "(variant, scale)'s tuned LR, so their ids change from those listed"
    )
