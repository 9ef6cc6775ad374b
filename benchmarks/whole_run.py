"""A whole run through the stack against the plain loop, back to back (`make bench`).

    python -m benchmarks.whole_run [--tokens 4100000] [--scale cpu-xs] [--variant standard]

Writes a one-run study (every field but these at its default, corpus stdlib) to a fresh folder
and times, back to back on this machine:
  - **stack**: ``qkstudy run SPEC`` as a user runs it, from the command to its exit;
  - **plain**: ``python -m benchmarks.plain_loop SPEC --data <the run's prepared data>``, the same
    run trained in one process with no Ray, DeepSpeed or MLflow.
The goal is stack / plain <= 1.05. The stack's run is then read back from its MLflow store: its
start-up timeline (``startup/*_s``, command to first optimizer step) and its time split
(``time/*_s``: steps, evaluation, checkpoints), so the gap is explained where it is, and
what is left of the command's wall-clock is logging, the final weights, Ray's shutdown and exit. Appends a
section to BENCHMARKS.md with the machine, date, command and load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QKSTUDY = Path(sys.executable).with_name("qkstudy")


def study_yaml(name: str, tokens: int, scale: str, variant: str) -> str:
    return f"name: {name}\nscales: [{scale}]\nvariants: [{variant}]\nbudget: {{mode: tokens, tokens: {tokens}}}\n"


def _timed(argv: list[str], cwd: Path) -> tuple[float, str]:
    """(wall-clock seconds, stdout) of a command; raises RuntimeError naming it if it fails."""
    t0 = time.perf_counter()
    # the study's own store in cwd (stack_run_record reads it there), whatever the shell exports
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "PYTHONPATH": str(REPO)}
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr[-2000:]}")
    return wall, res.stdout


def stack_run_record(folder: Path, study: str) -> dict[str, Any]:
    """The study's one training run from its store: data_path, startup/* and time/* metrics."""
    from mlflow.tracking import MlflowClient

    from orchestrator.track.tracking import KIND_TAG, KIND_TRAIN, default_tracking_uri

    client = MlflowClient(default_tracking_uri(folder / "runs" / study))
    exp = client.get_experiment_by_name(study)
    if exp is None:
        raise RuntimeError(f"whole-run benchmark: no experiment {study} under {folder}")
    (run,) = client.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{KIND_TRAIN}'")
    return {"data_path": run.data.params["data_path"], "metrics": dict(run.data.metrics)}


def bench(tokens: int, scale: str, variant: str) -> dict[str, Any]:
    """Both arms, back to back, in a fresh folder: walls, the plain loop's JSON, the run's metrics."""
    study = f"whole-run-{dt.datetime.now():%H%M%S}"
    with tempfile.TemporaryDirectory(prefix="whole-run-") as tmp:
        folder = Path(tmp)
        (folder / "study.yaml").write_text(study_yaml(study, tokens, scale, variant))
        load_before = os.getloadavg()
        stack_wall, _ = _timed([str(QKSTUDY), "run", "study.yaml"], folder)
        record = stack_run_record(folder, study)
        plain_wall, out = _timed([sys.executable, "-m", "benchmarks.plain_loop", "study.yaml", "--data", record["data_path"]], folder)
    return {
        "study": study_yaml(study, tokens, scale, variant),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "stack_wall": stack_wall,
        "plain_wall": plain_wall,
        "plain": json.loads(out.strip().splitlines()[-1]),
        "metrics": record["metrics"],
    }


def section(r: dict[str, Any], argv: list[str]) -> str:
    """The BENCHMARKS.md section of one ``bench``."""
    from benchmarks.record import machine_description
    from orchestrator.track.timeline import PREFIX, SECTIONS, TOTAL

    m, plain = r["metrics"], r["plain"]
    ratio = r["stack_wall"] / r["plain_wall"]
    inside = sum(m.get(f"time/{k}_s", 0.0) for k in ("step", "eval", "diag", "checkpoint"))
    rows = [
        ("stack: `qkstudy run`, command to exit", r["stack_wall"]),
        ("- before the run's loop (CLI, Ray, data, MLflow, worker group, engine: the timeline below)", m.get(TOTAL, float("nan"))),
        ("- optimizer steps", m.get("time/step_s", float("nan"))),
        ("- evaluation (curve points and the final pass)", m.get("time/eval_s", float("nan"))),
        ("- attention diagnostics (at the curve points the cadence picks)", m.get("time/diag_s", 0.0)),
        ("- checkpoints and final weights", m.get("time/checkpoint_s", float("nan"))),
        (
            "- the rest: logging, final weights, Ray shutdown, exit (the first step counts in the timeline and the steps)",
            r["stack_wall"] - m.get(TOTAL, 0.0) - inside,
        ),
        (f"plain loop: one process, {plain['threads']} thread(s), command to exit", r["plain_wall"]),
        ("- optimizer steps", plain["step_s"]),
    ]
    timeline = [(s, m[f"{PREFIX}{s}_s"]) for s in SECTIONS if f"{PREFIX}{s}_s" in m]
    la, lb = r["load_before"], r["load_after"]
    return (
        f"\n## A whole run: the stack against a plain loop, back to back ({plain['tokens']:,} tokens, {plain['steps']:,} steps)\n\n"
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC - {machine_description()} - load avg before "
        f"{la[0]:.2f} {la[1]:.2f} {la[2]:.2f}, after {lb[0]:.2f} - `python -m benchmarks.whole_run {' '.join(argv)}`\n\n"
        "```yaml\n"
        + r["study"]
        + "```\n\n| | seconds |\n|---|---:|\n"
        + "".join(f"| {k} | {v:.1f} |\n" for k, v in rows)
        + f"\n**stack / plain = {ratio:.3f}** (goal <= 1.05); stack steps / plain steps = "
        f"{m.get('time/step_s', float('nan')) / plain['step_s']:.3f}.\n\n"
        "Start-up timeline of the stack's run (`startup/*_s`):\n\n| section | s |\n|---|---:|\n"
        + "".join(f"| {s} | {v:.1f} |\n" for s, v in timeline)
        + f"| **total** | **{m.get(TOTAL, float('nan')):.1f}** |\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4_100_000)
    ap.add_argument("--scale", default="cpu-xs")
    ap.add_argument("--variant", default="standard")
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    args = ap.parse_args(argv)
    from benchmarks.record import append_markdown

    text = section(bench(args.tokens, args.scale, args.variant), sys.argv[1:] if argv is None else argv)
    print(text)
    append_markdown(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
