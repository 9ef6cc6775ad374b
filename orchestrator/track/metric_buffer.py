"""A run's metric points, kept until MLflow has them: an outage of a few minutes costs nothing.

Why: the loop queues points and flushes at every evaluation. A flush that removed its points
before writing them lost them when the write failed, and the error then crashed the worker.
Here a point leaves the buffer only after the ``log_batch`` that carried it returned. A write
that fails for a reason a server outage gives (no connection, a timeout, a 5xx or 429) marks
an outage: training goes on, the buffer retries at the next flush or point once its backoff
(1 s doubling to 30 s) is due, and writes everything in order when the server answers again.
Resending a batch whose answer was lost adds nothing: SQL stores drop a point identical in
key, step, timestamp and value (``SqlAlchemyStore._log_metrics``). Memory is bounded
(``max_points``): beyond it the oldest points go, and the run says how many, in its log and
in the ``metrics_dropped`` tag. An outage longer than ``max_outage_s`` (``QKSTUDY_MLFLOW_OUTAGE_S``,
default 300 s) raises ``TrackingOutage``, naming the server, the points still unwritten and
that a resubmit resumes the run from its last checkpoint (MLflow cannot be told then).
A rejected write (another 4xx: the point is invalid) raises at once: retrying cannot help.

Step = tokens seen. ``resume_after``: the last step MLflow already holds: after a resume
the loop recomputes steps past its checkpoint, and those points are dropped here, so no step
is logged twice. Non-finite values are dropped (MLflow rejects NaN in some stores); the
run's failure reason carries them instead.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.track.http_env import OUTAGE_ENV
from orchestrator.track.tracking import redact_uri, tag

__all__ = ["MetricBuffer", "OutagePolicy", "TrackingOutage", "is_outage"]

T = TypeVar("T")
LOG_BATCH_MAX = 1000  # MLflow's per-call metric limit


class TrackingOutage(RuntimeError):
    """MLflow took no write for longer than the run's bound; the message says what is kept."""


@dataclass(frozen=True)
class OutagePolicy:
    """How long and how often a run retries a tracking server that takes no writes (seconds),
    and how many unwritten points it keeps (~200 bytes each: 500,000 is ~100 MB)."""

    max_outage_s: float = 300.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_points: int = 500_000

    @classmethod
    def from_env(cls) -> OutagePolicy:
        """The default, with ``max_outage_s`` from ``QKSTUDY_MLFLOW_OUTAGE_S`` when set."""
        raw = os.environ.get(OUTAGE_ENV)
        return cls(max_outage_s=float(raw)) if raw else cls()


def is_outage(err: BaseException) -> bool:
    """True when ``err`` is what an unreachable or overloaded server gives (connection,
    timeout, HTTP 5xx or 429), False for a write the server refused (another 4xx)."""
    from mlflow.exceptions import MlflowException

    if isinstance(err, MlflowException):
        code = err.get_http_status_code()
        return code >= 500 or code == 429
    return isinstance(err, (OSError, TimeoutError)) or type(err).__module__.startswith(("requests", "urllib3"))


def _log(message: str) -> None:
    print(f"[qkstudy] {message}", file=sys.stderr, flush=True)


class MetricBuffer:
    """Batches one run's metric points and writes them with ``log_batch``, keeping every
    point until it is written (module docstring). ``log`` gets the outage and drop notes."""

    def __init__(
        self,
        client: Any,
        mlflow_run_id: str,
        resume_after: int = -1,
        policy: OutagePolicy | None = None,
        log: Callable[[str], None] = _log,
        clock: Callable[[], float] = time.monotonic,
        carried: list[list] | None = None,
    ):
        from mlflow.entities import Metric

        self.client, self.mlflow_run_id, self.resume_after = client, mlflow_run_id, resume_after
        self.policy, self.log, self.clock = policy or OutagePolicy.from_env(), log, clock
        # points an earlier attempt could not write (``unwritten``, kept in its checkpoint)
        self._pending: deque[Any] = deque(Metric(k, v, ts, st) for k, v, ts, st in carried or [] if st > resume_after)
        self.dropped = 0  # oldest points let go beyond max_points (said in the log and a tag)
        self._down_since: float | None = None
        self._next_try = 0.0
        self._tries = 0
        self._error = ""

    @property
    def pending(self) -> int:
        """Points queued and not yet written."""
        return len(self._pending)

    def unwritten(self) -> list[list]:
        """The queued points as [key, value, timestamp ms, step] (JSON): a checkpoint keeps
        them, so points an outage held back are written by the attempt that resumes from it
        (``carried``) when this one ends before MLflow answers."""
        return [[m.key, m.value, m.timestamp, m.step] for m in self._pending]

    def add(self, metrics: dict[str, float], step: int, *, even_if_logged: bool = False) -> None:
        """Queue ``metrics`` at ``step`` (tokens seen); dropped if MLflow already has that step,
        unless ``even_if_logged`` (keys the caller knows MLflow lacks at that step). During an
        outage, a retry that is due runs here (it may raise ``TrackingOutage``)."""
        from mlflow.entities import Metric

        if step <= self.resume_after and not even_if_logged:
            return
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            v = float(v)
            if math.isfinite(v):
                self._pending.append(Metric(k, v, ts, int(step)))
        over = len(self._pending) - self.policy.max_points
        if over > 0:
            for _ in range(over):
                self._pending.popleft()
            self.dropped += over
            self.log(
                f"MLflow unreachable: dropped the {over} oldest unwritten point(s) beyond the buffer's "
                f"{self.policy.max_points} ({self.dropped} dropped in all)"
            )
        if self._down_since is not None and self.clock() >= self._next_try:
            self.flush()

    def flush(self, wait: bool = False) -> bool:
        """Write every queued point (``log_batch``, 1,000 per call), each batch removed once
        written. Returns True when none is left. On an outage: False, or with ``wait``, retry
        with backoff until written. Raises ``TrackingOutage`` once the outage has lasted past
        ``max_outage_s``; a refused write's MlflowException at once."""
        while True:
            if self._write_all():
                return True
            if self.clock() - (self._down_since or 0.0) > self.policy.max_outage_s:
                raise TrackingOutage(self._outage_reason())
            if not wait:
                return False
            time.sleep(max(0.0, self._next_try - self.clock()))

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` (another write of this run: a tag, its status) retried through an outage
        like the points (after them: they are written first), within the same bound."""
        self.flush(wait=True)
        while True:
            try:
                return fn()
            except Exception as e:
                if not is_outage(e):
                    raise
                self._failed(e)
            if self.clock() - (self._down_since or 0.0) > self.policy.max_outage_s:
                raise TrackingOutage(self._outage_reason())
            time.sleep(max(0.0, self._next_try - self.clock()))

    def _write_all(self) -> bool:
        from mlflow.entities import RunTag

        while self._pending:
            batch = [self._pending[i] for i in range(min(LOG_BATCH_MAX, len(self._pending)))]
            try:
                self.client.log_batch(self.mlflow_run_id, metrics=batch)
            except Exception as e:
                if not is_outage(e):
                    raise
                self._failed(e)
                return False
            for _ in batch:
                self._pending.popleft()
        if self._down_since is not None:
            down = self.clock() - self._down_since
            self.log(
                f"MLflow answers again after {down:.0f} s ({self._tries} failed write(s)): every kept point written"
                + (f"; {self.dropped} oldest point(s) were dropped" if self.dropped else "")
            )
            self._down_since, self._tries = None, 0
            if self.dropped:
                self.client.log_batch(self.mlflow_run_id, tags=[RunTag(tag("metrics_dropped"), str(self.dropped))])
        return True

    def _failed(self, err: BaseException) -> None:
        now = self.clock()
        if self._down_since is None:
            self._down_since = now
            self.log(
                f"MLflow write failed ({type(err).__name__}): keeping {len(self._pending)} point(s) and "
                f"retrying for up to {self.policy.max_outage_s:.0f} s"
            )
        self._tries += 1
        self._error = redact_uri(f"{type(err).__name__}: {err}")[:500]
        backoff = min(self.policy.max_backoff_s, self.policy.first_backoff_s * 2 ** (self._tries - 1))
        self._next_try = now + backoff

    def _outage_reason(self) -> str:
        uri = redact_uri(str(getattr(self.client, "tracking_uri", "") or getattr(self.client, "_tracking_uri", "")))
        return (
            f"MLflow{' at ' + uri if uri else ''} took no write for {self.clock() - (self._down_since or 0.0):.0f} s "
            f"(bound {self.policy.max_outage_s:.0f} s, {OUTAGE_ENV}; {self._tries} tries; last error: {self._error}); "
            f"{len(self._pending)} point(s) unwritten"
            + (f", {self.dropped} oldest dropped beyond the buffer's {self.policy.max_points}" if self.dropped else "")
            + "; the run's checkpoints are kept (with its unwritten points): "
            "resubmit the study once MLflow answers and the run resumes from its last checkpoint"
        )
