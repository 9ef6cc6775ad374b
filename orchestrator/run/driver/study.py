"""The study protocol: what ``qkstudy run`` does with a study, above the run executor.

``run_study`` is the entry point (``qkstudy run`` calls it, also inside a submitted job). An untuned
study is one ``runner.run_runs`` call over its planned runs. A study with ``tune:`` runs the
tuned protocol (``run_tuned_study``): its tuning runs first, then its main runs at the chosen
LRs.

Why tuning first: each (variant, scale) trains at its own best learning rate
(``orchestrator.plan.tuning``), and that LR is known only once its tuning runs finished. The
protocol plans the tuning runs (``orchestrator.plan.tune_plan.plan_tuning``), trains them
through the normal run path (``run_runs``: finished ones are found by id and skipped, so a
resubmit reuses them), reads their final val loss and status from MLflow, chooses per arm the
grid argmin, and plans and trains the main runs with ``tuned_lr`` (the LR enters their
identity through ``train.lr``). A run above its corpus's unigram perplexity (the experiment's
``qkstudy.unigram_ppl.<corpus>`` tags, set by the tuning stage's ``run_runs``) is never chosen;
an arm whose best LR is at an edge of its grid gets one more point beyond it per round
(``tune_plan.extensions``, at most ``tune.extend_edges`` per side), trained in the same stage,
until every arm is interior or at its bound. The rule is recorded on the experiment
(``qkstudy.tune``) so the report recomputes the same choice.

One driver across both stages: the protocol takes the study lease (``run.driver.leasing.study_lease``)
once, before the tuning runs, and holds it (heartbeating, ``track.lease``) through the LR
choice and the main runs; both ``run_runs`` calls run under it (``lease=``) instead of taking
their own. A second ``qkstudy run`` at any point of the study, between the stages too, is
refused (exit code 2, naming the holder) or waits with ``--wait``.

A study with ``gate:`` runs the gated ladder (``run_gated_study``, ``orchestrator.plan.gate``):
rung by rung (scales by the reference's N), each rung one ``run_runs`` call under one study
lease; after a rung the gate's decider compares every still-training variant with the
reference there, and a stopped arm's runs at the larger rungs are not trained (status
``gated``, the evidence recorded as an experiment tag, ``track.gate_record``). A resubmit
decides again from the same finished runs, so it trains the same runs. With ``tune:`` too, each
rung first tunes the arms still training there (the tuned protocol's stage, on that rung's
runs only), then trains them at their chosen LRs: a stopped arm is neither tuned nor trained
at the larger rungs.

Layering: this module imports ``runner`` (the executor); ``runner`` never imports it. The
gate's numbers are the report's paired contrasts (``orchestrator.report.gate.decide``), which
the run stage may not import: the CLI passes that function in (``gate_decider``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.gate import GateDecider, GateEvidence, GateSpec, rungs
from orchestrator.plan.inputs import FitError, corpus_hashes, fit_problems, plan_study
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import ThroughputTable, throughput_table
from orchestrator.plan.tune_plan import choose, extensions, plan_tuned, plan_tuning, run_key, tune_record, tuned_lrs, tuning_problems
from orchestrator.plan.tuning import KIND, ArmKey, LrChoice
from orchestrator.run.driver.leasing import study_lease
from orchestrator.run.driver.records import existing_runs
from orchestrator.run.driver.runner import StudyResult, run_runs
from orchestrator.track.gate_record import record_gate, record_gate_ran
from orchestrator.track.provenance import Provenance
from orchestrator.track.timeline import Timeline
from orchestrator.track.tracking import client_for, ensure_experiment, run_status, set_tune_tag, study_tracking_uri, unigram_from_tags

GATED = "gated"  # the StudyResult status of a run its arm's gate stopped


def run_study(
    study: Study,
    *,
    address: str | None = None,
    console: Console | None = None,
    verbose: bool = False,
    max_in_flight: int | None = None,
    wait: bool = False,
    timeline: Timeline | None = None,
    gate_decider: GateDecider | None = None,
    provenance: Provenance | None = None,
) -> StudyResult:
    """Train every planned run of ``study`` that is not already finished (with ``tune:``, its
    tuning runs first, then its main runs at the chosen LRs: ``run_tuned_study``), holding the
    study's lease throughout (once, across both stages of a tuned study).

    Args:
        address: Ray cluster address (else RAY_ADDRESS, else a local Ray).
        console: where progress goes (default: stderr).
        verbose: show worker logs.
        max_in_flight: runs handed to Ray at once (default: as many as the cluster holds at
            once); Ray decides where each run's workers go.
        wait: when another driver holds the study's lease, wait for it (``run.driver.leasing``).
        timeline: the command's start-up marks so far (``track.timeline``); the first stage's
            runs continue it, a later stage's start their own at its start.
        gate_decider: with ``gate:``, the gate's decision (``orchestrator.report.gate.decide``;
            ``run_gated_study``).
        provenance: the driver's code, spec and environment (``track.provenance.gather``),
            tagged on every run it creates or resumes.

    Returns:
        StudyResult with every run's final state (also in MLflow, which is the record).

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: see ``runner.run_runs``; also a corpus whose files
            cannot be read to compute its content hash.
        ValueError: a study with ``gate:`` and no ``gate_decider``.
    """
    if study.gate is not None and gate_decider is None:
        raise ValueError(f"study {study.name!r} has a gate: run_study needs gate_decider (orchestrator.report.gate.decide)")
    kw: dict[str, Any] = dict(  # the arguments every protocol takes
        address=address, console=console, verbose=verbose, max_in_flight=max_in_flight, wait=wait, timeline=timeline, provenance=provenance
    )
    if study.gate is not None and gate_decider is not None:
        return run_gated_study(study, gate_decider, **kw)
    if study.tune is not None:
        return run_tuned_study(study, **kw)
    return run_runs(plan_study(study), study.name, study_tracking_uri(study), study.resolved_storage_path, **kw)


def tuning_outcomes(tracking_uri: str, study_name: str, runs: list[RunSpec]) -> dict[str, tuple[float | None, str]]:
    """run_id -> (``final/val_loss`` in nats/token or None, status tag) of those of ``runs``
    that MLflow holds as tuning runs."""
    _, _, existing = existing_runs(tracking_uri, study_name, KIND)
    ids = {r.run_id for r in runs}
    return {rid: (rec.data.metrics.get("final/val_loss"), run_status(rec)) for rid, rec in existing.items() if rid in ids}


def _print_choices(choices: dict[ArmKey, LrChoice], console: Console) -> None:
    for _, c in sorted(choices.items()):
        notes = [c.note] if c.note else []
        if c.above_unigram:
            notes.append("above unigram at lr " + ", ".join(f"{g:g}" for g in c.above_unigram))
        said = f" [yellow]({'; '.join(notes)})[/]" if notes else ""
        arm = f"{c.variant} @ {c.scale}" + (f" on {c.corpus}" if c.corpus else "")
        console.print(f"tuned {arm}: lr {c.lr:g} (tuning val loss {c.val_loss:.4f}){said}")


def unigram_ppls(tracking_uri: str, study_name: str) -> dict[str, float]:
    """corpus -> unigram perplexity per token, from the study's experiment tags ({} before any)."""
    exp = client_for(tracking_uri).get_experiment_by_name(study_name)
    return {c: float(u["val_ppl"]) for c, u in unigram_from_tags(exp.tags).items()} if exp is not None else {}


def _checked_plan(study: Study) -> tuple[ThroughputTable | None, dict[str, str | None], list[RunSpec]]:
    """(throughput table, corpus hashes, runs) of ``study``, its runs at the recipe LR. The main
    runs' tokens and shapes are known before tuning (it picks only their LR), so every run and,
    with ``tune:``, every tuning run is checked here, before the lease, Ray or MLflow. Raises
    FitError: a run over ``budget.max_epochs`` or the declared device memory, or tuning runs too
    short to rank learning rates (``tune.min_steps``)."""
    table, data = throughput_table(study), corpus_hashes(study, True)
    runs = plan(study, table, data)
    problems = tuning_problems(study, runs) if study.tune is not None else []
    tuning = plan_tuning(study, runs) if study.tune is not None and not problems else []
    if problems := problems + fit_problems(study, tuning + runs):
        raise FitError(problems)
    return table, data, runs


def _merge(into: StudyResult, res: StudyResult) -> StudyResult:
    """Add ``res``'s statuses, reasons and seconds to ``into`` (returned). A run handed again
    (a tuning run in an edge-extension round) comes back ``skipped``: what it did first stays."""
    into.status.update({k: v for k, v in res.status.items() if v != "skipped" or k not in into.status})
    into.reasons.update(res.reasons)
    into.wall_s += res.wall_s
    return into


def _staged(study: Study, lease: Any, **run_kw: Any) -> Callable[..., StudyResult]:
    """``stage(runs, timeline=None)``: ``run_runs`` of ``study``'s ``runs`` under ``lease``
    (taken by the caller and held across its stages), with ``run_kw`` (address, console, ...)."""
    uri, storage = study_tracking_uri(study), study.resolved_storage_path

    def stage(runs: list[RunSpec], timeline: Timeline | None = None) -> StudyResult:
        return run_runs(runs, study.name, uri, storage, lease=lease, timeline=timeline, **run_kw)

    return stage


def _tune(
    study: Study,
    untuned: list[RunSpec],
    tuning: list[RunSpec],
    stage: Callable[..., StudyResult],
    uri: str,
    console: Console,
    timeline: Timeline | None,
) -> tuple[StudyResult, list[RunSpec], dict[ArmKey, LrChoice]]:
    """The tuning stage: the grid's runs, then round by round the runs of the points edge
    extensions add (``tune_plan.extensions``) until none does. Returns the stage's statuses,
    every tuning run and the final choices."""
    assert study.tune is not None
    console.print(f"[bold]tuning[/]: {len(tuning)} runs ({len(study.tune.lr)} learning rates per arm)")
    result = stage(tuning, timeline)
    client = client_for(uri)
    set_tune_tag(client, ensure_experiment(client, study.name), tune_record(study))
    while True:
        choices = choose(study, tuning, tuning_outcomes(uri, study.name, tuning), unigram_ppls(uri, study.name))
        known = {r.run_id for r in tuning}
        extra = extensions(study, tuning, choices)
        new = [r for r in plan_tuning(study, untuned, extra) if r.run_id not in known] if extra else []
        if not new:
            return result, tuning, choices
        grown = sorted({f"{'/'.join(run_key(study, r))} to lr {r.train.lr:g}" for r in new})
        console.print(f"[bold]tuning[/]: a best LR at the grid's edge; extending {', '.join(grown)} ({len(new)} runs)")
        # every tuning run again, not only the new: records of an arm's slot that a submission
        # does not plan are superseded (run.driver.records); finished ones are skipped by id
        tuning = tuning + new
        _merge(result, stage(tuning))


def _chosen_lrs(study: Study, tuning: list[RunSpec], choices: dict[ArmKey, LrChoice], console: Console) -> dict[ArmKey, float] | None:
    """Each tuned arm's LR, printed; None (and why, printed) while a tuning run has no result or
    an arm has no usable LR: its main runs are then not planned."""
    incomplete = sorted(k for k, c in choices.items() if not c.complete) + sorted({run_key(study, r) for r in tuning} - set(choices))
    try:
        if incomplete:
            raise ValueError(f"tuning runs of {incomplete} have no result yet")
        lrs = tuned_lrs(study, choices)
    except ValueError as e:
        console.print(f"[red]main runs not planned[/]: {e}")
        return None
    _print_choices(choices, console)
    return lrs


def run_tuned_study(
    study: Study,
    *,
    address: str | None = None,
    console: Console | None = None,
    verbose: bool = False,
    max_in_flight: int | None = None,
    wait: bool = False,
    timeline: Timeline | None = None,
    provenance: Provenance | None = None,
) -> StudyResult:
    """Tuning runs, the LR choice, then the main runs (module docstring), all under one study
    lease taken here (``wait`` as in ``run_study``; the other arguments as ``run_runs`` takes
    them).

    Returns both stages' statuses in one StudyResult; when a tuning run did not finish or an
    arm has no usable LR the main runs are not planned (their absence leaves ``ok`` False
    only through the tuning runs' own statuses, which say why).

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: see ``runner.run_runs``.
        orchestrator.plan.inputs.FitError: a tuning or main run over ``budget.max_epochs`` or the
            declared device memory, before the lease, Ray or MLflow.
    """
    console = console or Console(stderr=True)
    uri, storage = study_tracking_uri(study), study.resolved_storage_path
    table, data, untuned = _checked_plan(study)
    tuning = plan_tuning(study, untuned)
    with study_lease(study.name, storage, console, wait=wait) as lease:
        stage = _staged(study, lease, address=address, console=console, verbose=verbose, max_in_flight=max_in_flight, provenance=provenance)
        result, tuning, choices = _tune(study, untuned, tuning, stage, uri, console, timeline)
        lrs = _chosen_lrs(study, tuning, choices, console)
        if lrs is None:
            return result
        main = stage(plan_tuned(study, table, data, lrs))
    return _merge(main, result)


def run_gated_study(
    study: Study,
    decide: GateDecider,
    *,
    address: str | None = None,
    console: Console | None = None,
    verbose: bool = False,
    max_in_flight: int | None = None,
    wait: bool = False,
    timeline: Timeline | None = None,
    provenance: Provenance | None = None,
) -> StudyResult:
    """The gated ladder (module docstring) under one study lease taken here (the other
    arguments as ``run_study`` takes them). ``decide``: the gate's evidence after each rung
    but the last (``orchestrator.plan.gate.GateDecider``).

    Returns every run's status; a stopped arm's runs at the larger rungs are ``gated``, with
    the evidence's sentence as their reason.

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: see ``runner.run_runs``.
        orchestrator.plan.inputs.FitError: a run over ``budget.max_epochs`` or the declared
            device memory, before the lease, Ray or MLflow.
        ValueError: ``study`` has no ``gate:``.
    """
    if study.gate is None:
        raise ValueError(f"study {study.name!r} has no gate: run it with run_study")
    gate = study.gate
    console = console or Console(stderr=True)
    uri, storage = study_tracking_uri(study), study.resolved_storage_path
    table, data, runs = _checked_plan(study)  # with tune:, at the recipe LR: each rung's tuning replaces it
    ladder = rungs(study.reference, runs)
    result = StudyResult()
    stopped: dict[tuple[str, str], GateEvidence] = {}
    with study_lease(study.name, storage, console, wait=wait) as lease:
        stage = _staged(study, lease, address=address, console=console, verbose=verbose, max_in_flight=max_in_flight, provenance=provenance)
        for k, scale in enumerate(ladder):
            todo = [r for r in runs if r.scale == scale and (r.corpus_name, r.variant) not in stopped]
            console.print(f"[bold]rung {k + 1}/{len(ladder)}[/] ({scale}): {len(todo)} runs")
            first = timeline if k == 0 else None  # a later rung's runs start their own timeline
            if study.tune is not None:  # only the arms still training are tuned, at this rung only
                at_lrs, tuned = _tuned_rung(study, todo, (table, data), stage, uri, console, first)
                if at_lrs is None:
                    return _merge(result, tuned)
                todo, first = at_lrs, None
                _merge(result, tuned)
            _merge(result, stage(todo, first))
            if k + 1 < len(ladder):
                alive = {(r.corpus_name, r.variant) for r in todo}
                stopped |= _gate_rung(study, gate, decide, uri, scale, k + 1, alive, ladder[k + 1 :], console)
    for r in runs:
        if (ev := stopped.get((r.corpus_name, r.variant))) is not None and r.scale in ev.skipped:
            result.status[r.run_id], result.reasons[r.run_id] = GATED, ev.sentence()
    return result


def _tuned_rung(
    study: Study,
    todo: list[RunSpec],
    inputs: tuple[ThroughputTable | None, dict[str, str | None]],
    stage: Callable[..., StudyResult],
    uri: str,
    console: Console,
    timeline: Timeline | None,
) -> tuple[list[RunSpec] | None, StudyResult]:
    """One rung of a tuned gated ladder: ``todo`` (its runs at the recipe LR) tuned by the
    tuning stage on those runs' arms only, returned at the LRs it chose (None when it could not
    choose, printed) with the tuning runs' statuses. ``inputs``: the study's throughput table
    and corpus hashes, as planned."""
    result, tuning, choices = _tune(study, todo, plan_tuning(study, todo), stage, uri, console, timeline)
    lrs = _chosen_lrs(study, tuning, choices, console)
    slots = {(r.corpus_name, r.variant, r.scale) for r in todo}
    return (None if lrs is None else [r for r in plan_tuned(study, *inputs, lrs) if (r.corpus_name, r.variant, r.scale) in slots]), result


def _gate_rung(
    study: Study,
    gate: GateSpec,
    decide: GateDecider,
    uri: str,
    scale: str,
    rung: int,
    alive: set[tuple[str, str]],
    larger: list[str],
    console: Console,
) -> dict[tuple[str, str], GateEvidence]:
    """The gate after rung ``rung`` (``scale``) on the ``alive`` (corpus, variant) arms (those
    that trained there): each one's evidence printed and recorded (``track.gate_record``; a
    stopped arm's with the ``larger`` scales it skips); returns the stopped ones' evidence by
    (corpus, variant). An arm stopped earlier is not decided again, so its record stays."""
    client = client_for(uri)
    exp_id = ensure_experiment(client, study.name)
    out = {}
    for ev in decide(uri, study.name, study.reference, gate, scale, rung, sorted({v for _, v in alive})):
        if (ev.corpus, ev.variant) not in alive:
            continue  # stopped on this corpus at an earlier rung, still training on another
        if ev.stopped:
            ev = dataclasses.replace(ev, skipped=tuple(larger))
            out[(ev.corpus, ev.variant)] = ev
        record_gate(client, exp_id, ev)
        colour = "red" if ev.stopped else "green"
        console.print(f"gate [{colour}]{escape(ev.variant)}[/] ({escape(ev.corpus)}): {escape(ev.sentence())}")
    record_gate_ran(client, exp_id, gate, scale)
    return out
