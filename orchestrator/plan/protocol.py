"""Study protocols as generators of stages: every decision of a study, none of its I/O.

Why: the tuned and gated protocols decide between trainings (extend an LR grid at an edge
optimum, skip a point above the unigram perplexity, stop a gated arm), and a decision that
lives beside the executor can only be tested by training. Here each protocol is a generator:
it yields a ``Stage`` (the runs to train, what to say and record around them, what to read
back), receives that stage's ``Reply`` through ``send()`` (per tuning run its status and final
val loss, the corpora's unigram perplexities, the gate's evidence) and decides the next stage;
its return value (``StopIteration.value``) is a ``Finished``: what the study did that no stage
shows (the runs a gate stopped, the tuned LRs). The driver (``orchestrator.run.driver.study``)
is one loop: perform a stage's ``before`` effects, train its runs, perform its ``after``
effects, read what it asks, send it back. A unit test drives the same generator with made-up
replies (``tests/orchestrator/plan/test_protocol.py``).

Effects are plain records (``Say``, ``TuneRule``, ``GateVerdict``, ``GateRan``) the driver
carries out in order, so a resubmit that reads the same finished runs yields the same stages
and the same records.

* ``independent``, ``branched``: one stage, the planned runs (a branched family's trunk and
  cooldowns are planned by ``orchestrator.plan.branch_runs``; the executor orders them).
* ``tuned``: the tuning stage (grid, then one edge extension round per stage,
  ``tune_plan.extensions``), the LR choice, the main runs at the chosen LRs.
* ``gated``: rung by rung by the reference's N (``gate.rungs``); after every rung but the
  last the gate's evidence decides which arms stop (``gate.stops``); with ``tune:`` each rung
  first tunes the arms still training there.

Pure: no Ray, no MLflow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.gate import GateEvidence, GateSpec, rungs, stops
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import ThroughputTable
from orchestrator.plan.tune_plan import choose, extensions, plan_tuned, plan_tuning, run_key, tune_record, tuned_lrs
from orchestrator.plan.tuning import ArmKey, LrChoice


@dataclass(frozen=True)
class Say:
    """A console line (rich markup) the driver prints."""

    text: str


@dataclass(frozen=True)
class TuneRule:
    """The tuned study's LR rule (``tune_plan.tune_record``), recorded on the experiment
    (``qkstudy.tune``) so the report recomputes the same choice."""

    record: Mapping[str, Any]


@dataclass(frozen=True)
class GateVerdict:
    """The gate's verdict on one arm at one rung: recorded on the experiment
    (``qkstudy.gate.<corpus>.<variant>``) and printed; a stopped arm's ``skipped`` names the
    larger rungs it does not train at."""

    evidence: GateEvidence


@dataclass(frozen=True)
class GateRan:
    """The gate ran after the rung at ``scale`` (``qkstudy.gate_ran``)."""

    gate: GateSpec
    scale: str


Effect = Say | TuneRule | GateVerdict | GateRan


@dataclass(frozen=True)
class GateAsk:
    """What the gate needs after a stage: the evidence of ``variants`` against the reference at
    ``scale`` (rung ``rung``, 1-based), from the study's finished runs."""

    scale: str
    rung: int
    variants: tuple[str, ...]


@dataclass(frozen=True)
class Stage:
    """One step of a protocol: ``runs`` trained together (under the study lease when the
    protocol has several stages), ``before`` and ``after`` effects around the training,
    and what the protocol needs back: ``wants_tuning`` (the tuning runs' outcomes and the
    corpora's unigram perplexities), ``gate`` (the gate's evidence)."""

    label: str
    runs: tuple[RunSpec, ...]
    before: tuple[Effect, ...] = ()
    after: tuple[Effect, ...] = ()
    wants_tuning: bool = False
    gate: GateAsk | None = None


@dataclass(frozen=True)
class RunOutcome:
    """A run as MLflow holds it after a stage: its status tag and ``final/val_loss``
    (nats/token; None while it has none)."""

    status: str
    val_loss: float | None


@dataclass(frozen=True)
class Reply:
    """What the driver sends back after a stage, as far as the stage asked: ``runs`` (run_id ->
    outcome of the tuning runs MLflow holds), ``unigram`` (corpus -> unigram perplexity per
    token), ``gate`` (the evidence of every asked arm)."""

    runs: Mapping[str, RunOutcome] = field(default_factory=dict)
    unigram: Mapping[str, float] = field(default_factory=dict)
    gate: tuple[GateEvidence, ...] = ()


@dataclass(frozen=True)
class Finished:
    """A protocol's return value: ``after`` (effects once every stage trained, e.g. why the
    main runs were not planned), ``gated`` (run_id -> why a stopped arm's run is not trained),
    ``stopped`` ((corpus, variant) -> the evidence that stopped it), ``lrs`` (every tuned
    arm's chosen LR)."""

    after: tuple[Effect, ...] = ()
    gated: Mapping[str, str] = field(default_factory=dict)
    stopped: Mapping[tuple[str, str], GateEvidence] = field(default_factory=dict)
    lrs: Mapping[ArmKey, float] = field(default_factory=dict)


StudyProtocol = Generator[Stage, Reply, Finished]
Inputs = tuple[ThroughputTable | None, dict[str, str | None] | None]  # the study's throughput table and corpus hashes


def independent(runs: Sequence[RunSpec]) -> StudyProtocol:
    """Every run from scratch, in one stage."""
    yield Stage("runs", tuple(runs))
    return Finished()


def branched(runs: Sequence[RunSpec]) -> StudyProtocol:
    """``protocol: branches``: the planned runs in one stage; each reference family's trunk
    saves a checkpoint at every branch point and its branches start there (the plan's
    ``branch_step`` and ``branch_points``; the executor trains a trunk before its branches)."""
    yield Stage("branches", tuple(runs))
    return Finished()


def choice_lines(choices: Mapping[ArmKey, LrChoice]) -> list[str]:
    """One console line per tuned arm: its LR, tuning val loss and why a point was passed over."""
    out = []
    for _, c in sorted(choices.items()):
        notes = [c.note] if c.note else []
        if c.above_unigram:
            notes.append("above unigram at lr " + ", ".join(f"{g:g}" for g in c.above_unigram))
        said = f" [yellow]({'; '.join(notes)})[/]" if notes else ""
        arm = f"{c.variant} @ {c.scale}" + (f" on {c.corpus}" if c.corpus else "")
        out.append(f"tuned {arm}: lr {c.lr:g} (tuning val loss {c.val_loss:.4f}){said}")
    return out


def _chosen(study: Study, tuning: list[RunSpec], choices: dict[ArmKey, LrChoice]) -> tuple[dict[ArmKey, float] | None, tuple[Say, ...]]:
    """Each tuned arm's LR and the lines saying so; None (and why) while a tuning run has no
    result or an arm has no usable LR: its main runs are then not planned."""
    incomplete = sorted(k for k, c in choices.items() if not c.complete) + sorted({run_key(study, r) for r in tuning} - set(choices))
    try:
        if incomplete:
            raise ValueError(f"tuning runs of {incomplete} have no result yet")
        lrs = tuned_lrs(study, choices)
    except ValueError as e:
        return None, (Say(f"[red]main runs not planned[/]: {e}"),)
    return lrs, tuple(Say(line) for line in choice_lines(choices))


def tuning(
    study: Study, untuned: list[RunSpec], before: tuple[Effect, ...] = ()
) -> Generator[Stage, Reply, tuple[dict[ArmKey, float] | None, tuple[Say, ...]]]:
    """The tuning stage of ``untuned``'s arms: the grid's runs, then round by round the runs
    of the points edge extensions add (``tune_plan.extensions``) until none does. Returns each
    arm's chosen LR (None when there is none to train at) and the lines saying so."""
    assert study.tune is not None
    runs = plan_tuning(study, untuned)
    say = Say(f"[bold]tuning[/]: {len(runs)} runs ({len(study.tune.lr)} learning rates per arm)")
    got = yield Stage("tuning", tuple(runs), (*before, say), (TuneRule(tune_record(study)),), wants_tuning=True)
    while True:
        outcomes = {rid: (o.val_loss, o.status) for rid, o in got.runs.items()}
        choices = choose(study, runs, outcomes, got.unigram)
        known = {r.run_id for r in runs}
        extra = extensions(study, runs, choices)
        new = [r for r in plan_tuning(study, untuned, extra) if r.run_id not in known] if extra else []
        if not new:
            return _chosen(study, runs, choices)
        grown = sorted({f"{'/'.join(run_key(study, r))} to lr {r.train.lr:g}" for r in new})
        say = Say(f"[bold]tuning[/]: a best LR at the grid's edge; extending {', '.join(grown)} ({len(new)} runs)")
        # every tuning run again, not only the new: records of an arm's slot that a submission
        # does not plan are superseded (run.driver.records); finished ones are skipped by id
        runs = runs + new
        got = yield Stage("tuning: edge extension", tuple(runs), (say,), wants_tuning=True)


def tuned(study: Study, inputs: Inputs, untuned: list[RunSpec]) -> StudyProtocol:
    """Tuning runs, the LR choice, then the main runs at the chosen LRs; ``untuned``: the main
    runs at the recipe LR, ``inputs`` the throughput table and corpus hashes they were planned
    with. With no usable LR the main runs are not planned (``Finished.after`` says why)."""
    lrs, said = yield from tuning(study, untuned)
    if lrs is None:
        return Finished(after=said)
    yield Stage("main", tuple(plan_tuned(study, *inputs, lrs)), said)
    return Finished(lrs=lrs)


def gate_verdicts(
    gate: GateSpec, evidence: Sequence[GateEvidence], alive: set[tuple[str, str]], larger: Sequence[str]
) -> tuple[dict[tuple[str, str], GateEvidence], list[GateVerdict]]:
    """The gate after one rung on the ``alive`` (corpus, variant) arms (those that trained
    there): the stopped arms' evidence (with the ``larger`` scales they skip) by arm, and one
    verdict per alive arm to record. An arm stopped earlier is not decided again, so its
    record stays. The rule is ``gate.stops`` on each evidence's Δ and interval."""
    out, verdicts = {}, []
    for ev in evidence:
        if (ev.corpus, ev.variant) not in alive:
            continue  # stopped on this corpus at an earlier rung, still training on another
        ev = dataclasses.replace(ev, stopped=stops(gate, ev.dloss, ev.low))
        if ev.stopped:
            ev = dataclasses.replace(ev, skipped=tuple(larger))
            out[(ev.corpus, ev.variant)] = ev
        verdicts.append(GateVerdict(ev))
    return out, verdicts


def _tuned_rung(
    study: Study, todo: list[RunSpec], inputs: Inputs, before: tuple[Effect, ...]
) -> Generator[Stage, Reply, tuple[list[RunSpec] | None, dict[ArmKey, float], tuple[Effect, ...]]]:
    """One rung of a tuned gated ladder: ``todo`` (its runs at the recipe LR) tuned on those
    runs' arms only; returns them at the chosen LRs (None when there is none), the LRs, and the
    effects to perform before training them."""
    lrs, said = yield from tuning(study, todo, before)
    if lrs is None:
        return None, {}, said
    slots = {(r.corpus_name, r.variant, r.scale) for r in todo}
    return [r for r in plan_tuned(study, *inputs, lrs) if (r.corpus_name, r.variant, r.scale) in slots], lrs, said


def gated(study: Study, inputs: Inputs, runs: list[RunSpec]) -> StudyProtocol:
    """The gated ladder of ``runs`` (with ``tune:``, at the recipe LR: each rung's tuning
    replaces it). Returns the stopped arms and their untrained runs; a rung whose tuning found
    no usable LR ends the ladder there (nothing reported gated)."""
    gate = study.gate
    assert gate is not None
    ladder = rungs(study.reference, runs)
    stopped: dict[tuple[str, str], GateEvidence] = {}
    lrs: dict[ArmKey, float] = {}
    pending: tuple[Effect, ...] = ()  # the last gate's verdicts, performed before the next rung
    for k, scale in enumerate(ladder):
        todo = [r for r in runs if r.scale == scale and (r.corpus_name, r.variant) not in stopped]
        before: tuple[Effect, ...] = (*pending, Say(f"[bold]rung {k + 1}/{len(ladder)}[/] ({scale}): {len(todo)} runs"))
        if study.tune is not None:  # only the arms still training are tuned, at this rung only
            at_lrs, chosen, before = yield from _tuned_rung(study, todo, inputs, before)
            if at_lrs is None:
                return Finished(after=before, stopped=stopped, lrs=lrs)
            todo, lrs = at_lrs, lrs | chosen
        alive = {(r.corpus_name, r.variant) for r in todo}
        ask = GateAsk(scale, k + 1, tuple(sorted({v for _, v in alive}))) if k + 1 < len(ladder) else None
        got = yield Stage(f"rung {k + 1}/{len(ladder)} ({scale})", tuple(todo), before, gate=ask)
        pending = ()
        if ask is not None:
            more, verdicts = gate_verdicts(gate, got.gate, alive, ladder[k + 1 :])
            stopped |= more
            pending = (*verdicts, GateRan(gate, scale))
    gated_runs = {
        r.run_id: ev.sentence() for r in runs if (ev := stopped.get((r.corpus_name, r.variant))) is not None and r.scale in ev.skipped
    }
    return Finished(gated=gated_runs, stopped=stopped, lrs=lrs)
