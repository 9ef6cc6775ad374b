"""Step-time benchmark of every attention variant at one preset (`make bench`).

Times full optimizer steps (forward + backward + AdamW) of each variant on a fixed random
batch. Variants run interleaved in the same process (each repeat times every variant once,
in a rotated order, after warm-up), so load drift hits all of them alike; the ratio to
`standard` is the median over repeats of the paired per-repeat ratios, with their
interquartile range (the spread) and the best-of ratio (fastest step over standard's
fastest, the least touched by other processes). The same paired ratio of process CPU time
is reported too (less sensitive to other processes on a shared machine; with more than one
thread it also counts OpenMP spin-waits). Each row carries the median 1-minute load average
over its repeats. The FLOP ratios from the analytic counts sit beside them: the wall-clock
overhead of a variant should approach its FLOP overhead. On CUDA: MFU (model FLOPs x
tokens/s / --peak-tflops) and the peak memory a step adds. A dated Markdown table (machine,
torch, command) is appended to BENCHMARKS.md (written to a temp file, then renamed).

    python -m benchmarks.model_steps [--preset cpu-s] [--variants standard coupled coupled:integrator=leapfrog]
                          [--repeats 15] [--steps 1] [--batch-size 8] [--vocab-size 4096]
                          [--threads N] [--impl auto|eager|fused|compile]
    python -m benchmarks.model_steps --device cuda --preset 60m --vocab-size 32000 --batch-size 32 \
                          --variants standard coupled --sdpa flash --peak-tflops 989
    python -m benchmarks.model_steps --dry-run   # that GPU path (bf16 autocast, flash SDPA only, compiled QK
                                      # transform) on CPU at tiny shapes; prints, never appends

A variant spec is NAME or NAME:opt=value,opt=value with options of `build_config`, plus
impl=auto|eager|fused|compile (how its QK transform runs, `model.fused_qk`), so one run can
time `coupled:impl=eager` against `coupled`. The step itself (model, batch, AdamW, the timing) is
`model.timing`'s, the one ``qkstudy calibrate`` times. scripts/gpu_check.sh runs the GPU benchmark.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.record import append_markdown, machine_description
from model.counts import ModelCounts, count_model
from model.coupled import DynamicsQK
from model.fused_qk import QK_IMPLS, resolve_impl
from model.presets import PRESETS
from model.timing import StepOptions, StepRun, build_runs, timed_steps, train_step

DEFAULT_VARIANTS = ("standard", "coupled", "coupled:integrator=leapfrog", "uncoupled_mlp", "differential", "coupled_differential")


@dataclass
class BenchResult:
    spec: str
    impl: str  # how its QK transform ran ("-": no learned transform), `model.fused_qk`
    step_s: float  # median seconds per optimizer step
    tokens_per_s: float
    ratio: float  # step time / standard step time (median of paired ratios)
    ratio_iqr: tuple[float, float]  # 25th and 75th percentiles of the paired ratios (the spread)
    best_ratio: float  # fastest step time / standard's fastest (least touched by other processes)
    cpu_ratio: float  # same for process CPU time per step
    cpu_ratio_iqr: tuple[float, float]
    flop_ratio: float  # analytic training (model) FLOPs per token / standard's
    executed_flop_ratio: float  # the same for what the kernels execute (`ModelCounts`)
    flops_per_token: int
    mfu: float | None
    step_mem_gib: float | None  # CUDA: peak memory a step adds to what is resident before it
    load: float  # median 1-minute load average over this variant's timed repeats


def _impl_used(run: StepRun, options: StepOptions) -> str:
    """What the run's QK transforms execute in a training step ("-" if it has none)."""
    if not any(isinstance(m, DynamicsQK) for m in run.model.modules()):
        return "-"
    with options.context(str(run.idx.device)), torch.enable_grad():
        return resolve_impl(run.impl, run.idx.new_zeros((), dtype=torch.float32))


def run_bench(
    preset: str,
    specs: list[str],
    repeats: int,
    steps: int,
    batch_size: int,
    vocab_size: int,
    seq_len: int | None,
    device: str,
    peak_tflops: float | None,
    warmup: int = 2,
    options: StepOptions = StepOptions(),
) -> list[BenchResult]:
    """Time each variant spec (see module docstring); 'standard' is put first (the reference).
    Warm-up steps (at least 1: a compiled transform compiles then) are not timed.
    Raises ValueError for a bad spec (`parse_variant`, `build_config`) or impl."""
    runs = build_runs(preset, specs, batch_size, vocab_size, seq_len, device, options.impl)
    for run in runs:
        for _ in range(warmup):
            train_step(run, options)
    samples: list[list[tuple[float, float, float | None, float]]] = [[] for _ in runs]
    for r in range(repeats):
        for i in [(i + r) % len(runs) for i in range(len(runs))]:  # rotate to cancel position bias
            samples[i].append((*timed_steps(runs[i], steps, options), os.getloadavg()[0]))
    std_flops = count_model(runs[0].cfg)
    return [_summarise(run, s, samples[0], batch_size, std_flops, peak_tflops, _impl_used(run, options)) for run, s in zip(runs, samples)]


def _summarise(
    run: StepRun,
    s: list[tuple[float, float, float | None, float]],
    ref: list[tuple[float, float, float | None, float]],
    batch_size: int,
    std_flops: ModelCounts,
    peak_tflops: float | None,
    impl: str,
) -> BenchResult:
    """One variant's result from its (wall, cpu, memory, load) samples and the reference's."""
    step_s = statistics.median(x[0] for x in s)
    tokens_per_s = batch_size * run.cfg.seq_len / step_s
    counts = count_model(run.cfg)
    fpt = counts.flops_per_token
    ratios = [x[0] / x0[0] for x, x0 in zip(s, ref)]
    cpu_ratios = [x[1] / x0[1] for x, x0 in zip(s, ref)]
    mems = [x[2] for x in s if x[2] is not None]
    return BenchResult(
        spec=run.spec,
        impl=impl,
        step_s=step_s,
        tokens_per_s=tokens_per_s,
        ratio=statistics.median(ratios),
        ratio_iqr=_iqr(ratios),
        best_ratio=min(x[0] for x in s) / min(x[0] for x in ref),
        cpu_ratio=statistics.median(cpu_ratios),
        cpu_ratio_iqr=_iqr(cpu_ratios),
        flop_ratio=fpt / std_flops.flops_per_token,
        flops_per_token=fpt,
        executed_flop_ratio=counts.executed_flops_per_token / std_flops.executed_flops_per_token,
        mfu=fpt * tokens_per_s / (peak_tflops * 1e12) if peak_tflops else None,
        step_mem_gib=max(mems) if mems else None,
        load=statistics.median(x[3] for x in s),
    )


def _iqr(xs: list[float]) -> tuple[float, float]:
    """25th and 75th percentiles (both xs[0] for a single sample)."""
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def format_table(results: list[BenchResult]) -> str:
    """Markdown table of results (MFU and memory columns only where measured)."""
    mfu, mem = any(r.mfu is not None for r in results), any(r.step_mem_gib is not None for r in results)
    head = (
        "| variant | QK impl | step (ms) | tokens/s | step-time ratio vs standard | ratio IQR | best-of ratio | CPU-time ratio (IQR) "
        "| FLOP ratio | executed FLOP ratio |" + (" MFU |" if mfu else "") + (" step memory (GiB) |" if mem else "") + " load |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        row = (
            f"| {r.spec} | {r.impl} | {r.step_s * 1e3:.1f} | {r.tokens_per_s:,.0f} | {r.ratio:.3f} | "
            f"{r.ratio_iqr[0]:.3f}-{r.ratio_iqr[1]:.3f} | {r.best_ratio:.3f} | "
            f"{r.cpu_ratio:.3f} ({r.cpu_ratio_iqr[0]:.3f}-{r.cpu_ratio_iqr[1]:.3f}) | {r.flop_ratio:.4f} | "
            f"{r.executed_flop_ratio:.4f} |"
        )
        row += f" {r.mfu:.1%} |" if mfu and r.mfu is not None else " - |" if mfu else ""
        row += f" {r.step_mem_gib:.2f} |" if mem and r.step_mem_gib is not None else " - |" if mem else ""
        rows.append(row + f" {r.load:.1f} |")
    return "\n".join(rows)


# The GPU path (bf16 autocast, flash SDPA, compiled QK transform) at tiny CPU shapes: what
# --dry-run runs, so the tests know the GPU command works before a GPU is lent.
DRY_RUN = dict(
    preset="cpu-xs",
    variants=["standard", "coupled"],
    repeats=2,
    steps=1,
    batch_size=2,
    seq_len=32,
    vocab_size=128,
    device="cpu",
    amp="bf16",
    sdpa="flash",
    impl="compile",
    peak_tflops=1.0,
    warmup=1,
    no_append=True,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.model_steps", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-s", choices=list(PRESETS))
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--steps", type=int, default=1, help="timed optimizer steps per repeat (few: pairs then share machine load)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (compiles)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--vocab-size", type=int, default=4096, help="the CPU runs' tokenizer size")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: preset's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, default=None, help="accelerator peak (bf16 dense), for MFU")
    p.add_argument("--impl", default="auto", choices=QK_IMPLS, help="QK transform implementation")
    p.add_argument("--amp", default="auto", choices=["auto", "bf16", "none"], help="autocast (auto: bf16 on CUDA)")
    p.add_argument("--sdpa", default="auto", choices=["auto", "flash"], help="SDPA backend (flash: only flash)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--dry-run", action="store_true", help="the GPU path on CPU at tiny shapes (bf16, flash, compile); prints, never appends"
    )
    p.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    p.add_argument("--no-append", action="store_true", help="print only")
    return p


def _header(args: argparse.Namespace, argv: list[str] | None, machine: str, started: str) -> str:
    """The section heading and the machine / command / setup lines above a result table."""
    seq = args.seq_len or PRESETS[args.preset].seq_len
    command = shlex.join(["python", "-m", "benchmarks.model_steps", *(argv if argv is not None else sys.argv[1:])])
    mfu = f"MFU = model FLOPs x tokens/s / peak ({args.peak_tflops:g} TFLOP/s); " if args.peak_tflops else ""
    return (
        f"## benchmarks.model_steps: preset {args.preset}{' (dry run)' if args.dry_run else ''}, {started}\n\n"
        f"Machine: {machine}; load avg at end {os.getloadavg()[0]:.2f}.  \n"
        f"Command: `{command}`  \n"
        f"Setup: batch {args.batch_size} x {seq} tokens, vocab {args.vocab_size}, device {args.device}, "
        f"AdamW, amp {args.amp}, SDPA {args.sdpa}, QK impl {args.impl}; median of {args.repeats} interleaved "
        f"repeats of {args.steps} steps after {args.warmup} warm-up; ratios are medians of paired per-repeat "
        f"ratios (IQR: their 25th-75th percentiles; best-of: fastest step over standard's fastest); "
        f"FLOP ratio = analytic training FLOPs/token (model FLOPs; executed: what the kernels run, "
        f"`model.counts.ModelCounts`); {mfu}load = median 1-min load avg.\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.dry_run:
        vars(args).update(DRY_RUN)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description()
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    options = StepOptions(args.impl, args.amp, args.sdpa)
    try:
        results = run_bench(
            args.preset,
            args.variants,
            args.repeats,
            args.steps,
            args.batch_size,
            args.vocab_size,
            args.seq_len,
            args.device,
            args.peak_tflops,
            args.warmup,
            options,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = _header(args, argv, machine, started) + format_table(results)
    print(text)
    if not args.no_append:
        append_markdown(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
