"""The loopback cluster's joining node (``tests/fixtures/cluster.py``, ``join_node``): a node
whose process ends before it joined is started once more, with a warning that names the node and
what the first attempt said. No Ray here: plain shell processes stand in for `ray start`, a file
they touch for the cluster counting the node alive."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest

from tests.fixtures.cluster import join_node

FAILS = "echo 'raylet did not start in 30 s' >&2; exit 1"  # what `ray start` says when its wait runs out
JOINS = "touch joined; exec sleep 60"  # joins, then runs on as a node does (`ray start --block`)


class Node:
    """``start`` runs the next of ``commands`` in ``folder`` (output to node.log), as
    ``join_node`` calls it; ``started`` holds each process."""

    def __init__(self, folder: Path, *commands: str) -> None:
        self.folder, self.commands, self.started = folder, list(commands), []

    def start(self) -> subprocess.Popen:
        with open(self.folder / "node.log", "w") as log:
            p = subprocess.Popen(["sh", "-c", self.commands.pop(0)], cwd=self.folder, stdout=log, stderr=subprocess.STDOUT)
        self.started.append(p)
        return p

    def joined(self) -> bool:
        return (self.folder / "joined").exists()

    def log(self) -> str:
        return (self.folder / "node.log").read_text()

    def join(self, timeout: float = 30) -> None:
        join_node("nodea", self.start, self.joined, self.log, timeout)


@pytest.fixture
def node(tmp_path):
    made: list[Node] = []

    def make(*commands: str) -> Node:
        made.append(Node(tmp_path, *commands))
        return made[-1]

    yield make
    for n in made:
        for p in n.started:
            p.kill()
            p.wait()


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_node_whose_start_ends_before_it_joined_is_started_once_more_with_a_warning(node):
    n = node(FAILS, JOINS)
    with pytest.warns(
        UserWarning,
        match=r"node nodea: `ray start` exited 1 before the node joined; starting it once more\. It said: raylet did not start in 30 s",
    ):
        n.join()
    assert len(n.started) == 2 and n.started[1].poll() is None and n.joined()


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_node_that_fails_twice_fails_with_the_second_attempts_output(node):
    n = node(FAILS, "echo 'second attempt: no GCS at 127.0.0.1' >&2; exit 1")
    with pytest.warns(UserWarning, match="raylet did not start"), pytest.raises(AssertionError, match="second attempt: no GCS"):
        n.join()
    assert len(n.started) == 2


def test_a_node_that_joins_is_started_once_and_warns_nothing(node):
    n = node(JOINS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        n.join()
    assert len(n.started) == 1


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_node_that_neither_joins_nor_ends_fails_at_its_timeout_without_a_retry(node):
    n = node("echo 'still waiting for the raylet'; exec sleep 60", JOINS)
    with pytest.raises(AssertionError, match="still waiting for the raylet"):
        n.join(timeout=1)
    assert len(n.started) == 1
