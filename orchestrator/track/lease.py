"""Leases: one driver per study (and one trainer per run) at a time, found in the study's storage.

A lease is ``<storage>/leases/<name>/<generation>.json`` (storage: the study's ``storage_path``,
a local path or a pyarrow URI such as ``s3://bucket/study``); the highest generation is the
lease, its JSON the holder ({host, pid, job_id, started, heartbeat, token, ...}). Every change
of holder is the exclusive creation of the next number, so of two contenders that see a dead
holder only one takes over, and a holder presumed dead that wakes up sees a higher generation
and knows it lost (the generation is a fencing token a caller may record).

Atomic creation, by storage:

- Local path (or ``file://``): the holder JSON is written to a private temp file and hard-linked
  to the generation's name: ``link(2)`` fails if the name exists (also on NFS), so exactly one
  contender wins, with a complete file. Heartbeats replace it with ``rename(2)``.
- Other pyarrow filesystems (S3, GCS, ...): pyarrow exposes no conditional put, so creation is
  check-absent, write, wait ``settle_s``, read back and compare by content (each holder's
  token is unique). With strong read-after-write consistency and last-writer-wins puts (S3
  since 2020, GCS) this is exclusive when each contender's check-to-write gap is shorter than
  ``settle_s`` (milliseconds against 2 s); a violation is caught by the next heartbeat, which
  re-reads the file and gives the lease up if its token is not there.

Liveness: the holder's thread renews ``heartbeat`` (wall-clock seconds) every ``heartbeat_s``
(ttl / 4). A lease whose heartbeat is older than ``ttl_s`` is taken over, and the takeover is
reported (``Lease.took_over``). On the holder's own machine (same host, boot and pid namespace)
a holder whose process is gone is taken over at once. Heartbeat ages compare clocks of two
machines: keep them NTP-synced well within ``ttl_s``. A holder that cannot renew for
``ttl_s`` (storage down) or finds a higher generation sets ``Lease.lost`` and calls ``on_lost``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from data_pipeline import storage

LEASE_DIR = "leases"
DEFAULT_TTL_S = 60.0
DEFAULT_SETTLE_S = 2.0
JOB_ID_ENV = "QKSTUDY_RAY_JOB_ID"  # set by `qkstudy submit` in the job's runtime env
STUDY_LEASE = "study"
_GEN_FILE, _GEN_RE = "{:012d}.json", re.compile(r"^(\d{12})\.json$")


@dataclass(frozen=True)
class Holder:
    """Who holds a lease. Times are Unix seconds; ``node`` identifies this machine's kernel
    and pid namespace (``host/boot_id/pidns``, Linux) so that a local ``pid`` can be checked."""

    host: str
    pid: int
    job_id: str | None
    started: float
    heartbeat: float
    token: str
    node: str = ""
    proc_start: str = ""
    generation: int = 0
    released: bool = False

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat (negative if the holder's clock runs ahead)."""
        return (time.time() if now is None else now) - self.heartbeat

    def describe(self, now: float | None = None) -> str:
        """``pid 123 on host h (Ray job j), heartbeat 4.1 s ago`` for messages and status."""
        job = f" (Ray job {self.job_id})" if self.job_id else ""
        return f"pid {self.pid} on host {self.host}{job}, heartbeat {self.age_s(now):.1f} s ago"


class LeaseHeld(RuntimeError):
    """The lease is held by a live holder. ``holder``: who; ``age_s``: heartbeat age [s]."""

    def __init__(self, name: str, location: str, holder: Holder, age_s: float):
        from orchestrator.track.tracking import redact_uri  # a URI may carry credentials

        self.name, self.location, self.holder, self.age_s = name, location, holder, age_s
        super().__init__(f"lease {name!r} ({redact_uri(location)}) is held by {holder.describe()}")


class LeaseLost(RuntimeError):
    """This process held the lease and no longer does (taken over, or not renewable)."""


_HOLDER_FIELDS = frozenset(Holder.__dataclass_fields__)


def _node_id() -> str:
    """``host/boot_id/pid-namespace``: equal only for processes that can see each other's pids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{socket.gethostname()}/{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""  # not Linux: no local liveness check, heartbeat ages only


def _proc_start(pid: int) -> str:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), '' if none;
    with the pid it names one process even after the pid is reused. 'Z' for a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    return "Z" if fields[0] in ("Z", "X") else fields[19]


def dead_here(h: Holder) -> bool:
    """True when ``h`` ran on this machine (same node id) and its process is gone."""
    if not h.node or h.node != _node_id():
        return False
    now = _proc_start(h.pid)
    return now in ("", "Z") or (bool(h.proc_start) and now != h.proc_start)


class _LocalDir:
    """Generation files in a local directory: exclusive create by link(2), replace by rename(2)."""

    def __init__(self, path: str):
        self.path = path

    def names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            return []

    def read(self, name: str) -> bytes | None:
        try:
            return Path(self.path, name).read_bytes()
        except FileNotFoundError:
            return None

    def _tmp(self, data: bytes) -> str:
        os.makedirs(self.path, exist_ok=True)
        tmp = os.path.join(self.path, f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def create(self, name: str, data: bytes) -> bool:
        tmp = self._tmp(data)
        try:
            os.link(tmp, os.path.join(self.path, name))
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def replace(self, name: str, data: bytes) -> None:
        os.replace(self._tmp(data), os.path.join(self.path, name))

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.path, name))


class _ArrowDir:
    """Generation files on a pyarrow filesystem: create = check, put, settle, read back."""

    def __init__(self, fs: pafs.FileSystem, path: str, settle_s: float):
        self.fs, self.path, self.settle_s = fs, path.rstrip("/"), settle_s

    def names(self) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return [i.base_name for i in infos if i.type == pafs.FileType.File]

    def read(self, name: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(f"{self.path}/{name}") as f:
                return f.read()
        except (FileNotFoundError, OSError):
            return None

    def create(self, name: str, data: bytes) -> bool:
        if self.fs.get_file_info(f"{self.path}/{name}").type != pafs.FileType.NotFound:
            return False
        self.replace(name, data)
        time.sleep(self.settle_s)  # a concurrent put lands within this window: the last one wins
        return self.read(name) == data

    def replace(self, name: str, data: bytes) -> None:
        self.fs.create_dir(self.path, recursive=True)
        with self.fs.open_output_stream(f"{self.path}/{name}") as f:
            f.write(data)

    def delete(self, name: str) -> None:
        with contextlib.suppress(OSError):  # FileNotFoundError included
            self.fs.delete_file(f"{self.path}/{name}")


def _lease_dir(location: str, name: str, settle_s: float) -> _LocalDir | _ArrowDir:
    """The store of lease ``name`` under ``<location>/leases/``."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ValueError(f"lease name {name!r}: use letters, digits, '.', '_' or '-'")
    fs, path = storage.resolve(location)
    if isinstance(fs, pafs.LocalFileSystem):
        return _LocalDir(os.path.join(path, LEASE_DIR, name))
    return _ArrowDir(fs, f"{path.rstrip('/')}/{LEASE_DIR}/{name}", settle_s)


_READ_RETRIES, _READ_RETRY_S = 5, 0.1


def _current(d: _LocalDir | _ArrowDir) -> tuple[int, Holder | None]:
    """(highest generation, its holder) — (0, None) for a lease never taken. Writes are atomic
    (link, rename, one put), so a file that does not parse is foreign: a holder long dead."""
    gens = sorted(int(m[1]) for n in d.names() if (m := _GEN_RE.match(n)))
    if not gens:
        return 0, None
    gen = gens[-1]
    raw = d.read(_GEN_FILE.format(gen))
    for _ in range(_READ_RETRIES):  # listed but not read: a failed request (an object store under load), not a foreign file
        if raw is not None:
            break
        time.sleep(_READ_RETRY_S)
        raw = d.read(_GEN_FILE.format(gen))
    try:
        data = json.loads(raw or b"")
        return gen, Holder(**{k: v for k, v in data.items() if k in _HOLDER_FIELDS})
    except (ValueError, TypeError, AttributeError):
        return gen, Holder("?", 0, None, 0.0, 0.0, "?", generation=gen)


def read_lease(location: str, name: str) -> Holder | None:
    """The current holder of lease ``name`` under ``location`` (for ``qkstudy status``), or
    None when it is free (never taken, or released). A holder may be stale: see ``age_s``."""
    _, holder = _current(_lease_dir(location, name, DEFAULT_SETTLE_S))
    return None if holder is None or holder.released else holder


def run_lease_name(run_id: str) -> str:
    """The lease name of one planned run (its planner hash)."""
    return f"run-{run_id}"


class Lease:
    """Exclusive, heartbeated ownership of ``name`` under ``location`` (see the module doc).

    Use as ``with Lease(storage, STUDY_LEASE) as lease:`` (acquire without waiting, release on
    exit), ``with Lease(...).acquire(wait=True, timeout_s=...):``, or acquire() / release().

    Args:
        location: the study's storage (local path or pyarrow URI).
        name: lease name (``STUDY_LEASE``, ``run_lease_name(run_id)``).
        ttl_s: a heartbeat older than this [s] means the holder is dead.
        heartbeat_s: renewal period [s] (default ttl_s / 4).
        job_id: Ray job id of this holder (default ``$QKSTUDY_RAY_JOB_ID``).
        settle_s: read-back delay [s] for object stores (unused on local paths).
        local_liveness: take over at once a holder whose process is gone from this machine.
        on_lost: called with a reason (from the heartbeat thread) when the lease is lost.
    """

    def __init__(
        self,
        location: str,
        name: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float | None = None,
        job_id: str | None = None,
        settle_s: float = DEFAULT_SETTLE_S,
        local_liveness: bool = True,
        on_lost: Callable[[str], None] | None = None,
    ):
        if ttl_s <= 0:
            raise ValueError(f"ttl_s={ttl_s} must be > 0")
        self.location, self.name, self.ttl_s = str(location), name, float(ttl_s)
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else self.ttl_s / 4
        self.local_liveness, self.on_lost = local_liveness, on_lost
        self._dir = _lease_dir(self.location, name, settle_s)
        now = time.time()
        self._me = Holder(
            socket.gethostname(),
            os.getpid(),
            job_id or os.environ.get(JOB_ID_ENV) or None,
            now,
            now,
            uuid.uuid4().hex,
            _node_id(),
            _proc_start(os.getpid()),
        )
        self.generation = 0
        self.took_over: Holder | None = None  # the previous holder, when this acquire took over
        self.takeover_reason: str | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """True between a successful acquire and release, unless the lease was lost."""
        return self.generation > 0 and not self.lost.is_set()

    def _stale(self, h: Holder) -> str | None:
        """Why holder ``h`` no longer holds the lease, or None while it does."""
        if h.released:
            return ""
        age = h.age_s()
        if age > self.ttl_s:
            return f"its heartbeat is {age:.1f} s old (ttl {self.ttl_s:g} s)"
        if self.local_liveness and dead_here(h):
            return f"its process (pid {h.pid}) is gone from this machine"
        return None

    def acquire(self, wait: bool = False, timeout_s: float | None = None, poll_s: float | None = None) -> Lease:
        """Take the lease (possibly over from a dead holder) and start the heartbeat.

        ``wait``: poll every ``poll_s`` (default heartbeat_s, at most 5 s) until free or taken
        over, for at most ``timeout_s`` (None: no bound). Returns self.

        Raises:
            LeaseHeld: held by a live holder (at once without ``wait``; after ``timeout_s`` with it).
        """
        poll = poll_s if poll_s is not None else min(self.heartbeat_s, 5.0)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            gen, holder = _current(self._dir)
            why = "" if holder is None else self._stale(holder)
            if why is None:
                assert holder is not None
                if not wait or (deadline is not None and time.monotonic() >= deadline):
                    raise LeaseHeld(self.name, self.location, holder, holder.age_s())
                time.sleep(poll)
                continue
            if self._create(gen + 1):
                if holder is not None and why:
                    self.took_over, self.takeover_reason = holder, f"took over from {holder.describe()}: {why}"
                return self
            # another contender created gen + 1 first: look again

    def _payload(self, **changes: Any) -> bytes:
        return json.dumps(asdict(self._me) | changes).encode()

    def _create(self, gen: int) -> bool:
        now = time.time()
        self._me = Holder(**(asdict(self._me) | {"heartbeat": now, "started": now, "generation": gen}))
        if not self._dir.create(_GEN_FILE.format(gen), self._payload()):
            return False
        self.generation = gen
        self.lost.clear()
        for n in self._dir.names():  # older generations are history now
            m = _GEN_RE.match(n)
            if m and int(m[1]) < gen:
                self._dir.delete(n)
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return True

    def _still_mine(self) -> str | None:
        """Why the lease is no longer ours (a higher generation, another token), or None."""
        gen, holder = _current(self._dir)
        if gen != self.generation or holder is None or holder.token != self._me.token:
            who = holder.describe() if holder else "nobody"
            return f"lease {self.name!r} generation {self.generation} was taken over (now {gen}: {who})"
        return None

    def renew(self) -> None:
        """One heartbeat: check the lease is still ours, then write a fresh heartbeat.

        Raises:
            LeaseLost: another holder owns it now.
        """
        why = self._still_mine()
        if why:
            raise LeaseLost(why)
        self._me = Holder(**(asdict(self._me) | {"heartbeat": time.time()}))
        self._dir.replace(_GEN_FILE.format(self.generation), self._payload())

    def _beat(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.renew()
                last_ok = time.monotonic()
            except LeaseLost as e:
                self._lose(str(e))
                return
            except OSError as e:  # storage unreachable: keep trying until ttl says we cannot hold it
                if time.monotonic() - last_ok > self.ttl_s:
                    self._lose(f"lease {self.name!r} not renewable for {self.ttl_s:g} s: {e}")
                    return

    def _lose(self, reason: str) -> None:
        self.lost.set()
        if self.on_lost:
            self.on_lost(reason)

    def check(self) -> None:
        """Raise LeaseLost if the heartbeat thread found the lease lost (call between runs)."""
        if self.lost.is_set():
            raise LeaseLost(f"lease {self.name!r} was lost")

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (only if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.generation and not self.lost.is_set() and self._still_mine() is None:
            self._dir.replace(_GEN_FILE.format(self.generation), self._payload(released=True, heartbeat=time.time()))
        self.generation = 0

    def __enter__(self) -> Lease:
        return self if self.held else self.acquire()  # `with Lease(...).acquire(wait=True):` too

    def __exit__(self, *exc: object) -> None:
        self.release()
