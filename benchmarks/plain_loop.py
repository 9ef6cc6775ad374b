"""The plain training loop a study's run is measured against (`benchmarks.whole_run`).

    python -m benchmarks.plain_loop SPEC --data PREPARED_DATA [--threads N]

One process, no Ray, no DeepSpeed, no MLflow: the spec's one run (the same model code, seed,
batches from the same prepared data, AdamW, schedule and clipping) trained step for step by
``benchmarks.bare_steps.run_bare``, with as many torch threads as the run's workers get
(``resources.cpus_per_worker``). No evaluation: the stack's evaluations count against it.
Prints one JSON line: {"tokens", "steps", "threads", "step_s", "process_s"} (``process_s``: from
this interpreter's start, imports included, to the last step).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import psutil


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("--data", required=True, help="the prepared data folder the stack's run trained on (its data_path param)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the run's cpus_per_worker)")
    args = ap.parse_args(argv)
    from benchmarks.bare_steps import run_bare
    from orchestrator.plan.planner import plan
    from orchestrator.plan.spec import load_spec

    (run,) = plan(load_spec(args.spec))
    threads = args.threads or max(1, int(run.resources.cpus_per_worker))
    tokens_per_s, _ = run_bare(run, args.data, threads=threads)
    process_s = time.time() - psutil.Process().create_time()
    print(
        json.dumps(
            {"tokens": run.tokens, "steps": run.steps, "threads": threads, "step_s": run.tokens / tokens_per_s, "process_s": process_s}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
