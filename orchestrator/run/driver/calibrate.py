"""Throughput calibration: tokens/s of every (scale, variant) of a study on its hardware.

``wallclock`` budgets and the device-hour estimate of ``qkstudy plan`` need each variant's
throughput on the target hardware. Calibration is one Ray task sized like one of the run's
workers (so it lands on a GPU node when the runs do, and nothing else of the calibration
shares its node), timing ``model.timing`` optimizer steps. Repeats are interleaved across
(scale, variant): each repeat times every scale once (the scales' order rotates from repeat
to repeat) and, within a scale, every variant once (``model.timing`` times ``standard``
first, then the others, whose order rotates too), so a change of machine load hits every
entry alike instead of one scale or variant. An entry's value is the median tokens/s over
its repeats, scaled by the worker count (data parallel; ignores communication, so an upper
bound on multi-node runs).

A wall-clock budget is only as good as that median: on a loaded machine one ratio was
measured 2.8x and 1.2x. So every entry reports its dispersion, the relative spread
(max - min) / median over its repeats, and the node's 1-minute load average before the
timing starts; ``judge`` refuses a calibration (``CalibrationError``, exit code 2, with the
numbers) whose worst spread is above ``max_spread`` or whose node was loaded (load average
above its CPU count), or only warns when asked to. Reading and writing the table
(``<workdir>/calibration.json``, with the spread, samples and load) is
``orchestrator.plan.throughput``, which the planner's callers use without Ray.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from orchestrator.plan.contract import PlanError
from orchestrator.plan.planner import resolve_train
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import ThroughputTable, save_calibration
from orchestrator.run.driver.placement import worker_resources

DEFAULT_MAX_SPREAD = 0.05  # a few percent: a budget ratio better than that is not measurable here


class CalibrationError(PlanError):
    """A calibration too noisy to plan wall-clock budgets with (the message has the numbers)."""


def relative_spread(samples: list[float]) -> float:
    """(max - min) / median of ``samples`` (0 for one sample); the dispersion every entry reports.

    Raises:
        ValueError: no samples, or a median that is not positive.
    """
    if not samples:
        raise ValueError("relative_spread: no samples")
    med = statistics.median(samples)
    if med <= 0:
        raise ValueError(f"relative_spread: median {med} is not positive")
    return (max(samples) - min(samples)) / med


@dataclass
class Calibration:
    """A measured throughput table and how far to trust it.

    ``samples``: {scale: {variant: tokens/s of one worker, one per repeat}}; ``table``: the
    medians x workers; ``load_avg``: the node's 1-minute load average before timing, with its
    ``cpus``; ``repeats`` and ``steps`` (timed optimizer steps per repeat)."""

    samples: dict[str, dict[str, list[float]]]
    workers: int
    load_avg: float
    cpus: int
    repeats: int
    steps: int

    @property
    def table(self) -> ThroughputTable:
        """{scale: {variant: median tokens/s x workers}}: what the planner reads."""
        return {s: {v: statistics.median(x) * self.workers for v, x in row.items()} for s, row in self.samples.items()}

    @property
    def spread(self) -> dict[str, dict[str, float]]:
        """{scale: {variant: relative spread of its repeats}} (``relative_spread``)."""
        return {s: {v: relative_spread(x) for v, x in row.items()} for s, row in self.samples.items()}

    def problems(self, max_spread: float) -> list[str]:
        """One line per entry whose spread exceeds ``max_spread``, and one if the node was loaded."""
        out = [
            f"{scale}/{v}: spread {sp:.1%} over {self.repeats} repeats (tokens/s per worker from "
            f"{min(self.samples[scale][v]):,.0f} to {max(self.samples[scale][v]):,.0f}) exceeds {max_spread:.1%}"
            for scale, row in self.spread.items()
            for v, sp in row.items()
            if sp > max_spread
        ]
        if self.load_avg > self.cpus:
            out.append(f"the calibrating node was loaded: load average {self.load_avg:.2f} > its {self.cpus} CPUs")
        return out

    def summary(self) -> str:
        """One line: the worst entry's spread, the repeats and the node's load."""
        worst = max(sp for row in self.spread.values() for sp in row.values())
        return f"worst spread {worst:.1%} over {self.repeats} repeats, load average {self.load_avg:.2f} on {self.cpus} CPUs"

    def details(self) -> dict[str, Any]:
        """What the calibration file keeps besides the table (``save_calibration``)."""
        return {
            "spread": self.spread,
            "samples_per_worker": self.samples,
            "load_avg": self.load_avg,
            "cpus": self.cpus,
            "repeats": self.repeats,
            "steps": self.steps,
        }

    def save(self, study: Study) -> Path:
        """Write the table and its details to the study's calibration file; returns its path."""
        return save_calibration(study, self.table, self.details())


def judge(
    cal: Calibration, max_spread: float = DEFAULT_MAX_SPREAD, allow_noisy: bool = False, warn: Callable[[str], None] | None = None
) -> list[str]:
    """The calibration's problems (``Calibration.problems``), each also passed to ``warn``,
    when ``allow_noisy``; [] when there are none.

    Raises:
        CalibrationError: there are problems and ``allow_noisy`` is False; the message lists
            every one with its numbers and how to proceed.
    """
    problems = cal.problems(max_spread)
    if problems and not allow_noisy:
        raise CalibrationError(
            "calibration too noisy for wall-clock budgets (nothing written):\n  "
            + "\n  ".join(problems)
            + "\nre-run on a quiet machine, with more --repeats, or pass --allow-noisy "
            "(or a larger --max-spread) to keep it anyway"
        )
    if warn is not None:
        for p in problems:
            warn(p)
    return problems


def _variant_spec(kind: str, options: dict[str, Any]) -> str:
    """model.timing's NAME:opt=value,... form of a variant."""
    return kind if not options else kind + ":" + ",".join(f"{k}={v}" for k, v in options.items())


def calibrate(study: Study, *, repeats: int = 7, steps: int = 3) -> Calibration:
    """Measure tokens/s per scale and variant (module docstring); Ray must be initialised.

    Returns:
        Calibration (``.table``: {scale: {variant name: tokens/s of one run with the study's
        worker count}}), not yet judged: see ``judge``.
    """
    res = study.resources
    worker = worker_resources(res)
    bench = ray.remote(num_cpus=worker["CPU"], num_gpus=worker.get("GPU", 0))(_bench_all)
    specs = [_variant_spec(v.model_variant, v.options) for v in study.variants]
    scales = []
    for scale in study.scales:
        t = resolve_train(study, scale)
        scales.append((scale, t.micro_batch, t.seq_len))
    out = ray.get(bench.remote(scales, specs, repeats, steps, study.tokenizer.vocab_size))
    samples = {scale: {v.name: out["samples"][scale][i] for i, v in enumerate(study.variants)} for scale in study.scales}
    return Calibration(samples, res.workers, out["load_avg"], out["cpus"], repeats, steps)


def _bench_all(scales: list[tuple[str, int, int]], specs: list[str], repeats: int, steps: int, vocab: int) -> dict[str, Any]:
    """In one process: ``repeats`` rounds, each timing every (scale, variant) once; returns
    {samples: {scale: [per spec: tokens/s per repeat]}, load_avg, cpus}."""
    import os

    import torch

    from model.timing import tokens_per_second

    device = "cuda" if torch.cuda.is_available() else "cpu"
    load_avg, cpus = os.getloadavg()[0], len(os.sched_getaffinity(0))
    samples: dict[str, list[list[float]]] = {s: [[] for _ in specs] for s, _, _ in scales}
    for r in range(repeats):
        for j in range(len(scales)):
            scale, batch, seq_len = scales[(j + r) % len(scales)]
            order = specs[r % len(specs) :] + specs[: r % len(specs)]
            by_spec = tokens_per_second(scale, order, steps, batch, vocab, seq_len, device, warmup=1)
            for i, s in enumerate(specs):
                samples[scale][i].append(by_spec[s])
    return {"samples": samples, "load_avg": load_avg, "cpus": cpus}
