"""Throughput calibration: tokens/s of every (scale, variant) of a study on its hardware.

``wallclock`` budgets and the device-hour estimate of ``qkstudy plan`` need each variant's
throughput on the target hardware. Calibration runs ``model.bench`` (interleaved, median
timed optimizer steps) as one Ray task per scale, sized like one of the run's workers (so it
lands on a GPU node when the runs do), and scales the per-worker rate by the worker count
(data parallel; ignores communication, so it is an upper bound on multi-node runs). Only
the measurement lives here; reading and writing the table (``<workdir>/calibration.json``,
where a declared ``budget.throughput`` takes precedence) is ``orchestrator.plan.throughput``,
which the planner's callers use without Ray.
"""

from __future__ import annotations

from typing import Any

import ray

from orchestrator.plan.planner import resolve_train
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import ThroughputTable
from orchestrator.run.placement import worker_resources


def _variant_spec(kind: str, options: dict[str, Any]) -> str:
    """model.bench's NAME:opt=value,... form of a variant."""
    return kind if not options else kind + ":" + ",".join(f"{k}={v}" for k, v in options.items())


def calibrate(study: Study, *, repeats: int = 3, steps: int = 2) -> ThroughputTable:
    """Measure tokens/s per scale and variant (see module docstring); Ray must be initialised.

    Returns:
        {scale: {variant name: tokens/s of one run with the study's worker count}}.
    """
    res = study.resources
    worker = worker_resources(res)
    bench = ray.remote(num_cpus=worker["CPU"], num_gpus=worker.get("GPU", 0))(_bench_scale)
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
