"""Live progress of a study: a named Ray actor that rank 0 of each run writes to.

The driver polls it to draw one bar per run and one for the study. It holds only the latest
numbers of each run (tokens, planned tokens, last train loss, state); MLflow stays the record.
"""

from __future__ import annotations

import time
from typing import Any

import ray


@ray.remote(num_cpus=0)
class ProgressBoard:
    """Latest progress per run: ``update`` from workers, ``snapshot`` for the driver."""

    def __init__(self) -> None:
        self._runs: dict[str, dict[str, Any]] = {}

    def update(self, run_id: str, **fields: Any) -> None:
        """Merge ``fields`` (tokens, planned, loss, state) into the run's latest numbers."""
        self._runs.setdefault(run_id, {}).update(fields, updated=time.time())

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Latest numbers of every run, keyed by run_id."""
        return self._runs


def board_name(study: str) -> str:
    """Ray actor name of the study's progress board."""
    return f"qkstudy-progress-{study}"


def on_driver_node() -> Any:
    """Ray scheduling strategy pinning a zero-CPU task or actor to the driver's node. Without
    it Ray may place one on a worker node, and losing that node (preemption, a killed
    container) would take the study's driver down with it instead of one retried run."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def get_board(study: str, namespace: str = "qkstudy"):
    """The study's board actor (created on first use, on the driver's node; detached from no
    one: it lives with the job)."""
    # Ray's decorator types the class as itself, without the actor class's .options.
    return ProgressBoard.options(  # type: ignore[attr-defined]
        name=board_name(study), namespace=namespace, get_if_exists=True,
        scheduling_strategy=on_driver_node()).remote()


def report_progress(board_name_: str | None, run_id: str, **fields: Any) -> None:
    """Fire-and-forget update from a worker; a missing board (e.g. `qkstudy train`) is fine."""
    if not board_name_:
        return
    try:
        ray.get_actor(board_name_, namespace="qkstudy").update.remote(run_id, **fields)
    except ValueError:
        pass
