"""Live progress of a study: a named Ray actor that rank 0 of each run writes to, and the
driver's view of it.

The ``ProgressBoard`` actor holds only the latest numbers of each run (tokens, planned tokens,
last train loss, state); MLflow stays the record. The driver polls it (``StudyProgress``) and
draws one line per pack (the runs one Ray task trains back to back, ``run.driver.packing``:
their tokens, the run training now and its last loss, the pack's state) and one for the study,
adding what each pack's task returns when it ends. The study's ETA is measured, not planned:
remaining tokens over the tokens per second the board's snapshots showed in the last minutes
(``TokenRate``). A terminal gets live bars; a log (CI, ``| tee``) gets one line per finished
run and a study-level line every 30 s instead of bars that would render only at the end.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Container, Sequence
from types import TracebackType
from typing import Any

import ray
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

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
_OPEN = (None, "queued", "running")  # a run's states before it ends (None: not on the board yet)
RATE_WINDOW_S = 300.0


class TokenRate:
    """Measured throughput of a study: tokens per second over the last ``window_s`` seconds of
    (time, tokens done) measurements, and the ETA it gives.

    rate = (done_last - done_anchor) / (t_last - t_anchor), the anchor being the newest
    measurement at least ``window_s`` old (the first one until the study is that old). Idle
    time in the window (a pack's worker group starting) counts: it recurs until the study
    ends. ETA = remaining tokens / rate; none before two measurements or while the window shows
    no progress (rate <= 0)."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque()

    def add(self, t: float, done: int) -> None:
        """One measurement: ``done`` tokens at time ``t`` (seconds, any monotonic origin). A
        measurement at the last one's time replaces its count."""
        if self._points and t <= self._points[-1][0]:
            self._points[-1] = (self._points[-1][0], done)
            return
        self._points.append((t, done))
        while len(self._points) > 2 and self._points[1][0] <= t - self.window_s:
            self._points.popleft()

    def rate(self) -> float | None:
        """Tokens per second over the window; None before two measurements."""
        if len(self._points) < 2:
            return None
        (t0, d0), (t1, d1) = self._points[0], self._points[-1]
        return (d1 - d0) / (t1 - t0)

    def eta_s(self, remaining: int) -> float | None:
        """Seconds until ``remaining`` more tokens at the measured rate; None when no rate is known."""
        rate = self.rate()
        if rate is None or rate <= 0:
            return None
        return max(remaining, 0) / rate


def fmt_eta(seconds: float | None) -> str:
    """``ETA 3m12s`` (``ETA 45s``, ``ETA 2h05m``), or ``ETA —`` when unknown."""
    if seconds is None:
        return "ETA —"
    s = round(seconds)
    if s < 60:
        return f"ETA {s}s"
    if s < 3600:
        return f"ETA {s // 60}m{s % 60:02d}s"
    return f"ETA {s // 3600}h{s % 3600 // 60:02d}m"


_NUMBERED = re.compile(r"([a-z]*)(\d+)")


def _spans(numbers: list[int]) -> str:
    """``0-2,5`` for [0, 1, 2, 5]: runs of consecutive numbers as ranges."""
    out: list[str] = []
    for n in sorted(set(numbers)):
        if out and n == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def pack_label(names: Sequence[str], most: int = 40) -> str:
    """A pack's runs named compactly: the ``-``-separated parts all names share (before and
    after) once, the differing parts between, numbered ones as ranges, e.g.
    ``standard-cpu-xs s0-2 x1 (3 runs)``. One run: its name."""
    if len(names) == 1:
        return names[0]
    parts = [n.split("-") for n in names]
    shortest = min(len(p) for p in parts)
    pre = 0
    while pre < shortest and len({p[pre] for p in parts}) == 1:
        pre += 1
    post = 0
    while post < shortest - pre and len({p[-1 - post] for p in parts}) == 1:
        post += 1
    middles = ["-".join(p[pre : len(p) - post]) for p in parts]
    numbered = [m for m in map(_NUMBERED.fullmatch, middles) if m]
    if len(numbered) == len(middles) and len({m.group(1) for m in numbered}) == 1:
        middle = numbered[0].group(1) + _spans([int(m.group(2)) for m in numbered])
    else:
        middle = ",".join(dict.fromkeys(middles))
        if len(middle) > most:
            middle = f"{middles[0]},…"
    shown = ["-".join(parts[0][:pre]), middle, "-".join(parts[0][len(parts[0]) - post :])]
    return " ".join(s for s in shown if s) + f" ({len(names)} runs)"


class StudyProgress:
    """Bars (terminal) or lines (log) for the runs of ``packs`` (each pack's runs in the order
    it trains them, packs in launch order); use as a context manager.

    ``update(snapshot, ended)`` takes the board's snapshot ({run_id: {tokens, planned, loss,
    state}}) and skips the runs in ``ended`` (their final state came from ``run_ended``).
    Each run's "finished" line is printed once, whichever of the two reports it first (a
    pack's runs end one by one, long before the pack's task returns). ``clock``: seconds on
    any monotonic origin (the ETA's measurements and the log's cadence; tests pass their own)."""

    def __init__(self, study_name: str, packs: Sequence[Sequence[RunSpec]], console: Console, clock: Callable[[], float] = time.monotonic):
        self.study_name, self.console, self.clock = study_name, console, clock
        self.live = console.is_terminal
        self.packs = [tuple(p) for p in packs if p]
        self.runs = {r.run_id: r for p in self.packs for r in p}
        self.total_tokens = sum(r.tokens for r in self.runs.values())
        self.names = {rid: r.run_name for rid, r in self.runs.items()}
        self.rate = TokenRate()
        self._done_tokens: dict[str, int] = {}
        self._state: dict[str, str] = {}  # board state, then the final status once ended
        self._loss: dict[str, float] = {}
        self._ended: set[str] = set()
        self._announced: set[str] = set()
        self._stopped: set[TaskID] = set()
        self._last_line = clock()
        self.bar = Progress(
            TextColumn("{task.description}", justify="left"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not self.live,
            get_time=clock,
        )
        self._overall = self.bar.add_task(f"[bold]study {escape(study_name)}", total=self.total_tokens, info=fmt_eta(None))
        self._tasks = [
            self.bar.add_task(
                f"  {escape(pack_label([r.run_name for r in p]))}", total=sum(r.tokens for r in p), info="queued", start=False
            )
            for p in self.packs
        ]  # a pack's clock starts with its first run's first report and stops when its runs ended

    def __enter__(self) -> StudyProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.bar.__exit__(exc_type, exc, tb)

    @property
    def done_tokens(self) -> int:
        """Tokens trained so far over the study's runs (finished runs count in full)."""
        return sum(self._done_tokens.values())

    @property
    def remaining_tokens(self) -> int:
        """Tokens still to train: the planned ones of every run not ended otherwise than finished
        (a failed run's rest is not trained), less those done."""
        live = [rid for rid in self.runs if self._state.get(rid) in (*_OPEN, STATUS_FINISHED)]
        return sum(max(self.runs[rid].tokens - self._done_tokens.get(rid, 0), 0) for rid in live)

    def eta(self) -> str:
        """The study's ETA as drawn (``fmt_eta``) from the measured rate."""
        return fmt_eta(self.rate.eta_s(self.remaining_tokens))

    def pack_info(self, pack: tuple[RunSpec, ...]) -> str:
        """A pack's state: ``queued``, ``running k/M`` (k finished of M) with the run training
        now and its last loss, ``finished M/M``, or ``failed f/M`` once its runs ended."""
        states = [self._state.get(r.run_id) for r in pack]
        n, done = len(pack), states.count(STATUS_FINISHED)
        bad = sum(1 for s in states if s not in _OPEN and s != STATUS_FINISHED)
        if all(s is None for s in states):
            return "queued"
        if done + bad == n:
            return f"[green]finished {done}/{n}[/]" if not bad else f"[red]failed {bad}/{n}[/], finished {done}/{n}"
        now = next((r for r, s in zip(pack, states) if s == "running"), None)
        info = f"running {done}/{n}" + (f", [red]failed {bad}[/]" if bad else "")
        if now is not None:
            loss = f" loss {self._loss[now.run_id]:.3f}" if now.run_id in self._loss else ""
            info += f" · {escape(now.run_name)}{loss}"
        return info

    def _draw(self) -> None:
        for task, pack in zip(self._tasks, self.packs):
            if any(r.run_id in self._state for r in pack):
                self.bar.start_task(task)  # a no-op once started
            if task not in self._stopped and all(r.run_id in self._ended for r in pack):
                self._stopped.add(task)
                self.bar.stop_task(task)
            self.bar.update(task, completed=sum(self._done_tokens.get(r.run_id, 0) for r in pack), info=self.pack_info(pack))
        self.bar.update(self._overall, completed=self.done_tokens, info=self.eta())

    def _announce(self, run_id: str, tokens: int) -> None:
        if not self.live and run_id not in self._announced:
            self._announced.add(run_id)
            self.console.print(f"finished {self.names[run_id]} ({tokens:,} tokens) [{len(self._announced)}/{len(self.names)}]")

    def update(self, snapshot: dict[str, dict[str, Any]], ended: Container[str]) -> None:
        """Take the board's latest numbers of every run not in ``ended``, measure the study's
        throughput, and draw."""
        for run_id, s in snapshot.items():
            if run_id in self.runs and run_id not in ended and run_id not in self._ended:
                self._done_tokens[run_id] = s.get("tokens", 0)
                if "state" in s:
                    self._state[run_id] = s["state"]
                if "loss" in s:
                    self._loss[run_id] = s["loss"]
                if s.get("state") == STATUS_FINISHED:
                    self._announce(run_id, s.get("tokens", 0))
        now = self.clock()
        self.rate.add(now, self.done_tokens)
        self._draw()
        if not self.live and now - self._last_line > LOG_EVERY_S:
            self._last_line = now
            running = ", ".join(
                f"{self.names.get(r, r)} {s['tokens'] * 100 // max(s['planned'], 1)}%"
                for r, s in snapshot.items()
                if s.get("state") == "running" and "planned" in s and r in self.runs and r not in self._ended
            )
            self.console.print(
                f"study {self.study_name}: {self.done_tokens:,}/{self.total_tokens:,} tokens, {self.eta()}"
                + (f"; running: {running}" if running else "")
            )

    def run_ended(self, run: RunSpec, status: str, reason: str) -> None:
        """A run's final state, as its pack's task returned it."""
        self._ended.add(run.run_id)
        self._state[run.run_id] = status
        if status != STATUS_FINISHED:
            self.console.print(f"[red]{escape(run.run_name)} {status}[/]: {escape(reason[:300])}")
        else:
            self._done_tokens[run.run_id] = run.tokens
            self._announce(run.run_id, run.tokens)
        self._draw()
