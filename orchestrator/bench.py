"""Planner benchmark (`make bench`): time to validate and plan a 200-run study.

The study is the paper's variant set over five scales, five seeds and three extend runs of
the reference, declared for a 64-GPU cluster (8 workers x 1 GPU per run). Timing is the
median of several repeats of ``parse_spec`` + ``plan`` in one process, after one warm-up
(imports). A dated row goes to BENCHMARKS.md (temp file, then rename).

    python -m orchestrator.bench [--repeats 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

from .planner import plan
from .spec import parse_spec

STUDY = {
    "name": "bench-200",
    "scales": ["cpu-s", "cpu-m", "60m", "150m", "350m"],
    "variants": ["standard", "coupled", {"name": "coupled_leapfrog", "kind": "coupled", "options": {"integrator": "leapfrog"}},
                 "uncoupled_mlp", "differential"],
    "seeds": [0, 1, 2, 3, 4],
    "budget": {"mode": "flops", "tokens_per_param": 20},
    "extend": [2, 2.4, 3],
    "tokenizer": {"vocab_size": 32000},
    "resources": {"workers": 8, "gpus_per_worker": 1, "cpus_per_worker": 8},
}


def bench(repeats: int = 5) -> tuple[int, float]:
    """(number of runs, median seconds to validate and plan the study)."""
    n = len(plan(parse_spec(STUDY)))  # warm-up: imports, first model build
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan(parse_spec(STUDY))
        times.append(time.perf_counter() - t0)
    return n, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = ap.parse_args(argv)
    n, secs = bench(args.repeats)
    from model.bench import machine_description

    machine = machine_description()
    row = (f"\n## Planner: validate + plan a {n}-run study (64-GPU cluster declared)\n\n"
           f"{dt.date.today().isoformat()} - {machine} - `python -m orchestrator.bench --repeats {args.repeats}`\n\n"
           f"| runs | median seconds | target |\n|---:|---:|---:|\n| {n} | {secs:.3f} | < 2 |\n")
    print(row)
    old = args.out.read_text() if args.out.exists() else "# Benchmarks\n"
    tmp = args.out.with_suffix(".md.tmp")
    tmp.write_text(old + row)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
