"""The diagnostics' spectrum: an SVD against the eigenvalues of A Aᵀ, in time and agreement.

    python -m benchmarks.diag_spectrum [--sizes 128 256 512 1024] [--device cpu|cuda]

For each map size T, 2 windows x 4 heads of two kinds of maps: causal softmax maps (random
scores of scale 3) and rank-one sink maps (every query on token 0). Times (median of 3)
``torch.linalg.svdvals`` in float64, the Gram route in float64 (``model.diagnostics.singular_values``)
and in float32, and the largest difference
each makes in effective rank and spectral gap against the float64 SVD. Appends a section to
BENCHMARKS.md with the machine, date and command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from benchmarks.record import append_markdown, machine_description
from model.diagnostics import rank_and_gap

OUT = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def _gram(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh(a @ a.transpose(-1, -2)).flip(-1).clamp_min(0).sqrt().double()


def _timed(fn: Callable[[], torch.Tensor], device: str) -> tuple[float, torch.Tensor]:
    times, out = [], None
    for _ in range(3):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    assert out is not None
    return statistics.median(times), out


def rows(sizes: list[int], device: str) -> list[str]:
    """One markdown row per (T, kind of map)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for t in sizes:
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        soft = torch.softmax((torch.randn(2, 4, t, t, generator=g, dtype=torch.float64) * 3).masked_fill(~causal, float("-inf")), -1)
        sink = torch.zeros(2, 4, t, t, dtype=torch.float64)
        sink[..., 0] = 1.0
        for kind, a in (("causal softmax", soft.to(device)), ("rank-one sink", sink.to(device))):
            t_svd, s = _timed(partial(torch.linalg.svdvals, a), device)
            t_g64, s64 = _timed(partial(_gram, a), device)
            t_g32, s32 = _timed(partial(_gram, a.float()), device)
            rank, gap = rank_and_gap(s)
            errs = []
            for other in (s64, s32):
                r, gg = rank_and_gap(other)
                errs += [float((r - rank).abs().max()), float((gg - gap).abs().max())]
            out.append(
                f"| {t} | {kind} | {t_svd * 1e3:.1f} | {t_g64 * 1e3:.1f} ({t_svd / t_g64:.2f}x) | {t_g32 * 1e3:.1f} | "
                f"{errs[0]:.1e} / {errs[1]:.1e} | {errs[2]:.1e} / {errs[3]:.1e} |"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args(argv)
    body = rows(args.sizes, args.device)
    text = "\n".join(
        [
            f"## The diagnostics' spectrum: SVD against the eigenvalues of A Aᵀ, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "",
            f"Machine: {machine_description()}. Command: `python -m benchmarks.diag_spectrum {' '.join(argv or sys.argv[1:])}`. "
            "8 maps (2 windows x 4 heads) per row, median of 3; error = largest difference in effective rank / spectral "
            "gap against the float64 SVD.",
            "",
            "| T | maps | float64 SVD (ms) | float64 Gram (ms) | float32 Gram (ms) | float64 Gram error | float32 Gram error |",
            "|---:|---|---:|---:|---:|---:|---:|",
            *body,
        ]
    )
    print(text)
    append_markdown(OUT, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
