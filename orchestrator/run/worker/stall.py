"""What a Ray Train worker process does when its loop stops making progress.

One ``WorkerGuard`` per worker process (``worker.train_loop_per_worker``) owns the process's
``watchdog.Watchdog``; the loop opens its sections (startup, step, eval, checkpoint) through
it. On a stall every rank prints the stuck section and every thread's stack to its log
(stderr: Ray's worker log, the driver's with ``qkstudy run -v``); rank 0 then writes the
metric points its recorder still holds (nothing trained is lost), ends the run in MLflow as
failed (``failure_reason``: section, seconds, bound and the stuck thread's stack, its innermost
frames kept when cut to fit; tags ``stall.section``, ``stall.elapsed_s``; every thread's stack
as the artifact ``stall/stacks.txt``) and, after one more watchdog poll (so every peer stuck
with it has logged its own stack: in a hung collective the culprit is often another rank), the
process exits with ``STALL_EXIT_CODE``. The other ranks wait ``grace_s`` first, so rank 0's
record is written before Ray ends the group: a retried group
skips the failed run (``RunLoop._ended_earlier``) and the pack, and the study, go on. The
MLflow write is bounded too (``record_timeout_s``): a stall never turns into a hang. Tests
make a worker stall through ``run.faults``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from orchestrator.run.worker.watchdog import STALL_EXIT_CODE, Watchdog, WatchdogLimits, stall_reason
from orchestrator.track.tracking import STATUS_FAILED, client_for, set_status, tag

REASON_CHARS = 4000  # of the failure_reason tag's 5000


def worker_log(message: str) -> None:
    """One line (or block) to this worker's log (stderr, flushed)."""
    print(f"[qkstudy] {message}", file=sys.stderr, flush=True)


def stuck_reason(section: str, elapsed_s: float, bound_s: float, stacks: str) -> str:
    """``watchdog.stall_reason``'s head and the stuck thread's stack (the first of
    ``watchdog.all_stacks``' text), cut to ``REASON_CHARS`` from the outer end: the innermost
    frames, where it is stuck, are the ones kept."""
    head = stall_reason(section, elapsed_s, bound_s, "")
    stuck = stacks.partition("\nThread '")[0]
    room = REASON_CHARS - len(head)
    if len(stuck) > room:
        title, _, frames = stuck.partition("\n")
        stuck = f"{title}\n  ...\n{frames[-max(0, room - len(title) - 7) :]}"
    return head + stuck


class WorkerGuard:
    """A worker process's watchdog and its stall handling (module doc).

    ``loop`` is the ``RunLoop`` being trained (set by it when it starts; read when a stall
    fires, so a run id switched by a checkpoint restore is the one recorded). ``exit`` ends the
    process (``os._exit``; a test passes its own)."""

    def __init__(
        self,
        rank: int,
        tracking_uri: str,
        limits: WatchdogLimits | None = None,
        *,
        grace_s: float = 10.0,
        record_timeout_s: float = 60.0,
        exit: Callable[[int], Any] = os._exit,
    ):
        self.rank, self.tracking_uri = rank, tracking_uri
        self.grace_s, self.record_timeout_s, self._exit = grace_s, record_timeout_s, exit
        self.watchdog = Watchdog(self.on_stall, limits)
        self.loop: Any = None

    def section(self, name: str) -> Any:
        """The watchdog's context manager for section ``name``."""
        return self.watchdog.section(name)

    def start(self) -> WorkerGuard:
        """Start watching (the watchdog's thread). Returns self."""
        self.watchdog.start()
        return self

    def on_stall(self, section: str, elapsed_s: float, stack: str) -> None:
        """Log, record (rank 0), end the process; called on the watchdog's thread."""
        loop = self.loop
        reason = stuck_reason(section, elapsed_s, self.watchdog.limits.bound(section), stack)
        name = loop.run.run_name if loop is not None else "(no run yet)"
        worker_log(f"watchdog: rank {self.rank}, run {name}: {reason.splitlines()[0]}\n{stack}")
        if self.rank == 0 and loop is not None:
            t = threading.Thread(target=self._record, args=(loop, section, elapsed_s, reason, stack), daemon=True)
            t.start()
            t.join(self.record_timeout_s)
            threading.Event().wait(self.watchdog.poll_s + 1.0)  # the peers' watchdogs fire within a poll
        else:
            threading.Event().wait(self.grace_s)  # let rank 0 write its record before Ray ends the group
        self._exit(STALL_EXIT_CODE)

    def _record(self, loop: Any, section: str, elapsed_s: float, reason: str, stack: str) -> None:
        try:
            rec = getattr(loop, "rec", None)
            if rec is not None and rec.active:
                rec.metrics.flush()  # the loop is stuck, not writing: its buffer is ours now
            client = client_for(self.tracking_uri)
            run_id = loop.mlflow_run_id
            client.set_tag(run_id, tag("stall.section"), section)
            client.set_tag(run_id, tag("stall.elapsed_s"), f"{elapsed_s:.1f}")
            client.log_text(run_id, stack, "stall/stacks.txt")
            set_status(client, run_id, STATUS_FAILED, reason=reason)
        except Exception as e:  # noqa: BLE001 - the process ends anyway; the pack marks the run failed
            worker_log(f"watchdog: could not record the stall in MLflow: {type(e).__name__}: {e}")
