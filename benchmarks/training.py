"""Study benchmarks (`make bench`): validate and plan a 200-run study, train through the stack.

The study is the paper's variant set over five scales, five seeds and three extend runs of
the reference, declared for a 64-GPU cluster (8 workers x 1 GPU per run). Timing is the
median of several repeats of ``parse_spec`` + ``plan`` in one process, after one warm-up
(imports). A dated row goes to BENCHMARKS.md (temp file, then rename).

    python -m benchmarks.training [--repeats 5] [--training]

``--training`` also times cpu-s training through the whole stack with 1 and 2 workers;
``--startup`` times a study of tiny runs with one Ray Train worker group per run against one
group for all of them (``resources.runs_per_trainer``): the per-run start-up cost.
(``python -m benchmarks.cli_latency`` times the ``qkstudy`` commands themselves.)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec

STUDY = {
    "name": "bench-200",
    "scales": ["cpu-s", "cpu-m", "60m", "150m", "350m"],
    "variants": [
        "standard",
        "coupled",
        {"name": "coupled_leapfrog", "kind": "coupled", "options": {"integrator": "leapfrog"}},
        "uncoupled_mlp",
        "differential",
    ],
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


@contextlib.contextmanager
def local_ray() -> Iterator[Path]:
    """A local 2-CPU Ray for the training benchmarks and a scratch folder for their stores."""
    import ray

    ray.init(address="local", num_cpus=2, namespace="qkstudy", include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield Path(tempfile.mkdtemp(prefix="qkstudy-bench-"))
    finally:
        ray.shutdown()


def bench_training(steps: int = 60) -> list[dict]:
    """cpu-s training through the real stack (local Ray, Ray Train, DeepSpeed ZeRO-2, MLflow)
    with 1 worker x 2 CPUs and 2 workers x 1 CPU: median tokens/s, checkpoint size and times,
    read back from MLflow."""
    from mlflow.tracking import MlflowClient
    from rich.console import Console

    from orchestrator.run.driver.runner import run_runs
    from orchestrator.track.tracking import KIND_TAG, KIND_TRAIN, default_tracking_uri

    rows = []
    with local_ray() as tmp:
        for workers, cpus in ((1, 2), (2, 1)):
            name = f"bench-w{workers}"
            study = parse_spec(
                {
                    "name": name,
                    "scales": ["cpu-s"],
                    "variants": ["standard"],
                    "tokenizer": {"vocab_size": 2048},
                    "budget": {"mode": "tokens", "tokens": steps * 2048},
                    "eval": {"num_evals": 3, "max_windows": 16, "diagnostics": False},
                    "train": {"log_every_steps": 5},
                    "resources": {"workers": workers, "cpus_per_worker": cpus, "zero_stage": 2},
                }
            )
            uri = default_tracking_uri(tmp / name)
            run_runs(plan(study), name, uri, str(tmp / name / "ray"), console=Console(quiet=True))
            c = MlflowClient(uri)
            exp = c.get_experiment_by_name(name)
            if exp is None:  # run_runs creates it before any run starts
                raise RuntimeError(f"training benchmark {name}: no MLflow experiment in {uri}")
            (r,) = c.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{KIND_TRAIN}'")
            hist = functools.partial(_history, c, r.info.run_id)
            rows.append(
                {
                    "workers": workers,
                    "cpus_per_worker": cpus,
                    "tokens_per_s": statistics.median(hist("throughput/tokens_per_s")[1:]),
                    "checkpoint_mb": hist("checkpoint/bytes")[-1] / 1e6,
                    "save_s": statistics.median(hist("checkpoint/save_s")),
                    "persist_s": statistics.median(hist("checkpoint/persist_s")),
                }
            )
    return rows


def _history(client, run_id: str, key: str) -> list[float]:
    """The values of one metric of one MLflow run, in logged order."""
    return [m.value for m in client.get_metric_history(run_id, key)]


def bench_startup(n_runs: int = 4, steps: int = 4) -> list[dict]:
    """Seconds per run of a study of ``n_runs`` cpu-xs runs of ``steps`` optimizer steps each
    (training itself takes about a second), with runs_per_trainer 1 and ``n_runs``: what
    starting a Ray Train worker group costs. Local Ray started once, data cached, 1 worker x 2 CPUs."""
    from rich.console import Console

    from orchestrator.run.driver.runner import run_runs
    from orchestrator.track.tracking import default_tracking_uri

    rows = []
    with local_ray() as tmp:
        for per in (1, n_runs):
            name = f"bench-startup-{per}"
            study = parse_spec(
                {
                    "name": name,
                    "scales": ["cpu-xs"],
                    "variants": ["standard", "coupled"],
                    "seeds": list(range((n_runs + 1) // 2)),
                    "tokenizer": {"vocab_size": 2048},
                    "budget": {"mode": "tokens", "tokens": steps * 2048},
                    "eval": {"num_evals": 1, "max_windows": 8, "final_max_windows": 8, "diagnostics": False},
                    "resources": {"workers": 1, "cpus_per_worker": 2, "zero_stage": 0, "runs_per_trainer": per},
                }
            )
            runs = plan(study)[:n_runs]
            res = run_runs(runs, name, default_tracking_uri(tmp / name), str(tmp / name / "ray"), console=Console(quiet=True))
            if not res.ok:  # a benchmark of failed runs would time the failure
                raise RuntimeError(f"start-up benchmark runs did not finish: {res.reasons}")
            rows.append({"runs_per_trainer": per, "runs": len(runs), "study_s": res.wall_s, "per_run_s": res.wall_s / len(runs)})
    return rows


def _append(out: Path, text: str) -> None:
    from benchmarks.record import append_markdown

    append_markdown(out, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--training", action="store_true", help="also time cpu-s training with 1 and 2 workers")
    ap.add_argument("--startup", action="store_true", help="also time per-run start-up, one worker group per run vs one for all")
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = ap.parse_args(argv)
    from benchmarks.record import machine_description

    n, secs = bench(args.repeats)
    row = (
        f"\n## Planner: validate + plan a {n}-run study (64-GPU cluster declared)\n\n"
        f"{dt.date.today().isoformat()} - {machine_description()} - `python -m benchmarks.training --repeats {args.repeats}`\n\n"
        f"| runs | median seconds | target |\n|---:|---:|---:|\n| {n} | {secs:.3f} | < 2 |\n"
    )
    if args.training:
        rows = bench_training()
        row += (
            f"\n## Training: cpu-s, Ray Train + DeepSpeed ZeRO-2 on CPU\n\n{dt.date.today().isoformat()} - "
            f"{machine_description()} - `python -m benchmarks.training --training`\n\n"
            "| workers x CPUs | tokens/s (median) | checkpoint (MB, all ranks) | save (s) | persist (s) |\n|---|---:|---:|---:|---:|\n"
        )
        row += "".join(
            f"| {r['workers']} x {r['cpus_per_worker']} | {r['tokens_per_s']:,.0f} | {r['checkpoint_mb']:.1f} | "
            f"{r['save_s']:.3f} | {r['persist_s']:.3f} |\n"
            for r in rows
        )
    if args.startup:
        rows = bench_startup()
        row += (
            f"\n## Per-run start-up: Ray Train worker groups (cpu-xs runs of 4 steps, 1 worker x 2 CPUs, ZeRO-0)\n\n"
            f"{dt.date.today().isoformat()} - {machine_description()} - `python -m benchmarks.training --startup`\n\n"
            "| runs_per_trainer | runs | study seconds (data cached, Ray up) | seconds per run |\n|---:|---:|---:|---:|\n"
        )
        row += "".join(f"| {r['runs_per_trainer']} | {r['runs']} | {r['study_s']:.1f} | {r['per_run_s']:.1f} |\n" for r in rows)
    print(row)
    _append(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
