"""Leases with real processes: a race has one winner, a `kill -9`-ed holder is taken over after
its ttl (and not before), or at once when it died on this machine, heartbeats keep a long-lived
holder, a stalled holder finds out it lost; the same on a real S3 API (moto_server) when present."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.track.lease import Lease, LeaseHeld, read_lease
from tests.helpers import REPO, free_port

# A child process: wait for the go file, try the lease, print one JSON line per event, hold it
# for `hold_s` (heartbeating), then release. Killed children print nothing more.
CHILD = textwrap.dedent("""
    import json, os, sys, time
    from orchestrator.track.lease import Lease, LeaseHeld
    a = json.loads(sys.argv[1])
    def say(**kw):
        print(json.dumps({"pid": os.getpid(), **kw}), flush=True)
    lease = Lease(a["location"], a["name"], ttl_s=a["ttl_s"], heartbeat_s=a["heartbeat_s"], settle_s=a.get("settle_s", 2.0),
                  on_lost=lambda why: say(event="lost", why=why))
    say(event="ready")
    while a.get("go") and not os.path.exists(a["go"]):
        time.sleep(0.01)
    try:
        lease.acquire()
    except LeaseHeld as e:
        say(event="held", holder=e.holder.pid, age_s=e.age_s)
        sys.exit(0)
    say(event="won", generation=lease.generation, t=time.time())
    end = time.time() + a["hold_s"]
    while time.time() < end and not lease.lost.is_set():
        time.sleep(0.05)
    lease.release()
    say(event="released")
""")


def _spawn(**args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _next_event(proc: subprocess.Popen, timeout_s: float = 120.0) -> dict:
    """The child's next JSON line (children start slowly on a loaded machine)."""
    assert proc.stdout is not None
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line:
            return json.loads(line)
        if proc.poll() is not None:
            raise AssertionError(f"child {proc.pid} exited with {proc.returncode} before its next event")
    raise AssertionError(f"child {proc.pid}: no event in {timeout_s} s")


def _race(location: str, name: str, n: int, tmp_path: Path, **kw) -> list[dict]:
    """Start ``n`` children, release them at once, return each one's outcome event."""
    go = tmp_path / f"go-{name}"
    procs = [_spawn(location=location, name=name, go=str(go), **kw) for _ in range(n)]
    try:
        for p in procs:
            assert _next_event(p)["event"] == "ready"
        go.touch()
        outcomes = [_next_event(p) for p in procs]
        for p in procs:
            p.wait(timeout=120)
        return outcomes
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _holder_of(outcomes: list[dict]) -> int:
    winners = [o["pid"] for o in outcomes if o["event"] == "won"]
    assert len(winners) == 1, outcomes
    losers = [o for o in outcomes if o["event"] == "held"]
    assert len(losers) == len(outcomes) - 1, outcomes
    assert all(o["holder"] == winners[0] for o in losers), outcomes  # the refusal names the holder
    return winners[0]


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_racing_processes_have_exactly_one_holder(tmp_path):
    for rnd in range(3):
        # the winner holds long enough for a loser slowed by a loaded machine to still try
        outcomes = _race(str(tmp_path), f"race{rnd}", 3, tmp_path, ttl_s=30, heartbeat_s=1, hold_s=6)
        _holder_of(outcomes)
    assert read_lease(str(tmp_path), "race0") is None  # every winner released


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_killed_holder_is_taken_over_after_ttl_and_not_before(tmp_path):
    ttl = 3.0
    holder = _spawn(location=str(tmp_path), name="study", ttl_s=ttl, heartbeat_s=0.3, hold_s=600)
    assert _next_event(holder)["event"] == "ready"
    assert _next_event(holder)["event"] == "won"
    time.sleep(1.0)  # a few heartbeats
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed_at = time.time()
    last_beat = read_lease(str(tmp_path), "study").heartbeat
    refused_ages = []
    # local_liveness=False: judge by the heartbeat only, as a contender on another machine would
    contender = Lease(str(tmp_path), "study", ttl_s=ttl, heartbeat_s=0.5, local_liveness=False)
    while True:
        try:
            contender.acquire()
            break
        except LeaseHeld as e:
            assert e.holder.pid == holder.pid and e.age_s <= ttl
            refused_ages.append(e.age_s)
            assert time.time() - killed_at < ttl + 30, "never taken over"
            time.sleep(0.1)
    acquired_at = time.time()
    try:
        assert acquired_at - last_beat > ttl  # not before the ttl
        assert acquired_at - killed_at < ttl + 2.0  # and promptly after it
        assert refused_ages and max(refused_ages) > ttl - 1.0  # refused right up to the ttl
        assert contender.took_over is not None and contender.took_over.pid == holder.pid
        assert "heartbeat" in (contender.takeover_reason or "")
        now = read_lease(str(tmp_path), "study")
        assert now is not None and now.pid == os.getpid() and now.generation == 2
    finally:
        contender.release()


def test_holder_dead_on_this_machine_is_taken_over_at_once_even_as_a_zombie(tmp_path):
    holder = _spawn(location=str(tmp_path), name="study", ttl_s=600, heartbeat_s=1, hold_s=600)
    assert _next_event(holder)["event"] == "ready"
    assert _next_event(holder)["event"] == "won"
    with pytest.raises(LeaseHeld):  # alive: refused
        Lease(str(tmp_path), "study", ttl_s=600).acquire()
    holder.send_signal(signal.SIGKILL)
    time.sleep(0.5)  # not reaped yet: a zombie still has its pid
    t0 = time.time()
    lease = Lease(str(tmp_path), "study", ttl_s=600).acquire(wait=True, timeout_s=10)
    try:
        assert time.time() - t0 < 5.0  # not the 600 s ttl
        assert lease.took_over is not None and lease.took_over.pid == holder.pid
        assert "gone from this machine" in (lease.takeover_reason or "")
    finally:
        lease.release()
        holder.wait()


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_heartbeat_keeps_a_long_lived_holder_and_a_waiter_gets_it_on_release(tmp_path):
    ttl = 3.0  # ten heartbeats per ttl: a holder starved for a second keeps its lease
    holder = _spawn(location=str(tmp_path), name="study", ttl_s=ttl, heartbeat_s=0.3, hold_s=4 * ttl)
    assert _next_event(holder)["event"] == "ready"
    won = _next_event(holder)
    assert won["event"] == "won"
    ages = []
    while time.time() < won["t"] + 3 * ttl:  # well past the ttl: the heartbeat keeps it
        with pytest.raises(LeaseHeld) as e:
            Lease(str(tmp_path), "study", ttl_s=ttl, local_liveness=False).acquire()
        ages.append(e.value.age_s)
        time.sleep(0.2)
    assert max(ages) < ttl
    with pytest.raises(LeaseHeld):  # a bounded wait that ends before the holder does
        Lease(str(tmp_path), "study", ttl_s=ttl).acquire(wait=True, timeout_s=0.5, poll_s=0.1)
    waiter = Lease(str(tmp_path), "study", ttl_s=ttl).acquire(wait=True, timeout_s=120, poll_s=0.1)
    try:
        assert waiter.took_over is None  # released, not taken over
        assert _next_event(holder)["event"] == "released"
        holder.wait(timeout=60)
    finally:
        waiter.release()


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_stalled_holder_learns_it_lost_the_lease(tmp_path):
    ttl = 1.0
    holder = _spawn(location=str(tmp_path), name="study", ttl_s=ttl, heartbeat_s=0.2, hold_s=600)
    try:
        assert _next_event(holder)["event"] == "ready"
        assert _next_event(holder)["event"] == "won"
        holder.send_signal(signal.SIGSTOP)  # a paused driver: no heartbeats
        time.sleep(ttl + 0.5)
        new = Lease(str(tmp_path), "study", ttl_s=ttl, local_liveness=False).acquire()
        holder.send_signal(signal.SIGCONT)
        lost = _next_event(holder, timeout_s=30)
        assert lost["event"] == "lost" and "taken over" in lost["why"]
        assert _next_event(holder)["event"] == "released"
        holder.wait(timeout=30)
        assert read_lease(str(tmp_path), "study").token == new._me.token  # its release left ours alone
        new.renew()  # still ours
        new.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_bad_name_and_free_lease(tmp_path):
    with pytest.raises(ValueError, match="lease name"):
        Lease(str(tmp_path), "../x")
    assert read_lease(str(tmp_path), "study") is None
    with Lease(str(tmp_path), "study", ttl_s=5) as lease:
        h = read_lease(str(tmp_path), "study")
        assert h is not None and h.pid == os.getpid() and h.host == socket.gethostname() and lease.held
    assert read_lease(str(tmp_path), "study") is None and not lease.held
    with Lease(str(tmp_path), "study", ttl_s=5).acquire(wait=True, timeout_s=5) as lease:  # not taken twice
        assert lease.held and lease.generation == 2 and lease.took_over is None
    with pytest.raises(LeaseHeld, match=r"lease 'x' .* is held by pid \d+ on host .*heartbeat"):
        with Lease(str(tmp_path), "x", ttl_s=5):
            Lease(str(tmp_path), "x", ttl_s=5).acquire()


# --------------------------------------------------------------------------- object store


@pytest.fixture(scope="module")
def s3_uri():
    """A bucket on a real S3 API server (moto_server), as a pyarrow URI."""
    exe = shutil.which("moto_server")
    if exe is None:
        pytest.skip("moto_server (S3 API server) is not installed")
    port = free_port()
    proc = subprocess.Popen([exe, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "moto_server did not start"
                time.sleep(0.2)
        import pyarrow.fs as pafs

        # allow_delayed_open: small files go up as one PutObject (moto fails pyarrow's multipart
        # completion; S3 itself publishes either kind atomically)
        opts = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1&allow_delayed_open=true"
        fs, _ = pafs.FileSystem.from_uri(f"s3://key:secret@leases?{opts}&allow_bucket_creation=true")
        fs.create_dir("leases")
        yield f"s3://key:secret@leases/study?{opts}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_object_store_race_has_one_holder_and_heartbeats(s3_uri, tmp_path):
    outcomes = _race(s3_uri, "race", 2, tmp_path, ttl_s=30, heartbeat_s=0.5, hold_s=3, settle_s=0.5)
    _holder_of(outcomes)
    assert read_lease(s3_uri, "race") is None  # released
    lease = Lease(s3_uri, "beat", ttl_s=1.0, heartbeat_s=0.2, settle_s=0.2).acquire()
    try:
        time.sleep(2.0)  # twice the ttl
        h = read_lease(s3_uri, "beat")
        assert h is not None and h.age_s() < 1.0 and not lease.lost.is_set()
        with pytest.raises(LeaseHeld) as e:
            Lease(s3_uri, "beat", ttl_s=1.0, settle_s=0.2, local_liveness=False).acquire()
        assert "secret" not in str(e.value) and "key:***@" in str(e.value)  # the URI's password is masked
    finally:
        lease.release()


def test_a_generation_listed_but_not_read_at_first_is_read_again(tmp_path, monkeypatch):
    """A failed read of the current generation (an object store's request under load) is retried,
    not taken for a foreign holder ('?'). Control: a read that keeps failing still gives '?'."""
    import orchestrator.track.lease as L

    lease = Lease(str(tmp_path), "again", ttl_s=30).acquire()
    try:
        real, fails = L._LocalDir.read, {"left": 2}

        def flaky(self, name):
            if fails["left"]:
                fails["left"] -= 1
                return None
            return real(self, name)

        monkeypatch.setattr(L._LocalDir, "read", flaky)
        h = read_lease(str(tmp_path), "again")
        assert h is not None and h.host == socket.gethostname() and h.pid == os.getpid() and fails["left"] == 0
        monkeypatch.setattr(L._LocalDir, "read", lambda self, name: None)
        assert read_lease(str(tmp_path), "again").host == "?"
    finally:
        lease.release()
