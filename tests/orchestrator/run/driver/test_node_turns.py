"""The weighted round-robin that pins prepare's tokenization tasks to nodes: each node takes
as many turns as it has CPUs, evenly spaced, so short tasks reach every node."""

from collections import Counter

import pytest

from orchestrator.run.driver.prepare_tasks import node_turns


def test_equal_nodes_alternate():
    assert node_turns({"a": 2, "b": 2}) == ["a", "b", "a", "b"]


def test_each_node_takes_one_turn_per_cpu_evenly_spaced():
    turns = node_turns({"head": 2, "big": 4, "one": 1.0})
    assert Counter(turns) == {"head": 2, "big": 4, "one": 1}
    assert turns[0] == "head" and turns[1] == "big" and turns[2] == "one"
    big = [i for i, n in enumerate(turns) if n == "big"]
    assert max(b - a for a, b in zip(big, big[1:])) <= 2  # never all of one node's turns in a row


def test_fractional_cpus_count_whole_ones_and_no_cpus_is_an_error():
    assert node_turns({"a": 1.5, "b": 0.5}) == ["a"]
    with pytest.raises(ValueError, match="no node"):
        node_turns({"a": 0.5})
