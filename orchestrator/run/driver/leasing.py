"""The study's and its runs' leases, as the driver and the pack tasks take them.

One driver per study: the driver holds the study lease (``track.lease.STUDY_LEASE`` in the
study's storage) from before Ray starts until the study returns (``runner.run_runs`` takes it
for its call; the tuned protocol, ``run.driver.study``, takes it once across its tuning and main
stages and runs both under it), so a second ``qkstudy run`` (or a ``submit`` while a job runs
the study) refuses with exit code 2, naming the holder, or waits with ``--wait``. A holder
that died on this machine is taken over at once; one elsewhere when its heartbeat is older
than the lease's ttl (60 s). The holder's thread heartbeats for as long as it holds the lease,
so a lease held across stages (and the LR choice between them) stays live.

One trainer per run: each pack task (``packing.fit_pack``) takes every run's lease before its
worker group starts and skips a run whose lease a live holder has (reported ``held``: another
driver's pack trains it). The study lease alone cannot fence a driver that lost it while its
packs still train (it was stopped for longer than the ttl, or storage was unreachable); the
run leases can, as the packs heartbeat on their own. A run that the other pack finished meanwhile
is skipped by the worker (its MLflow status), so lease + status train each run exactly once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

from orchestrator.track.lease import STUDY_LEASE, Lease, LeaseHeld, run_lease_name

STATUS_HELD = "held"  # a run another driver's pack holds the lease of (a StudyResult status, never a tag)


class StudyBusy(LeaseHeld):
    """Another live driver holds the study's lease (the CLI exits with code 2)."""

    def __init__(self, study: str, held: LeaseHeld):
        super().__init__(held.name, held.location, held.holder, held.age_s)
        self.args = (
            f"study {study!r} is being run by {held.holder.describe()}: watch it with "
            f"`qkstudy status {study}`, or wait for it to end with `qkstudy run --wait`",
        )


@contextmanager
def study_lease(study: str, storage_path: str, console: Console, *, wait: bool = False, timeout_s: float | None = None) -> Iterator[Lease]:
    """Hold the study lease for the block (released on exit, whatever happens).

    ``wait``: poll until the holder ends (or dies), at most ``timeout_s`` (None: no bound).
    Says on ``console`` when it waits and when it took the lease over from a dead holder; a
    lease lost while held (a takeover after this process stalled) is said too: the run leases
    keep the two drivers from training one run twice.

    Raises:
        StudyBusy: a live driver holds it (at once without ``wait``).
    """
    lease = Lease(
        storage_path, STUDY_LEASE, on_lost=lambda why: console.print(f"[yellow]warning[/]: {why}; runs in flight keep their run leases")
    )
    try:
        lease.acquire(wait=False)
    except LeaseHeld as e:
        if not wait:
            raise StudyBusy(study, e) from None
        console.print(f"waiting for the driver that runs {study}: {e.holder.describe()}")
        try:
            lease.acquire(wait=True, timeout_s=timeout_s)
        except LeaseHeld as e2:
            raise StudyBusy(study, e2) from None
    if lease.takeover_reason:
        console.print(f"study lease: {lease.takeover_reason}")
    try:
        yield lease
    finally:
        lease.release()


def _warn(why: str) -> None:
    print(f"[qkstudy] warning: {why}", file=sys.stderr, flush=True)


@contextmanager
def run_leases(items: list[dict[str, Any]], storage_path: str) -> Iterator[tuple[list[dict[str, Any]], dict[str, dict[str, str]]]]:
    """Take the lease of each run of a pack (``packing.pack_items``) for the block.

    Yields (the items whose lease this process now holds, {run_id: {status: held, reason}} for
    the others). Every lease taken is released on exit."""
    mine: list[dict[str, Any]] = []
    held: dict[str, dict[str, str]] = {}
    leases: list[Lease] = []
    try:
        for item in items:
            run_id = item["run"]["run_id"]
            lease = Lease(storage_path, run_lease_name(run_id), on_lost=_warn)
            try:
                lease.acquire()
            except LeaseHeld as e:
                held[run_id] = {
                    "status": STATUS_HELD,
                    "reason": f"its run lease is held by {e.holder.describe()}: another driver trains it",
                }
                continue
            if lease.takeover_reason:
                _warn(f"run {run_id}: {lease.takeover_reason}")
            leases.append(lease)
            mine.append(item)
        yield mine, held
    finally:
        for lease in leases:
            lease.release()
