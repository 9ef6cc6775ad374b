"""The Ray Train workers' entry point, under a name whose module imports nothing heavy.

Why: Ray pickles a train function by reference, so every process that unpickles it imports the
module that defines it. The pack's task (``run.driver.packing``) builds the TorchTrainer but
never runs the loop: naming ``run.worker.loop``'s function there would make the task import
DeepSpeed, the model and the recorder before its worker group starts, about a second on the
critical path of every pack (BENCHMARKS.md, start-up timeline). The worker imports them here,
when it enters.
"""

from __future__ import annotations

from typing import Any


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """``run.worker.loop.train_loop_per_worker(config)``, imported on entry (see the module's doc)."""
    from orchestrator.run.worker.loop import train_loop_per_worker as loop

    loop(config)
