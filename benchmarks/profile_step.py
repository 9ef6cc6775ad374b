"""Where a variant's extra step time goes (`make bench`): the PyTorch profiler
over optimizer steps of `standard` and one variant at a preset, self CPU time per operator,
and the operators that account for the variant's extra time.

Both models are built as `model.timing.build_runs` builds them (seed 0, AdamW, one fixed random batch);
the two take turns step by step (after warm-up, who goes first alternating), so load drift
hits both alike, and each row is an operator's median over the steps. Self time is an operator's own time, its
children's excluded, so the rows add up to about the step. The profiler adds a cost per
operator call, so its ratio is not `benchmarks.model_steps`'; on a shared machine a shared
operator's row can move by as much as the variant's own operators (read the rows, not the ratio
alone). A Markdown table (ms per step: standard, variant, difference, share of the gap) is
appended to BENCHMARKS.md through a temp file.

    python -m benchmarks.profile_step --preset cpu-s --variant coupled --threads 1 --steps 6
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.record import append_markdown, machine_description
from model.presets import PRESETS
from model.timing import StepOptions, StepRun, build_runs, train_step


@dataclass(frozen=True)
class OpTime:
    """One operator's self CPU time per optimizer step, in ms, in the reference and the variant."""

    name: str
    reference_ms: float
    variant_ms: float

    @property
    def diff_ms(self) -> float:
        """The variant's self time minus the reference's, ms per step (negative: it costs less)."""
        return self.variant_ms - self.reference_ms


def median_per_op(steps: list[dict[str, float]]) -> dict[str, float]:
    """Operator name -> its median over ``steps`` (one {operator: self ms} dict per step; an
    operator missing from a step counts 0 there). One step slowed by another process barely
    moves a row."""
    names = set().union(*steps) if steps else set()
    return {k: statistics.median(step.get(k, 0.0) for step in steps) for k in names}


def _self_ms(runs: list[StepRun], steps: int, options: StepOptions) -> list[dict[str, float]]:
    """Per run: operator name -> median self CPU ms per step over ``steps`` steps, the runs
    taking turns (who goes first alternates, so neither always follows the other)."""
    samples: list[list[dict[str, float]]] = [[] for _ in runs]
    for s in range(steps):
        for i in range(len(runs)) if s % 2 == 0 else reversed(range(len(runs))):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                train_step(runs[i], options)
            step: dict[str, float] = defaultdict(float)
            for e in prof.key_averages():
                step[e.key] += e.self_cpu_time_total / 1e3  # us -> ms
            samples[i].append(step)
    return [median_per_op(per) for per in samples]


def profile_gap(
    preset: str,
    variant: str,
    steps: int = 6,
    warmup: int = 2,
    batch_size: int = 8,
    vocab_size: int = 4096,
    seq_len: int | None = None,
    options: StepOptions = StepOptions(),
) -> list[OpTime]:
    """Every operator's self CPU time per step [ms] under `standard` and ``variant`` (a
    `model.timing` variant spec), largest gap first. Raises ValueError for a bad spec."""
    runs = build_runs(preset, ["standard", variant], batch_size, vocab_size, seq_len, "cpu", options.impl)
    for run in runs:
        for _ in range(warmup):
            train_step(run, options)
    ref, var = _self_ms(runs, steps, options)
    ops = [OpTime(k, ref.get(k, 0.0), var.get(k, 0.0)) for k in set(ref) | set(var)]
    return sorted(ops, key=lambda o: (-abs(o.diff_ms), o.name))


def format_gap(ops: list[OpTime], variant: str, top: int = 12) -> str:
    """Markdown table of the ``top`` operators by |gap|, the rest summed, and the totals."""
    ref_total = sum(o.reference_ms for o in ops)
    gap = sum(o.diff_ms for o in ops)
    rows = [
        f"| operator | standard (ms/step) | {variant} (ms/step) | difference (ms/step) | share of the gap |",
        "|---|---:|---:|---:|---:|",
    ]

    def row(name: str, r: float, v: float) -> str:
        share = f"{(v - r) / gap:.0%}" if gap else "-"
        return f"| {name} | {r:.2f} | {v:.2f} | {v - r:+.2f} | {share} |"

    rows += [row(f"`{o.name}`", o.reference_ms, o.variant_ms) for o in ops[:top]]
    rest = ops[top:]
    rows.append(row(f"{len(rest)} other operators", sum(o.reference_ms for o in rest), sum(o.variant_ms for o in rest)))
    rows.append(row("**all (the step)**", ref_total, ref_total + gap))
    ratio = (ref_total + gap) / ref_total if ref_total else float("nan")
    return "\n".join(rows) + f"\n\nProfiled step-time ratio {variant} / standard: {ratio:.3f}."


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-s", choices=list(PRESETS))
    p.add_argument("--variant", default="coupled", help="a model.timing variant spec (NAME[:opt=value,...])")
    p.add_argument("--steps", type=int, default=6, help="profiled steps per model, alternating")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--top", type=int, default=12, help="operators listed by |gap|")
    p.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    p.add_argument("--no-append", action="store_true", help="print only")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description()
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        ops = profile_gap(args.preset, args.variant, args.steps, batch_size=args.batch_size, vocab_size=args.vocab_size)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "benchmarks.profile_step", *(argv if argv is not None else sys.argv[1:])])
    seq = PRESETS[args.preset].seq_len
    text = (
        f"## Where {args.variant}'s extra step time goes: preset {args.preset}, {started}\n\n"
        f"Machine: {machine}.  \nCommand: `{command}`  \n"
        f"Self CPU time per operator (PyTorch profiler), batch {args.batch_size} x {seq} tokens, "
        f"{args.steps} profiled steps per model alternating after 2 warm-up, per step.\n\n" + format_gap(ops, args.variant, args.top)
    )
    print(text)
    if not args.no_append:
        append_markdown(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
