"""CLI latency (`make bench`): ``qkstudy`` commands as a user runs them, one fresh process each.

    python -m benchmarks.cli_latency [--repeats 5]

What a researcher waits for before a command answers: validate and plan of jobs/cpu-demo.yaml,
status before any store exists and of a store holding one run, a cached ``data prepare``;
median, min and max over the repeats after one untimed run, and the heavy modules
(``HEAVY``) each command loaded (``cli_heavy_modules``, which the tests use too). A section
goes to BENCHMARKS.md (temp file, then rename).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.plan.planner import plan

HEAVY = ("torch", "mlflow", "ray", "pandas", "scipy", "pyarrow", "matplotlib", "deepspeed", "sentencepiece")
"""Modules whose import costs seconds (torch, mlflow) or a large share of one."""

_PROBE = (
    "import runpy, sys\n"
    "sys.argv = ['qkstudy', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('orchestrator.cli', run_name='__main__')\n"
    "except SystemExit as e:\n    code = e.code or 0\nelse:\n    code = 0\n"
    "heavy = {heavy!r}\n"
    "print('\\nHEAVY=' + ','.join(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def cli_heavy_modules(args: list[str], cwd: str | Path | None = None, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """(exit code, modules of `HEAVY` loaded) when ``qkstudy ARGS`` runs in a fresh interpreter.

    The command runs as ``python -m orchestrator.cli`` would (``runpy``), then the interpreter
    reports which heavy modules it imported: what a command pays for before it answers.
    """
    res = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args], capture_output=True, text=True, cwd=cwd, env=env)
    line = [x for x in res.stderr.splitlines() if x.startswith("HEAVY=")]
    if not line:
        raise RuntimeError(f"qkstudy {' '.join(args)} did not report its modules: {res.stderr[-2000:]}")
    return res.returncode, [m for m in line[-1].removeprefix("HEAVY=").split(",") if m]


def _cli_commands(tmp: Path) -> list[tuple[str, list[str]]]:
    """The commands `bench_cli` times, and a tracking store with one queued run for ``status``."""
    from mlflow.tracking import MlflowClient

    from orchestrator.plan.spec import load_spec
    from orchestrator.track.tracking import create_run, default_tracking_uri, ensure_experiment

    spec = "jobs/cpu-demo.yaml"
    study = load_spec(spec)
    store = default_tracking_uri(tmp / "store")
    client = MlflowClient(store)
    create_run(client, ensure_experiment(client, study.name), plan(study)[0])
    return [
        ("validate", ["validate", spec]),
        ("plan", ["plan", spec]),
        ("status, no store yet", ["status", spec, "--tracking-uri", default_tracking_uri(tmp / "none")]),
        ("status, a store", ["status", study.name, "--tracking-uri", store]),
        ("data prepare, cached", ["data", "prepare", "--source", "stdlib", "--vocab-size", "2048"]),
    ]


def bench_cli(repeats: int = 5) -> list[dict]:
    """Wall-clock seconds of ``qkstudy`` commands, each in a fresh interpreter
    (``python -m orchestrator.cli``), ``repeats`` times after one untimed run (which also
    prepares the cached corpus): median, min and max, and the heavy modules each loaded
    (`cli_heavy_modules`). Commands: validate and plan of jobs/cpu-demo.yaml, status of it
    before any store exists and of a store holding one run, a cached ``data prepare``."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="qkstudy-bench-cli-") as tmp:
        for label, args in _cli_commands(Path(tmp)):
            cmd = [sys.executable, "-m", "orchestrator.cli", *args]
            subprocess.run(cmd, capture_output=True, check=True)  # warm-up: page cache, prepared corpus
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                subprocess.run(cmd, capture_output=True, check=True)
                times.append(time.perf_counter() - t0)
            rows.append(
                {
                    "command": label,
                    "args": " ".join(args).replace(tmp, "<tmp>"),
                    "median_s": statistics.median(times),
                    "min_s": min(times),
                    "max_s": max(times),
                    "heavy": cli_heavy_modules(args)[1],
                    "load": os.getloadavg()[0],
                }
            )
    return rows


def _cli_rows(rows: list[dict], repeats: int) -> str:
    """The BENCHMARKS.md section of `bench_cli`'s rows."""
    from benchmarks.record import machine_description

    head = (
        f"\n## CLI latency: one fresh process per command (goal < 1.5 s; `model info` exempt)\n\n"
        f"{dt.date.today().isoformat()} - {machine_description()} - `python -m benchmarks.cli_latency "
        f"--repeats {repeats}`\n\n| command | median s | min s | max s | load avg | heavy modules imported |\n"
        "|---|---:|---:|---:|---:|---|\n"
    )
    return head + "".join(
        f"| `qkstudy {r['args']}` | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} | "
        f"{r['load']:.1f} | {', '.join(r['heavy']) or '-'} |\n"
        for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = ap.parse_args(argv)
    from benchmarks.record import append_markdown

    row = _cli_rows(bench_cli(args.repeats), args.repeats)
    print(row)
    append_markdown(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
