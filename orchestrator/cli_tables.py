"""The tables ``qkstudy`` prints (rich), kept apart from the command wiring in ``cli.py``.

Each function takes what a stage returned and gives back something ``Console.print`` shows;
none of them computes a number (device-hours come from ``orchestrator.plan.throughput``,
epochs from ``orchestrator.plan.epochs``, memory from ``orchestrator.plan.memory``, the power
statement from ``orchestrator.report.stats.power``). Stages are imported where a table needs
them: ``qkstudy plan`` must not pay for MLflow, nor ``qkstudy status`` for scipy.
"""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from orchestrator.plan import memory
from orchestrator.plan.epochs import CorpusSize, epochs
from orchestrator.plan.throughput import ThroughputTable, declared_mfu, device_hours, device_hours_at_mfu


def amount(x: float) -> str:
    """A non-negative quantity as a reader takes it in: two decimals from 1 up, two significant
    digits below (0.000014, not 0.00, for a small study's device-hours)."""
    return f"{x:,.2f}" if x >= 1 or x == 0 else f"{x:.2g}"


def plan_hours(study: Any, runs: list[Any], throughput: ThroughputTable) -> tuple[dict[str, float | None], str | None]:
    """Device-hours per run_id and where they came from: a declared MFU
    (``throughput.device_hours_at_mfu``), else the tokens/s table (declared or calibrated);
    the source is None when neither gives them."""
    declared = declared_mfu(study)
    if declared is not None:
        return {r.run_id: device_hours_at_mfu(r, declared) for r in runs}, f"a declared MFU of {declared.mfu:g}"
    source = "the spec" if study.budget.throughput else "calibration"
    return {r.run_id: device_hours(r, throughput) for r in runs}, source


def plan_table(study: Any, runs: list[Any], throughput: ThroughputTable, sizes: dict[str, CorpusSize]) -> tuple[Table, str]:
    """The plan (one row per run: epochs of its corpus, estimated memory per device,
    device-hours where known) and its total line."""
    hours, source = plan_hours(study, runs, throughput)
    t = Table(title=f"{study.name}: {len(runs)} runs, budget mode {study.budget.mode} (N = non-embedding parameters)")
    cols = [
        "run_id",
        "variant",
        "scale",
        "seed",
        "extend",
        "N",
        "N total",
        "FLOPs/token",
        "tokens",
        "steps",
        "total FLOPs",
        "epochs",
        "GiB/device",
        "est. device-h",
    ]
    for c in cols:
        t.add_column(c, justify="right" if c not in ("run_id", "variant", "scale") else "left")
    for r in runs:
        h, e = hours[r.run_id], epochs(r, sizes)
        approx = "~" if sizes[r.corpus_name].source == "estimate" else ""
        t.add_row(
            r.run_id,
            r.variant,
            r.scale,
            str(r.seed),
            f"{r.extend:g}",
            f"{r.n_params:,}",
            f"{r.n_params_total:,}",
            f"{r.flops_per_token:,}",
            f"{r.tokens:,}",
            f"{r.steps:,}",
            f"{r.total_flops:.3e}",
            f"{approx}{e:.3g}" if e is not None else "?",
            amount(memory.estimate(r).total / memory.GIB),
            amount(h) if h is not None else "-",
        )
    known = [h for h in hours.values() if h is not None]
    est = (
        f", {amount(sum(known))} device-hours (throughput from {source})"
        if len(known) == len(runs)
        else " (device-hours: run `qkstudy calibrate SPEC` or declare budget.throughput)"
    )
    corpora = "; ".join(
        f"corpus {name!r}: "
        + (f"{z.train_tokens:,.0f} unique train tokens ({z.source})" if z.train_tokens else "size unknown here (epochs ?)")
        for name, z in sizes.items()
    )
    return t, f"total: {sum(r.tokens for r in runs):,} tokens, {sum(r.total_flops for r in runs):.3e} FLOPs" + est + f"\n{corpora}"


def recipe_table(runs: list[Any], tuned: bool = False) -> Table:
    """The training recipe each scale resolved to (``RunSpec.train``): one row per scale and
    recipe, naming the variants that share it (a tuned or per-variant LR splits a scale's row);
    warmup as the range of its runs' steps (a share of each run's steps: extends warm up longer).
    ``tuned``: the study tunes its LR (``tune``), so the peak LR is the tuning's, not the plan's."""
    rows: dict[tuple[str, Any], tuple[list[str], list[int]]] = {}
    for r in runs:
        names, warmups = rows.setdefault((r.scale, r.train.model_copy(update={"warmup_steps": 0, "log_every_steps": 0})), ([], []))
        if r.variant not in names:
            names.append(r.variant)
        warmups.append(r.train.warmup_steps)
    t = Table(title="recipe per scale (tokens/step = global batch x seq_len)")
    cols = ["scale", "variants", "seq_len", "global batch", "tokens/step", "micro-batch", "peak LR", "schedule", "warmup"]
    cols += ["decay", "min LR", "wd", "clip"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("scale", "variants", "schedule") else "right")
    for (scale, tr), (variants, warmups) in rows.items():
        t.add_row(
            scale,
            ", ".join(variants),
            f"{tr.seq_len:,}",
            f"{tr.global_batch:,}",
            f"{tr.tokens_per_step:,}",
            f"{tr.micro_batch:,}",
            "tuned" if tuned else f"{tr.lr:.3g}",
            tr.schedule,
            f"{min(warmups):,}-{max(warmups):,} steps" if min(warmups) != max(warmups) else f"{warmups[0]:,} steps",
            f"{tr.decay_fraction:g}" if tr.schedule == "wsd" else "-",
            f"{tr.min_lr_ratio:g} x peak",
            f"{tr.weight_decay:g}",
            f"{tr.grad_clip:g}",
        )
    return t


def calibration_table(study: Any, table: ThroughputTable) -> Table:
    """Measured tokens/s: one row per scale, one column per variant."""
    t = Table(title=f"{study.name}: tokens/s per run ({study.resources.workers} worker(s))")
    t.add_column("scale")
    for v in study.variants:
        t.add_column(v.name, justify="right")
    for scale, row in table.items():
        t.add_row(scale, *[f"{row[v.name]:,.0f}" for v in study.variants])
    return t


def status_table(name: str, uri: str, rows: list[dict[str, Any]], lease: str = "", title: str | None = None) -> Table:
    """``study_status`` rows (or ``tuning_status``'s, which add ``lr``), under ``title`` or one
    naming the (redacted) tracking URI and ``lease`` (``study_lease_line``); a run's lease
    holder is in its ``lease`` column, ``val ppl`` is the latest eval's, ``final ppl`` the
    final pass's over the whole val split."""
    from orchestrator.track.tracking import redact_uri

    t = Table(title=title or f"{name}: {len(rows)} runs ({redact_uri(uri)})" + (f"\n{lease}" if lease else ""))
    with_lr = any("lr" in r for r in rows)
    for c in ("run", "run_id", "status", *(["lr"] if with_lr else []), "tokens", "planned", "val ppl", "final ppl", "lease", "note"):
        t.add_column(c)
    for r in rows:
        t.add_row(
            r["run_name"],
            r["run_id"],
            r["status"],
            *([r.get("lr") or "-"] if with_lr else []),
            f"{r['tokens']:,}" if r["tokens"] is not None else "-",
            f"{r['planned_tokens']:,}" if r["planned_tokens"] else "-",
            f"{r['val_ppl']:.2f}" if r["val_ppl"] is not None else "-",
            f"{r['final_ppl']:.2f}" if r.get("final_ppl") is not None else "-",
            r.get("lease", ""),
            r["note"],
        )
    return t


def plan_rows(study: Any, runs: list[Any], throughput: ThroughputTable, sizes: dict[str, CorpusSize]) -> list[dict[str, Any]]:
    """``qkstudy plan --json``: one mapping per run (ids, counts, budget, recipe, its plug-in's module,
    version, source hash and path, epochs, estimated bytes per device, device-hours; None where
    unknown or not a plug-in's)."""
    hours, _ = plan_hours(study, runs, throughput)
    return [
        {
            "run_id": r.run_id,
            "variant": r.variant,
            "scale": r.scale,
            "seed": r.seed,
            "extend": r.extend,
            "n_params": r.n_params,
            "n_params_total": r.n_params_total,
            "flops_per_token": r.flops_per_token,
            "tokens": r.tokens,
            "steps": r.steps,
            "total_flops": r.total_flops,
            "train": r.train.model_dump(mode="json"),
            "data_hash": r.data_hash,
            "plugin": r.plugin,
            "epochs": epochs(r, sizes),
            "epochs_source": sizes[r.corpus_name].source,
            "memory_bytes_per_device": memory.estimate(r).total,
            "device_hours": hours[r.run_id],
        }
        for r in runs
    ]


MIN_NATS = 1e-12  # below it (and past floats) the power calculation's root finding cannot resolve


class PowerInputError(ValueError):
    """A ``--seed-sd`` or ``--gap`` the power calculation cannot take (an input error: exit 2)."""


def power_text(n_seeds: int, seed_sd: float, gap: float | None = None) -> str:
    """What a study of ``n_seeds`` seeds can resolve, given a declared spread ``seed_sd`` (std of
    one arm's final loss across seeds, nats): the smallest gap its seed-paired t-test detects
    at 80% power (``orchestrator.report.stats.power.plan_power``, two-sided 5%), and with ``gap``
    the seeds needed to detect that gap. The sd of the paired differences is seed_sd x sqrt 2
    (``diff_sd``: the arms' finals taken as uncorrelated across seeds; pairing by seed can only
    make it smaller, so the figures are conservative).

    Raises:
        PowerInputError: ``seed_sd`` or ``gap`` not 0 nor finite and at least ``MIN_NATS``, or
            one the root finding has no answer for (a spread of 1e308 nats).
    """
    for option, value in (("--seed-sd", seed_sd), ("--gap", gap)):
        if value is not None and not (math.isfinite(value) and (value == 0 or value >= MIN_NATS)):
            raise PowerInputError(
                f"{option}: {value:g} nats is not a spread or gap the power calculation can take (0, or {MIN_NATS:g} to finite)"
            )
    try:
        return _power_text(n_seeds, seed_sd, gap)
    except ValueError as e:  # scipy's root finding past what floats resolve
        raise PowerInputError(f"--seed-sd {seed_sd:g}: the power calculation has no answer for it ({e})") from None


def _power_text(n_seeds: int, seed_sd: float, gap: float | None) -> str:
    from orchestrator.report.stats.power import ALPHA, POWER, diff_sd, plan_power, seeds_needed

    sd = diff_sd(seed_sd)
    seeds = f"{n_seeds} seed{'' if n_seeds == 1 else 's'}"
    head = f"with {seeds} and seed std {seed_sd:g} nats, "
    if n_seeds < 2:
        text = head + "no gap is detectable: a seed-paired test needs at least 2 seeds"
    else:
        est = plan_power(n_seeds, sd)
        text = (
            head + f"the smallest gap detectable at {POWER:.0%} power is {est.mde:.3g} nats (seed-paired t-test, "
            f"{ALPHA:.0%} two-sided; sd of the paired differences {sd:.3g} nats = seed std x sqrt 2)"
        )
    if gap is not None:
        need = seeds_needed(gap, sd)
        text += (
            f"; a gap of {gap:g} nats needs {need} seeds"
            if need is not None
            else f"; a gap of {gap:g} nats is not detectable with any number of seeds"
        )
    return text
