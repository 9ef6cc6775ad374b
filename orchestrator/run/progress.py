"""Live progress of a study: a named Ray actor that rank 0 of each run writes to, and the
driver's view of it.

The ``ProgressBoard`` actor holds only the latest numbers of each run (tokens, planned tokens,
last train loss, state); MLflow stays the record. The driver polls it (``StudyProgress``) and
draws one bar per run and one for the study, adding what each pack's task returns when it ends.
A terminal gets live bars; a log (CI, ``| tee``) gets one line per finished run and a
study-level line every 30 s instead of bars that would render only at the end.
"""

from __future__ import annotations

import time
from collections.abc import Container
from types import TracebackType
from typing import Any

import ray
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.plan.contract import RunSpec
from orchestrator.track.tracking import STATUS_FINISHED


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
        name=board_name(study), namespace=namespace, get_if_exists=True, scheduling_strategy=on_driver_node()
    ).remote()


def report_progress(board_name_: str | None, run_id: str, **fields: Any) -> None:
    """Fire-and-forget update from a worker; a missing board (e.g. `qkstudy train`) is fine."""
    if not board_name_:
        return
    try:
        ray.get_actor(board_name_, namespace="qkstudy").update.remote(run_id, **fields)
    except ValueError:
        pass


LOG_EVERY_S = 30.0


class StudyProgress:
    """Bars (terminal) or lines (log) for the runs of ``order``; use as a context manager.

    ``update(snapshot, ended)`` takes the board's snapshot ({run_id: {tokens, planned, loss,
    state}}) and skips the runs in ``ended`` (their final state came from ``run_ended``).
    Each run's "finished" line is printed once, whichever of the two reports it first (a
    pack's runs end one by one, long before the pack's task returns)."""

    def __init__(self, study_name: str, order: list[RunSpec], console: Console):
        self.study_name, self.console = study_name, console
        self.live = console.is_terminal
        self.total_tokens = sum(r.tokens for r in order)
        self.names = {r.run_id: r.run_name for r in order}
        self._done_tokens: dict[str, int] = {}
        self._announced: set[str] = set()
        self._last_line = time.time()
        self.bar = Progress(
            TextColumn("{task.description}", justify="left"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not self.live,
        )
        self._overall = self.bar.add_task(f"[bold]study {study_name}", total=self.total_tokens, info="")
        self._tasks = {r.run_id: self.bar.add_task(f"  {r.run_name}", total=r.tokens, info="queued") for r in order}

    def __enter__(self) -> StudyProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.bar.__exit__(exc_type, exc, tb)

    @property
    def done_tokens(self) -> int:
        """Tokens trained so far over the study's runs (finished runs count in full)."""
        return sum(self._done_tokens.values())

    def _announce(self, run_id: str, tokens: int) -> None:
        if not self.live and run_id not in self._announced:
            self._announced.add(run_id)
            self.console.print(f"finished {self.names[run_id]} ({tokens:,} tokens) [{len(self._announced)}/{len(self.names)}]")

    def update(self, snapshot: dict[str, dict[str, Any]], ended: Container[str]) -> None:
        """Draw the board's latest numbers of every run not in ``ended``."""
        for run_id, s in snapshot.items():
            if run_id in self._tasks and run_id not in ended:
                loss = f" loss {s['loss']:.3f}" if "loss" in s else ""
                self.bar.update(self._tasks[run_id], completed=s.get("tokens", 0), info=f"{s.get('state', '')}{loss}")
                self._done_tokens[run_id] = s.get("tokens", 0)
                if s.get("state") == "finished":
                    self._announce(run_id, s.get("tokens", 0))
        self.bar.update(self._overall, completed=self.done_tokens)
        if not self.live and time.time() - self._last_line > LOG_EVERY_S:
            self._last_line = time.time()
            running = ", ".join(
                f"{self.names.get(r, r)} {s['tokens'] * 100 // max(s['planned'], 1)}%"
                for r, s in snapshot.items()
                if s.get("state") == "running" and "planned" in s
            )
            self.console.print(
                f"study {self.study_name}: {self.done_tokens:,}/{self.total_tokens:,} tokens" + (f"; running: {running}" if running else "")
            )

    def run_ended(self, run: RunSpec, status: str, reason: str) -> None:
        """A run's final state, as its pack's task returned it."""
        if status != STATUS_FINISHED:
            self.bar.update(self._tasks[run.run_id], info=f"[red]{status}[/]")
            self.console.print(f"[red]{run.run_name} {status}[/]: {reason[:300]}")
        else:
            self._done_tokens[run.run_id] = run.tokens
            self.bar.update(self._tasks[run.run_id], completed=run.tokens, info="[green]finished[/]")
            self._announce(run.run_id, run.tokens)
        self.bar.update(self._overall, completed=self.done_tokens)
