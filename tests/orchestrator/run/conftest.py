"""A real multi-node Ray cluster on loopback for the cluster tests: `ray start --head`, then one
`ray start --address` per worker node, each node its own process group so a test can take a
node away (as a preempted machine goes) and add another (as an autoscaler would)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(p: subprocess.Popen, temp: str) -> None:
    """End a node: SIGTERM its process group (even when `ray start` itself already exited: its
    raylet and workers may not have), SIGKILL after 30 s, then whatever still names its temp dir."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    subprocess.run(["pkill", "-9", "-f", temp], check=False)


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _node_tree(root: int, temp: str, root_alive: bool) -> set[int]:
    """A node's processes: ``root`` (its `ray start`, if still ``root_alive``: a reaped pid
    may be another process's now), every process below it (from /proc's parent links), every
    process of its process group or session (what is left of the node when `ray start` already
    exited and its children went to init), and those naming its temp dir, with their descendants."""
    children: dict[int, list[int]] = {}
    tops = {root} if root_alive else set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        pid = int(stat.parent.name)
        try:
            fields = _stat(pid)
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # ended while being read
        children.setdefault(int(fields[1]), []).append(pid)
        if int(fields[2]) == root or int(fields[3]) == root or temp.encode() in cmdline:
            tops.add(pid)
    tops.discard(os.getpid())
    out, todo = set(), list(tops)
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_stopped(pids: set[int], timeout: float = 5.0) -> None:
    """Until each of ``pids`` is stopped (T), a zombie or gone: SIGSTOP is delivered asynchronously."""
    deadline = time.time() + timeout
    for pid in pids:
        while time.time() < deadline:
            try:
                if _stat(pid)[0] in "TtZ":
                    break
            except (OSError, IndexError):
                break
            time.sleep(0.01)


def process_alive(pid: int) -> bool:
    """Running or stopped, not a zombie (a killed child of this process is reaped by ``wait``)."""
    try:
        return _stat(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


class LoopbackCluster:
    """Ray head plus worker nodes on 127.0.0.1, token auth on, as the compose stack runs it.

    ``url``: the dashboard / Job Submission API; ``env``: what a client process needs (the
    token, this environment's ``bin`` first on PATH). Two nodes on one machine must not share
    what separate machines never share: Ray's default agent ports and a temp dir (a job's
    unpacked working_dir would be one folder, deleted under one node by the other's runtime-env
    cleanup); short temp paths because Ray puts Unix sockets there.
    """

    def __init__(self, tmp: Path, head_cpus: int = 2) -> None:
        self.tmp = tmp
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["PATH"] = f"{BIN}:{env['PATH']}"  # the job's `python` is this environment's
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        self.env = env
        self.gcs, self.dash = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.dash}"
        self.nodes: dict[str, tuple[subprocess.Popen, str]] = {}
        self._start("head", head_cpus, ["--head", "--port", str(self.gcs), "--dashboard-host", "127.0.0.1",
                                        "--dashboard-port", str(self.dash), "--include-dashboard", "true"])

    def wait_up(self, timeout: float = 120) -> None:
        """Wait until the head's dashboard answers."""
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(self.url + "/api/version", timeout=2)
                break
            except urllib.error.HTTPError:  # up, and asking for Ray's auth token
                break
            except OSError:
                assert time.time() < deadline and self.nodes["head"][0].poll() is None, self.log("head")
                time.sleep(1)

    def _start(self, name: str, cpus: int, args: list[str]) -> None:
        temp = tempfile.mkdtemp(prefix="r" + name[-2:], dir="/tmp")
        ports = ["--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
                 "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
                 "--ray-client-server-port", str(free_port())]
        with open(self.tmp / f"{name}.log", "w") as log:  # the child keeps its own descriptor
            p = subprocess.Popen([str(BIN / "ray"), "start", *args, "--temp-dir", temp, *ports, "--num-cpus", str(cpus),
                                  "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"],
                                 env=self.env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        self.nodes[name] = (p, temp)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def alive_nodes(self) -> list[str]:
        """The raylet socket paths of the nodes the cluster counts alive (each under its node's
        own temp dir, so they name the node: every node here has the same IP)."""
        probe = (f"import ray; ray.init(address='127.0.0.1:{self.gcs}', logging_level='ERROR'); "
                 "print('\\n'.join(n['RayletSocketName'] for n in ray.nodes() if n['Alive']))")
        out = subprocess.run([sys.executable, "-c", probe], env=self.env, capture_output=True, text=True, timeout=120)
        return out.stdout.split()

    def add_worker(self, name: str, cpus: int = 2, timeout: float = 180) -> None:
        """Start a worker node and wait until the cluster counts it alive."""
        self._start(name, cpus, ["--address", f"127.0.0.1:{self.gcs}"])
        temp = self.nodes[name][1]
        deadline = time.time() + timeout
        while not any(sock.startswith(temp + "/") for sock in self.alive_nodes()):
            assert time.time() < deadline and self.nodes[name][0].poll() is None, self.log(name)
            time.sleep(1)

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of a node at once, as a lost machine: its `ray start`, raylet,
        agents and workers. Ray starts workers in sessions of their own (out of the node's
        process group, their command lines without its temp dir), so the node is its process
        tree (``_node_tree``): frozen first (SIGSTOP, until every one is stopped and no new
        one appears), then killed. Raises AssertionError if any of it survives."""
        p, temp = self.nodes[name]
        frozen: set[int] = set()
        root_alive = p.poll() is None
        while grown := _node_tree(p.pid, temp, root_alive) - frozen:
            for pid in grown:
                _signal(pid, signal.SIGSTOP)
            frozen |= grown
            _wait_stopped(grown)  # a process mid-fork: its child is in the next scan
        for pid in frozen:
            _signal(pid, signal.SIGKILL)
        p.wait()
        deadline = time.time() + 10
        while alive := [pid for pid in frozen if process_alive(pid)]:
            assert time.time() < deadline, f"node {name}: processes {alive} outlived SIGKILL"
            time.sleep(0.1)

    def stop(self) -> None:
        for p, temp in reversed(list(self.nodes.values())):
            _stop(p, temp)
        # `ray start` leaves the cluster's address behind for `ray.init()` to find; it is gone now.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().endswith(f":{self.gcs}"):
            current.unlink()
        for _, temp in self.nodes.values():
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def loopback_cluster(tmp_path_factory):
    """A factory of ``LoopbackCluster``s; every cluster it started is stopped after the module."""
    started: list[LoopbackCluster] = []

    def start(head_cpus: int = 2) -> LoopbackCluster:
        c = LoopbackCluster(tmp_path_factory.mktemp("cluster"), head_cpus)
        started.append(c)  # stopped even when it never comes up
        c.wait_up()
        return c

    yield start
    for c in started:
        c.stop()
