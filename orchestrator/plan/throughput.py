"""Throughput tables: tokens/s of every (scale, variant) of a study, declared or measured.

A table is ``{scale: {variant name: tokens/s of one run with the study's worker count}}``.
``wallclock`` budgets and the device-hour estimate of ``qkstudy plan`` read it. Two sources:
figures declared in the spec (``budget.throughput``, the same at every scale), which take
precedence, and the file ``qkstudy calibrate`` writes (``<workdir>/calibration.json``; the
measurement itself is ``orchestrator.run.driver.calibrate``). This module only reads and writes
tables: no Ray, no hardware, so the planner stays a pure function of its inputs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.spec import DeclaredMFU, Study

CALIBRATION_FILE = "calibration.json"

ThroughputTable = dict[str, dict[str, float]]


def declared_throughput(study: Study) -> ThroughputTable | None:
    """The spec's ``budget.throughput`` (tokens/s per variant) repeated for every scale, or
    None when not declared or declared as an MFU."""
    if not isinstance(study.budget.throughput, dict) or not study.budget.throughput:
        return None
    return {s: dict(study.budget.throughput) for s in study.scales}


def calibration_path(study: Study) -> Path:
    """Where the study's calibration table lives: ``<workdir>/calibration.json``."""
    return study.workdir_path / CALIBRATION_FILE


def save_calibration(study: Study, table: ThroughputTable, details: dict[str, Any] | None = None) -> Path:
    """Write ``{"tokens_per_s": table, **details}`` atomically (temp file, then rename);
    ``details``: how it was measured (``orchestrator.run.driver.calibrate.Calibration.details``:
    spread per entry, samples, load average, repeats). Returns the file's path."""
    p = calibration_path(study)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"tokens_per_s": table, **(details or {})}, indent=2, sort_keys=True))
    os.replace(tmp, p)
    return p


def load_calibration(study: Study) -> ThroughputTable | None:
    """The saved table (``tokens_per_s``; a file of an older version is the bare table), or
    None when the study was never calibrated."""
    p = calibration_path(study)
    if not p.is_file():
        return None
    data = json.loads(p.read_text())
    return data["tokens_per_s"] if "tokens_per_s" in data else data


def throughput_table(study: Study) -> ThroughputTable | None:
    """Tokens/s per scale and variant: the spec's declared figures, else the calibration
    file, else None. This is what callers pass to ``plan(study, throughput=...)``."""
    return declared_throughput(study) or load_calibration(study)


def declared_mfu(study: Study) -> DeclaredMFU | None:
    """The spec's ``budget.throughput`` when it declares an MFU, else None."""
    return study.budget.throughput if isinstance(study.budget.throughput, DeclaredMFU) else None


def device_hours_at_mfu(run: RunSpec, declared: DeclaredMFU) -> float:
    """Device-hours of a run at a declared MFU: total model FLOPs / (mfu x peak FLOP/s of one
    device) / 3600. The devices cancel: N devices each at mfu x peak take 1/N of the time.
    Same FLOP convention as the worker's MFU (``orchestrator.run.worker.mfu``, after nanoGPT's
    ``estimate_mfu`` and PaLM's appendix B)."""
    return run.total_flops / (declared.mfu * declared.peak_flops) / 3600


def device_hours(run: RunSpec, table: ThroughputTable) -> float | None:
    """Device-hours of a run: tokens / (tokens/s of the run) x its devices / 3600.

    Devices are GPUs (workers x gpus_per_worker) or, on CPU, the workers. None when the
    table has no tokens/s for the run's (scale, variant).
    """
    tps = (table.get(run.scale) or {}).get(run.variant)
    if not tps:
        return None
    r = run.resources
    devices = r.workers * (r.gpus_per_worker or 1)
    return run.tokens / tps * devices / 3600
