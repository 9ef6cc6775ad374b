"""Throughput calibration: tokens/s of every (scale, variant) of a study on its hardware.

``wallclock`` budgets and the device-hour estimate of ``qkstudy plan`` need each variant's
throughput on the target hardware. Calibration runs ``model.bench`` (interleaved, median
timed optimizer steps) as one Ray task per scale, sized like one of the run's workers (so it
lands on a GPU node when the runs do), and scales the per-worker rate by the worker count
(data parallel; ignores communication, so it is an upper bound on multi-node runs). The
result is written atomically to ``<workdir>/calibration.json``; a declared
``budget.throughput`` in the spec takes precedence over it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ray

from orchestrator.plan.planner import resolve_train
from orchestrator.plan.spec import Study

CALIBRATION_FILE = "calibration.json"


def _variant_spec(kind: str, options: dict[str, Any]) -> str:
    """model.bench's NAME:opt=value,... form of a variant."""
    return kind if not options else kind + ":" + ",".join(f"{k}={v}" for k, v in options.items())


def calibrate(study: Study, *, repeats: int = 3, steps: int = 2) -> dict[str, dict[str, float]]:
    """Measure tokens/s per scale and variant (see module docstring); Ray must be initialised.

    Returns:
        {scale: {variant name: tokens/s of one run with the study's worker count}}.
    """
    res = study.resources
    opts: dict[str, Any] = {"num_cpus": res.cpus_per_worker}
    if res.gpus_per_worker:
        opts["num_gpus"] = res.gpus_per_worker
    bench = ray.remote(**opts)(_bench_scale)
    specs = [_variant_spec(v.model_variant, v.options) for v in study.variants]
    refs = {}
    for scale in study.scales:
        t = resolve_train(study, scale)
        seq_len, micro = t.seq_len, t.micro_batch
        refs[scale] = bench.remote(scale, specs, repeats, steps, micro, study.tokenizer.vocab_size, seq_len)
    out = {}
    for scale, ref in refs.items():
        per_worker = ray.get(ref)
        out[scale] = {v.name: per_worker[i] * res.workers for i, v in enumerate(study.variants)}
    return out


def _bench_scale(scale: str, specs: list[str], repeats: int, steps: int, batch: int, vocab: int,
                 seq_len: int) -> list[float]:
    import torch

    from model.bench import run_bench

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = run_bench(scale, specs, repeats, steps, batch, vocab, seq_len, device, None, warmup=1)
    by_spec = {r.spec: r.tokens_per_s for r in results}
    return [by_spec[s] for s in specs]


def calibration_path(study: Study) -> Path:
    """Where the study's calibration table lives: ``<workdir>/calibration.json``."""
    return study.workdir_path / CALIBRATION_FILE


def save_calibration(study: Study, table: dict[str, dict[str, float]]) -> Path:
    """Write the table atomically (temp file, then rename)."""
    p = calibration_path(study)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=2, sort_keys=True))
    os.replace(tmp, p)
    return p


def load_calibration(study: Study) -> dict[str, dict[str, float]] | None:
    """The saved table, or None when the study was never calibrated."""
    p = calibration_path(study)
    return json.loads(p.read_text()) if p.is_file() else None


def throughput_table(study: Study) -> dict[str, dict[str, float]] | None:
    """Tokens/s per scale and variant: the spec's declared figures (same at every scale),
    else the calibration file, else None."""
    if study.budget.throughput:
        return {s: dict(study.budget.throughput) for s in study.scales}
    return load_calibration(study)
