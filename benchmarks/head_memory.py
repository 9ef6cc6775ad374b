"""What each Ray Train worker group costs the driver's node, besides its workers (`make bench`).

    python -m benchmarks.head_memory [--groups 1 2 4]

For each count G: a study of G one-run packs (cpu-xs, one worker of 2/G CPUs each,
``runs_per_trainer: 1``) is started with ``qkstudy run`` on a local Ray, every run held at its
second optimizer step (the ``QKSTUDY_TEST_HOLD_AT_STEP`` fault point), and the unique memory
(USS: pages no other process shares) of each Ray process on the machine is summed by role:
the packs' tasks and Ray Train's control actors (controller, placement-group cleaner, dataset
manager, synchronization actor, preemption watcher, autoscaling coordinator), which all live on
the driver's node (the head, on a cluster), against the workers. Appends a section to
BENCHMARKS.md: the per-group cost and its extrapolation to 64 slots.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

from benchmarks.record import append_markdown, machine_description

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "BENCHMARKS.md"
QKSTUDY = Path(sys.executable).with_name("qkstudy")
# Process titles Ray gives actors and tasks (``ray::<Class>`` / ``ray::<function>``).
CONTROL = (
    "TrainController",
    "PlacementGroupCleaner",
    "DatasetManager",
    "SynchronizationActor",
    "PreemptionWatcher",
    "AutoscalingCoordinator",
)


def study_yaml(groups: int) -> str:
    variants = ", ".join(["standard", "coupled", "uncoupled_mlp", "differential"][:groups])
    seeds = list(range(max(1, groups // 4)))
    return (
        f"name: head-memory-{groups}\nscales: [cpu-xs]\nvariants: [{variants}]\nseeds: {seeds}\n"
        "budget: {mode: tokens, tokens: 40960}\ntrain: {global_batch: 8, seq_len: 64}\n"
        "eval: {num_evals: 1, max_windows: 4, final_max_windows: 4, diagnostics: false}\n"
        f"resources: {{workers: 1, cpus_per_worker: {2 / groups:g}, runs_per_trainer: 1}}\n"
    )


def role(p: psutil.Process) -> str | None:
    """The Ray role of a process from its title, or None for a process that is not Ray's."""
    try:
        title = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    for name in CONTROL:
        if f"ray::{name}" in title or f"ray::_{name}" in title:
            return name
    if "ray::fit_pack" in title:
        return "pack task"
    if "ray::RayTrainWorker" in title:
        return "worker"
    return None


def measure(groups: int) -> dict[str, list[int]]:
    """USS in bytes of each Ray process by role, with ``groups`` packs held mid-run."""
    with tempfile.TemporaryDirectory(prefix="head-memory-") as tmp:
        folder = Path(tmp)
        (folder / "study.yaml").write_text(study_yaml(groups))
        hold = folder / "held"
        env = {**os.environ, "QKSTUDY_TEST_HOLD_AT_STEP": "2", "QKSTUDY_TEST_HOLD_FILE": str(hold)}
        env.pop("RAY_ADDRESS", None)
        null = subprocess.DEVNULL
        argv = [str(QKSTUDY), "run", "study.yaml"]
        driver = subprocess.Popen(argv, cwd=folder, env=env, start_new_session=True, stdout=null, stderr=null)
        try:
            deadline = time.time() + 600
            while time.time() < deadline:
                found = defaultdict(list)
                for p in psutil.process_iter():
                    r = role(p)
                    if r is not None:
                        found[r].append(p)
                if hold.exists() and len(found["TrainController"]) >= groups and len(found["worker"]) >= groups:
                    time.sleep(5)  # every group at its hold
                    return {r: [p.memory_full_info().uss for p in ps if p.is_running()] for r, ps in found.items()}
                time.sleep(1)
            raise RuntimeError(f"{groups} group(s) not all held within 600 s")
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], capture_output=True)


def section(results: dict[int, dict[str, list[int]]], argv: list[str]) -> str:
    mib = 2**20
    roles = ["pack task", *CONTROL]
    lines = [
        f"## Driver-node memory per Ray Train worker group, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {machine_description()}. Command: `python -m benchmarks.head_memory {' '.join(argv)}`. Unique memory "
        "(USS, MiB) summed per role over the processes of G held one-run packs on a local Ray.",
        "",
        "| groups | " + " | ".join(roles) + " | control per group | workers per group |",
        "|---:|" + "---:|" * (len(roles) + 2),
    ]
    per_group = []
    for g, found in sorted(results.items()):
        sums = [sum(found.get(r, [])) / mib for r in roles]
        control = sum(sums) / g
        per_group.append(control)
        worker = sum(found.get("worker", [])) / mib / g
        lines.append(f"| {g} | " + " | ".join(f"{x:,.0f}" for x in sums) + f" | {control:,.0f} | {worker:,.0f} |")
    top = max(per_group)
    lines += ["", f"At {top:,.0f} MiB per group, 64 slots (one group each) need {64 * top / 1024:,.1f} GiB on the driver's node."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args(argv)
    results = {g: measure(g) for g in args.groups}
    text = section(results, argv if argv is not None else sys.argv[1:])
    print(text)
    append_markdown(OUT, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
