"""The demo's wall-clock and its time outside optimizer steps, two settings back to back.

    python -m benchmarks.demo [--baseline KEY=VALUE ...]

Runs what `make demo` runs (``qkstudy run jobs/cpu-demo.yaml`` then ``qkstudy report``), each
arm in a fresh folder with the data cache as it is: first with the ``--baseline`` overrides
(default ``resources.runs_per_trainer=1``: one worker group per run, the demo before it
packed its runs), then as committed. Per arm: the two commands' wall-clock, the runs' optimizer
seconds (``time/step_s`` summed over runs, rank 0) and the share of the wall-clock outside
them. Appends a section to BENCHMARKS.md with the machine, date, command and load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "jobs" / "cpu-demo.yaml"
QKSTUDY = Path(sys.executable).with_name("qkstudy")


def demo_arm(overrides: list[str]) -> dict[str, Any]:
    """`make demo`'s two commands with ``overrides`` in a fresh folder: wall-clock seconds of
    each, the summed ``time/step_s`` of the study's runs. Raises RuntimeError if one fails."""
    from mlflow.tracking import MlflowClient

    from orchestrator.track.tracking import KIND_TAG, KIND_TRAIN, default_tracking_uri

    # The demo's own store in the arm's folder, as `make demo` on a fresh machine: an exported
    # MLFLOW_TRACKING_URI would send the runs elsewhere (and mix the arms in one study).
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    with tempfile.TemporaryDirectory(prefix="demo-bench-") as tmp:
        folder = Path(tmp)
        shutil.copy(SPEC, folder / SPEC.name)
        walls = {}
        for name, argv in (
            ("run", [str(QKSTUDY), "run", SPEC.name, *overrides]),
            ("report", [str(QKSTUDY), "report", SPEC.name, "--out", "runs/cpu-demo/report"]),
        ):
            t0 = time.perf_counter()
            res = subprocess.run(argv, cwd=folder, capture_output=True, text=True, env=env)
            walls[name] = time.perf_counter() - t0
            if res.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr[-2000:]}")
        client = MlflowClient(default_tracking_uri(folder / "runs" / "cpu-demo"))
        exp = client.get_experiment_by_name("cpu-demo")
        if exp is None:
            raise RuntimeError(f"demo benchmark: no experiment cpu-demo under {folder}")
        runs = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{KIND_TRAIN}'")
    steps = sum(r.data.metrics.get("time/step_s", 0.0) for r in runs)
    return {"overrides": overrides, "walls": walls, "runs": len(runs), "step_s": steps}


def section(arms: list[dict[str, Any]], loads: list[str], argv: list[str]) -> str:
    """The BENCHMARKS.md section of the arms, the first being the baseline."""
    from benchmarks.record import machine_description

    rows = ""
    for a in arms:
        wall = sum(a["walls"].values())
        rows += (
            f"| {' '.join(a['overrides']) or 'as committed'} | {a['runs']} | {a['walls']['run']:.0f} | {a['walls']['report']:.0f} | "
            f"{wall:.0f} | {a['step_s']:.0f} | {1 - a['step_s'] / wall:.1%} | {wall / sum(arms[0]['walls'].values()):.2f} |\n"
        )
    return (
        f"\n## The demo, back to back: `make demo`'s commands with and without {' '.join(arms[0]['overrides'])}\n\n"
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC - {machine_description()} - load avg before each arm "
        f"{', '.join(loads)} - `python -m benchmarks.demo {' '.join(argv)}`\n\n"
        "| arm | runs | run s | report s | wall s | optimizer steps s | outside steps | wall / baseline |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n" + rows + "\nGoals: outside steps < 15%; wall / baseline <= 0.75.\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", nargs="*", default=["resources.runs_per_trainer=1"])
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = ap.parse_args(argv)
    from benchmarks.record import append_markdown

    arms, loads = [], []
    committed: list[str] = []
    for overrides in (args.baseline, committed):
        loads.append(f"{os.getloadavg()[0]:.2f}")
        arms.append(demo_arm(overrides))
    text = section(arms, loads, sys.argv[1:] if argv is None else argv)
    print(text)
    append_markdown(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
