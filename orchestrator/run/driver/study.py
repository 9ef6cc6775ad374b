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
identity through ``train.lr``).

One driver across both stages: the protocol takes the study lease (``run.driver.leasing.study_lease``)
once, before the tuning runs, and holds it (heartbeating, ``track.lease``) through the LR
choice and the main runs; both ``run_runs`` calls run under it (``lease=``) instead of taking
their own. A second ``qkstudy run`` at any point of the study, between the stages too, is
refused (exit code 2, naming the holder) or waits with ``--wait``.

Layering: this module imports ``runner`` (the executor); ``runner`` never imports it.
"""

from __future__ import annotations

from rich.console import Console

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.inputs import FitError, corpus_hashes, fit_problems, plan_study
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import throughput_table
from orchestrator.plan.tune_plan import choose, plan_tuning, tuned_lrs
from orchestrator.plan.tuning import KIND, LrChoice
from orchestrator.run.driver.leasing import study_lease
from orchestrator.run.driver.records import existing_runs
from orchestrator.run.driver.runner import StudyResult, run_runs
from orchestrator.track.timeline import Timeline
from orchestrator.track.tracking import run_status, study_tracking_uri


def run_study(
    study: Study,
    *,
    address: str | None = None,
    console: Console | None = None,
    verbose: bool = False,
    max_in_flight: int | None = None,
    wait: bool = False,
    timeline: Timeline | None = None,
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

    Returns:
        StudyResult with every run's final state (also in MLflow, which is the record).

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: see ``runner.run_runs``; also a corpus whose files
            cannot be read to compute its content hash.
    """
    if study.tune is not None:
        return run_tuned_study(
            study, address=address, console=console, verbose=verbose, max_in_flight=max_in_flight, wait=wait, timeline=timeline
        )
    return run_runs(
        plan_study(study),
        study.name,
        study_tracking_uri(study),
        study.resolved_storage_path,
        address=address,
        console=console,
        verbose=verbose,
        max_in_flight=max_in_flight,
        wait=wait,
        timeline=timeline,
    )


def tuning_outcomes(tracking_uri: str, study_name: str, runs: list[RunSpec]) -> dict[str, tuple[float | None, str]]:
    """run_id -> (``final/val_loss`` in nats/token or None, status tag) of those of ``runs``
    that MLflow holds as tuning runs."""
    _, _, existing = existing_runs(tracking_uri, study_name, KIND)
    ids = {r.run_id for r in runs}
    return {rid: (rec.data.metrics.get("final/val_loss"), run_status(rec)) for rid, rec in existing.items() if rid in ids}


def _print_choices(choices: dict[tuple[str, str], LrChoice], console: Console) -> None:
    for (variant, scale), c in sorted(choices.items()):
        edge = f" [yellow](at the {c.edge} end of the grid)[/]" if c.edge in ("lowest", "highest") else ""
        console.print(f"tuned {variant} @ {scale}: lr {c.lr:g} (tuning val loss {c.val_loss:.4f}){edge}")


def run_tuned_study(
    study: Study,
    *,
    address: str | None = None,
    console: Console | None = None,
    verbose: bool = False,
    max_in_flight: int | None = None,
    wait: bool = False,
    timeline: Timeline | None = None,
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
    table, data = throughput_table(study), corpus_hashes(study, True)
    untuned = plan(study, table, data)
    tuning = plan_tuning(study, untuned)
    # the main runs' tokens and shapes are known before tuning (it picks only their LR)
    if problems := fit_problems(study, tuning + untuned):
        raise FitError(problems)
    with study_lease(study.name, storage, console, wait=wait) as lease:

        def stage(runs: list[RunSpec], timeline: Timeline | None = None) -> StudyResult:  # under the lease held here
            return run_runs(
                runs,
                study.name,
                uri,
                storage,
                address=address,
                console=console,
                verbose=verbose,
                max_in_flight=max_in_flight,
                lease=lease,
                timeline=timeline,
            )

        console.print(f"[bold]tuning[/]: {len(tuning)} runs ({len(study.tune.lr) if study.tune else 0} learning rates per arm)")
        result = stage(tuning, timeline)
        choices = choose(study, tuning, tuning_outcomes(uri, study.name, tuning))
        incomplete = sorted(k for k, c in choices.items() if not c.complete) + sorted({(r.variant, r.scale) for r in tuning} - set(choices))
        try:
            if incomplete:
                raise ValueError(f"tuning runs of {incomplete} have no result yet")
            lrs = tuned_lrs(study, choices)
        except ValueError as e:
            console.print(f"[red]main runs not planned[/]: {e}")
            return result
        _print_choices(choices, console)
        main = stage(plan(study, table, data, tuned_lr=lrs))
    main.status.update(result.status)
    main.reasons.update(result.reasons)
    main.wall_s += result.wall_s
    return main
