"""The study protocol: what ``qkstudy run`` does with a study, above the run executor.

``run_study`` is the entry point (``qkstudy run`` calls it, also inside a submitted job). Every
protocol's decisions are a generator of stages (``orchestrator.plan.protocol``: independent,
branched, tuned, gated); this module is the loop that runs one (``drive``): perform a stage's
effects (console lines, experiment tags), train its runs (``runner.run_runs``: finished ones
are found by id and skipped, so a resubmit reuses them), read from MLflow what the stage asked
for (the tuning runs' status and ``final/val_loss``, the corpora's unigram perplexities from
the experiment's ``qkstudy.unigram_ppl.<corpus>`` tags, the gate's evidence) and send it back.
An untuned study is one stage.

Why tuning first: each (variant, scale) trains at its own best learning rate
(``orchestrator.plan.tuning``), and that LR is known only once its tuning runs finished. The
rule (grid argmin below the unigram perplexity, edge extensions, ``tune.min_steps``) is
recorded on the experiment (``qkstudy.tune``) so the report recomputes the same choice.

One driver across all stages: a protocol of several stages takes the study lease
(``run.driver.leasing.study_lease``) once, before its first stage, and holds it (heartbeating,
``track.lease``) through every decision and stage; each ``run_runs`` call runs under it
(``lease=``) instead of taking its own. A second ``qkstudy run`` at any point of the study,
between the stages too, is refused (exit code 2, naming the holder) or waits with ``--wait``.

A study with ``gate:`` runs the gated ladder (``run_gated_study``): after a rung the gate's
evidence (the report's paired contrasts) decides which arms stop; a stopped arm's runs at the
larger rungs are not trained (status ``gated``, the evidence recorded as an experiment tag,
``track.gate_record``). A resubmit decides again from the same finished runs, so it trains the
same runs.

Layering: this module imports ``runner`` (the executor); ``runner`` never imports it. The
gate's numbers are the report's paired contrasts (``orchestrator.report.gate.decide``), which
the run stage may not import: the CLI passes that function in (``gate_decider``).
"""

from __future__ import annotations

from contextlib import nullcontext

from rich.console import Console
from rich.markup import escape

from orchestrator.plan import protocol
from orchestrator.plan.contract import RunSpec
from orchestrator.plan.gate import GateDecider, GateEvidence
from orchestrator.plan.inputs import FitError, corpus_hashes, fit_problems, plan_study
from orchestrator.plan.planner import plan
from orchestrator.plan.protocol import Effect, Finished, GateRan, GateVerdict, Reply, RunOutcome, Say, Stage, StudyProtocol, TuneRule
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import ThroughputTable, throughput_table
from orchestrator.plan.tune_plan import plan_tuning, tuning_problems
from orchestrator.plan.tuning import KIND
from orchestrator.run.driver.leasing import study_lease
from orchestrator.run.driver.records import existing_runs
from orchestrator.run.driver.runner import DriverOptions, StudyResult, run_runs
from orchestrator.track.gate_record import record_gate, record_gate_ran
from orchestrator.track.timeline import Timeline
from orchestrator.track.tracking import client_for, ensure_experiment, run_status, set_tune_tag, study_tracking_uri, unigram_from_tags

GATED = "gated"  # the StudyResult status of a run its arm's gate stopped


def run_study(
    study: Study,
    options: DriverOptions = DriverOptions(),
    *,
    console: Console | None = None,
    timeline: Timeline | None = None,
    gate_decider: GateDecider | None = None,
) -> StudyResult:
    """Train every planned run of ``study`` that is not already finished (with ``tune:``, its
    tuning runs first, then its main runs at the chosen LRs: ``run_tuned_study``), holding the
    study's lease throughout (once, across both stages of a tuned study).

    Args:
        options: the Ray address, worker logs, packs in flight, waiting for another driver's
            lease, provenance (``runner.DriverOptions``), the same for every stage.
        console: where progress goes (default: stderr).
        timeline: the command's start-up marks so far (``track.timeline``); the first stage's
            runs continue it, a later stage's start their own at its start.
        gate_decider: with ``gate:``, the gate's decision (``orchestrator.report.gate.decide``;
            ``run_gated_study``).

    Returns:
        StudyResult with every run's final state (also in MLflow, which is the record).

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``options.wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: see ``runner.run_runs``; also a corpus whose files
            cannot be read to compute its content hash.
        ValueError: a study with ``gate:`` and no ``gate_decider``.
    """
    if study.gate is not None and gate_decider is None:
        raise ValueError(f"study {study.name!r} has a gate: run_study needs gate_decider (orchestrator.report.gate.decide)")
    if study.gate is not None and gate_decider is not None:
        return run_gated_study(study, gate_decider, options, console=console, timeline=timeline)
    if study.tune is not None:
        return run_tuned_study(study, options, console=console, timeline=timeline)
    runs = plan_study(study)
    steps = protocol.branched(runs) if study.protocol == "branches" else protocol.independent(runs)
    return drive(study, steps, options, leased=False, console=console, timeline=timeline)


def tuning_outcomes(tracking_uri: str, study_name: str, runs: list[RunSpec]) -> dict[str, tuple[float | None, str]]:
    """run_id -> (``final/val_loss`` in nats/token or None, status tag) of those of ``runs``
    that MLflow holds as tuning runs."""
    _, _, existing = existing_runs(tracking_uri, study_name, KIND)
    ids = {r.run_id for r in runs}
    return {rid: (rec.data.metrics.get("final/val_loss"), run_status(rec)) for rid, rec in existing.items() if rid in ids}


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


def _perform(effects: tuple[Effect, ...], uri: str, study_name: str, console: Console) -> None:
    """Carry out a protocol's effects in order: print, or record on the study's experiment."""
    for e in effects:
        if isinstance(e, Say):
            console.print(e.text)
            continue
        client = client_for(uri)
        exp_id = ensure_experiment(client, study_name)
        if isinstance(e, TuneRule):
            set_tune_tag(client, exp_id, dict(e.record))
        elif isinstance(e, GateVerdict):
            ev = e.evidence
            record_gate(client, exp_id, ev)
            colour = "red" if ev.stopped else "green"
            console.print(f"gate [{colour}]{escape(ev.variant)}[/] ({escape(ev.corpus)}): {escape(ev.sentence())}")
        elif isinstance(e, GateRan):
            record_gate_ran(client, exp_id, e.gate, e.scale)


def _reply(study: Study, stage: Stage, uri: str, decide: GateDecider | None) -> Reply:
    """What ``stage`` asked for, read from MLflow once it trained: the tuning runs' outcomes and
    the corpora's unigram perplexities, the gate's evidence (through ``decide``)."""
    runs: dict[str, RunOutcome] = {}
    unigram: dict[str, float] = {}
    if stage.wants_tuning:
        runs = {rid: RunOutcome(status, loss) for rid, (loss, status) in tuning_outcomes(uri, study.name, list(stage.runs)).items()}
        unigram = unigram_ppls(uri, study.name)
    gate: tuple[GateEvidence, ...] = ()
    if (ask := stage.gate) is not None and study.gate is not None and decide is not None:
        gate = tuple(decide(uri, study.name, study.reference, study.gate, ask.scale, ask.rung, list(ask.variants)))
    return Reply(runs, unigram, gate)


def _advance(steps: StudyProtocol, reply: Reply | None) -> Stage | Finished:
    """The protocol's next stage after ``reply`` (None: its first), or its return value."""
    try:
        return steps.send(reply)  # type: ignore[arg-type]  # a fresh generator takes None first
    except StopIteration as stop:
        return stop.value


def drive(
    study: Study,
    steps: StudyProtocol,
    options: DriverOptions,
    *,
    leased: bool,
    decide: GateDecider | None = None,
    console: Console | None = None,
    timeline: Timeline | None = None,
) -> StudyResult:
    """Run a protocol (``orchestrator.plan.protocol``): each stage's effects and runs
    (``run_runs``), then what it asked for sent back, until the protocol returns. ``leased``:
    hold the study lease across every stage (else ``run_runs`` takes it for its one call);
    ``timeline`` continues into the first stage's runs only; ``options`` as ``run_runs`` takes
    them. Returns every stage's statuses, a gate's stopped runs ``gated``."""
    console = console or Console(stderr=True)
    uri, storage = study_tracking_uri(study), study.resolved_storage_path
    result = StudyResult()
    held = study_lease(study.name, storage, console, wait=options.wait) if leased else nullcontext(None)
    with held as lease:
        step = _advance(steps, None)
        while isinstance(step, Stage):
            _perform(step.before, uri, study.name, console)
            res = run_runs(list(step.runs), study.name, uri, storage, options, console=console, lease=lease, timeline=timeline)
            _merge(result, res)
            timeline = None  # a later stage's runs start their own timeline
            _perform(step.after, uri, study.name, console)
            step = _advance(steps, _reply(study, step, uri, decide))
        _perform(step.after, uri, study.name, console)
    for rid, why in step.gated.items():
        result.status[rid], result.reasons[rid] = GATED, why
    return result


def run_tuned_study(
    study: Study, options: DriverOptions = DriverOptions(), *, console: Console | None = None, timeline: Timeline | None = None
) -> StudyResult:
    """Tuning runs, the LR choice, then the main runs (module docstring; the decisions are
    ``orchestrator.plan.protocol.tuned``), all under one study lease taken here (the arguments
    as ``run_study`` takes them).

    Returns both stages' statuses in one StudyResult; when a tuning run did not finish or an
    arm has no usable LR the main runs are not planned (their absence leaves ``ok`` False
    only through the tuning runs' own statuses, which say why).

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``options.wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: see ``runner.run_runs``.
        orchestrator.plan.inputs.FitError: a tuning or main run over ``budget.max_epochs`` or the
            declared device memory, before the lease, Ray or MLflow.
    """
    table, data, untuned = _checked_plan(study)
    return drive(study, protocol.tuned(study, (table, data), untuned), options, leased=True, console=console, timeline=timeline)


def run_gated_study(
    study: Study,
    decide: GateDecider,
    options: DriverOptions = DriverOptions(),
    *,
    console: Console | None = None,
    timeline: Timeline | None = None,
) -> StudyResult:
    """The gated ladder (module docstring; the decisions are ``orchestrator.plan.protocol.gated``)
    under one study lease taken here (the other arguments as ``run_study`` takes them).
    ``decide``: the gate's evidence after each rung but the last
    (``orchestrator.plan.gate.GateDecider``).

    Returns every run's status; a stopped arm's runs at the larger rungs are ``gated``, with
    the evidence's sentence as their reason.

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``options.wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: see ``runner.run_runs``.
        orchestrator.plan.inputs.FitError: a run over ``budget.max_epochs`` or the declared
            device memory, before the lease, Ray or MLflow.
        ValueError: ``study`` has no ``gate:``.
    """
    if study.gate is None:
        raise ValueError(f"study {study.name!r} has no gate: run it with run_study")
    table, data, runs = _checked_plan(study)  # with tune:, at the recipe LR: each rung's tuning replaces it
    steps = protocol.gated(study, (table, data), runs)
    return drive(study, steps, options, leased=True, decide=decide, console=console, timeline=timeline)
