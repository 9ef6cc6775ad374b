"""Training-step benchmark of every attention variant at one preset (`make bench`).

Times full optimizer steps (forward + backward + AdamW) of each variant on a fixed random
batch. Variants run interleaved in the same process (each repeat times every variant once,
in a rotated order, after warm-up), so load drift hits all of them alike; the ratio to
`standard` is the median over repeats of the paired per-repeat ratios. The same ratio of
process CPU time is reported too (less sensitive to other processes on a shared machine,
though it also counts OpenMP spin-waits). The FLOP ratio from the analytic counts sits
beside them: the wall-clock overhead of a variant should approach its FLOP overhead. A dated Markdown table (machine, torch, command) is appended to
BENCHMARKS.md (written to a temp file, then renamed).

    python -m model.bench [--preset cpu-s] [--variants standard coupled coupled:integrator=leapfrog]
                          [--repeats 15] [--steps 1] [--batch-size 8] [--vocab-size 4096]

A variant spec is NAME or NAME:opt=value,opt=value with options of `build_config`.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from model.config import ModelConfig
from model.gpt import GPT, count_model
from model.presets import PRESETS, build_config

DEFAULT_VARIANTS = ("standard", "coupled", "coupled:integrator=leapfrog", "uncoupled_mlp",
                    "differential", "coupled_differential")


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """'coupled:integrator=leapfrog,n_steps=2' -> ('coupled', {'integrator': 'leapfrog', 'n_steps': 2}).
    Raises ValueError for an option without '='."""
    name, _, rest = spec.partition(":")
    opts: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"variant spec {spec!r}: option {item!r} is not key=value")
        for convert in (int, float):
            try:
                opts[key] = convert(value)
                break
            except ValueError:
                continue
        else:
            opts[key] = None if value == "None" else value
    return name, opts


@dataclass
class BenchResult:
    spec: str
    step_s: float  # median seconds per optimizer step
    tokens_per_s: float
    ratio: float  # step time / standard step time (median of paired ratios)
    cpu_ratio: float  # same for process CPU time per step
    flop_ratio: float  # analytic training FLOPs per token / standard's
    flops_per_token: int
    mfu: float | None


def machine_description() -> str:
    """CPU model, CPU count, torch build, threads and load average (and the GPU, if any):
    the machine line every benchmark row carries."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        cpu += f"; GPU {torch.cuda.get_device_name()}"
    return (f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, load avg {os.getloadavg()[0]:.2f}")


@dataclass
class _Run:
    spec: str
    cfg: ModelConfig
    model: GPT
    opt: torch.optim.Optimizer
    idx: torch.Tensor  # [batch, seq_len + 1] fixed random tokens


def _build_runs(preset: str, specs: list[str], batch_size: int, vocab_size: int, seq_len: int | None,
                device: str) -> list[_Run]:
    """One model (seed 0), AdamW and fixed batch per spec; 'standard' first."""
    if specs[0] != "standard":
        specs = ["standard", *[s for s in specs if s != "standard"]]
    runs = []
    for spec in specs:
        name, opts = parse_variant(spec)
        cfg = build_config(preset, name, vocab_size=vocab_size, seq_len=seq_len, **opts)
        model = GPT(cfg, seed=0).to(device)
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, vocab_size, (batch_size, cfg.seq_len + 1), generator=g).to(device)
        runs.append(_Run(spec, cfg, model, torch.optim.AdamW(model.parameters(), lr=3e-4), idx))
    return runs


def _step(run: _Run, amp: Any) -> None:
    """One optimizer step (forward, backward, AdamW) on the run's fixed batch."""
    run.opt.zero_grad(set_to_none=True)
    with amp if amp is not None else contextlib.nullcontext():
        _, loss = run.model(run.idx[:, :-1], run.idx[:, 1:])
    cast(torch.Tensor, loss).backward()  # not None: targets were given
    run.opt.step()


def _timed(run: _Run, steps: int, amp: Any, cuda: bool) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) per step over `steps` steps."""
    if cuda:
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        _step(run, amp)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


def run_bench(preset: str, specs: list[str], repeats: int, steps: int, batch_size: int,
              vocab_size: int, seq_len: int | None, device: str, peak_tflops: float | None,
              warmup: int = 2) -> list[BenchResult]:
    """Time each variant spec (see module docstring); 'standard' is put first (the reference).
    Raises ValueError for a bad spec (`parse_variant`, `build_config`)."""
    cuda = device.startswith("cuda")
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else None
    runs = _build_runs(preset, specs, batch_size, vocab_size, seq_len, device)
    for run in runs:
        for _ in range(warmup):
            _step(run, amp)
    times: list[list[float]] = [[] for _ in runs]
    cpu: list[list[float]] = [[] for _ in runs]
    for r in range(repeats):
        for i in [(i + r) % len(runs) for i in range(len(runs))]:  # rotate to cancel position bias
            wall, cpu_s = _timed(runs[i], steps, amp, cuda)
            times[i].append(wall)
            cpu[i].append(cpu_s)
    std_flops = count_model(runs[0].cfg).flops_per_token
    results = []
    for run, ts, cs in zip(runs, times, cpu):
        step_s = statistics.median(ts)
        tokens_per_s = batch_size * run.cfg.seq_len / step_s
        fpt = count_model(run.cfg).flops_per_token
        results.append(BenchResult(
            spec=run.spec, step_s=step_s, tokens_per_s=tokens_per_s,
            ratio=statistics.median(t / t0 for t, t0 in zip(ts, times[0])),
            cpu_ratio=statistics.median(c / c0 for c, c0 in zip(cs, cpu[0])),
            flop_ratio=fpt / std_flops, flops_per_token=fpt,
            mfu=fpt * tokens_per_s / (peak_tflops * 1e12) if peak_tflops else None))
    return results


def format_table(results: list[BenchResult]) -> str:
    """Markdown table of results."""
    mfu = any(r.mfu is not None for r in results)
    head = ("| variant | step (ms) | tokens/s | step-time ratio vs standard | CPU-time ratio | FLOP ratio |"
            + (" MFU |" if mfu else ""))
    rows = [head, "|" + "---|" * (7 if mfu else 6)]
    for r in results:
        row = (f"| {r.spec} | {r.step_s * 1e3:.1f} | {r.tokens_per_s:,.0f} | {r.ratio:.3f} | "
               f"{r.cpu_ratio:.3f} | {r.flop_ratio:.4f} |")
        rows.append(row + (f" {r.mfu:.1%} |" if mfu else ""))
    return "\n".join(rows)


def append_markdown(path: Path, text: str) -> None:
    """Append text to path atomically (temp file in the same folder, then rename)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644  # mkstemp would leave 0600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-s", choices=list(PRESETS))
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--steps", type=int, default=1,
                   help="timed optimizer steps per repeat (few: pairs then share machine load)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--vocab-size", type=int, default=4096, help="the CPU runs' tokenizer size")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: preset's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, default=None, help="accelerator peak, for MFU")
    p.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    p.add_argument("--no-append", action="store_true", help="print only")
    args = p.parse_args(argv)
    machine = machine_description()
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        results = run_bench(args.preset, args.variants, args.repeats, args.steps, args.batch_size,
                            args.vocab_size, args.seq_len, args.device, args.peak_tflops)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seq = args.seq_len or PRESETS[args.preset].seq_len
    text = (f"## model.bench: preset {args.preset}, {started}\n\n"
            f"Machine: {machine}.  \n"
            f"Command: `{shlex.join(['python', '-m', 'model.bench', *(argv if argv is not None else sys.argv[1:])])}`  \n"
            f"Setup: batch {args.batch_size} x {seq} tokens, vocab {args.vocab_size}, device {args.device}, "
            f"AdamW; median of {args.repeats} interleaved repeats of {args.steps} steps; "
            f"ratios are medians of paired per-repeat ratios; FLOP ratio = analytic training FLOPs/token.\n\n"
            + format_table(results))
    print(text)
    if not args.no_append:
        append_markdown(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
