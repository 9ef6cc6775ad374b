"""A study with ``tune:``: its tuning runs first, then its main runs at the chosen LRs.

Why: each (variant, scale) trains at its own best learning rate (``orchestrator.plan.tuning``),
and that LR is known only once its tuning runs finished. The stage plans the tuning runs
(``orchestrator.plan.tune_plan.plan_tuning``), trains them through the normal run path
(``run_runs``: finished ones are found by id and skipped, so a resubmit reuses them), reads
their final val loss and status from MLflow, chooses per arm the grid argmin, and plans and
trains the main runs with ``tuned_lr`` (the LR enters their identity through ``train.lr``).

The study's lease is taken by each ``run_runs`` call (tuning, then main), not across both:
a second driver that slips in between trains the same ids and MLflow keeps one record each.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from orchestrator.plan.inputs import corpus_hashes
from orchestrator.plan.planner import RunSpec, plan
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import throughput_table
from orchestrator.plan.tune_plan import choose, plan_tuning, tuned_lrs
from orchestrator.plan.tuning import KIND, LrChoice
from orchestrator.run.register import existing_runs
from orchestrator.run.runner import StudyResult, run_runs
from orchestrator.track.tracking import run_status, study_tracking_uri


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


def run_tuned_study(study: Study, **kw: Any) -> StudyResult:
    """Tuning runs, the LR choice, then the main runs (module docstring); ``kw`` as
    ``run_runs`` takes them (address, console, verbose, max_in_flight, wait).

    Returns both stages' statuses in one StudyResult; when a tuning run did not finish or an
    arm has no usable LR the main runs are not planned (their absence leaves ``ok`` False
    only through the tuning runs' own statuses, which say why).
    """
    console: Console = kw.setdefault("console", Console(stderr=True))
    uri, storage = study_tracking_uri(study), study.resolved_storage_path
    table, data = throughput_table(study), corpus_hashes(study, True)
    tuning = plan_tuning(study, plan(study, table, data))
    console.print(f"[bold]tuning[/]: {len(tuning)} runs ({len(study.tune.lr) if study.tune else 0} learning rates per arm)")
    result = run_runs(tuning, study.name, uri, storage, **kw)
    choices = choose(study, tuning, tuning_outcomes(uri, study.name, tuning))
    incomplete = sorted(k for k, c in choices.items() if not c.complete) + \
        sorted({(r.variant, r.scale) for r in tuning} - set(choices))
    try:
        if incomplete:
            raise ValueError(f"tuning runs of {incomplete} have no result yet")
        lrs = tuned_lrs(study, choices)
    except ValueError as e:
        console.print(f"[red]main runs not planned[/]: {e}")
        return result
    _print_choices(choices, console)
    main = run_runs(plan(study, table, data, tuned_lr=lrs), study.name, uri, storage, **kw)
    main.status.update(result.status)
    main.reasons.update(result.reasons)
    main.wall_s += result.wall_s
    return main
