"""Prepare on a two-node loopback cluster: the study's prepare task tokenizes in Ray tasks
spread over both nodes, each writing its shard into the shared cache, and publishes exactly
what a one-process prepare of the same corpus writes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

import data_pipeline.build as build
from data_pipeline import CorpusConfig, TokenizerConfig, prepare
from tests.helpers import REPO, prepared_digest, write_words_corpus

pytestmark = pytest.mark.stack

CHUNK_CHARS = 20_000  # about 20 shards from the words corpus: tasks for both nodes

SCRIPT = """
import json, sys, time
import ray
from tests.helpers import tokenization_task_nodes
import data_pipeline.build as build
from orchestrator.run.driver import prepare_tasks

corpus, tokenizer, cache, chunk = json.loads(sys.argv[1])
ray.init(address=sys.argv[2], logging_level="ERROR")


@ray.remote(num_cpus=1)
def task():  # the study's prepare task, with shards small enough to make many tasks
    build.CHUNK_CHARS = chunk
    return prepare_tasks._prepare_task._function(corpus, tokenizer, cache)


t0 = time.perf_counter()
out = ray.get(task.remote())
wall = time.perf_counter() - t0
task_nodes = tokenization_task_nodes(sys.argv[2], out["path"])
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
print(json.dumps({"path": out["path"], "tokens": out["tokens"], "wall_s": wall, "task_nodes": task_nodes, "nodes": nodes}))
"""


def test_prepare_tokenizes_on_both_nodes_and_writes_what_one_process_does(loopback_cluster, tmp_path, monkeypatch, record_property):
    cluster = loopback_cluster(head_cpus=2)
    cluster.add_worker("nodea", cpus=2)
    root = tmp_path / "corpus"
    root.mkdir()
    write_words_corpus(root)
    corpus, tokenizer = CorpusConfig(source="text", paths=[str(root)]), TokenizerConfig(vocab_size=300)
    args = json.dumps([corpus.model_dump(mode="json"), tokenizer.model_dump(mode="json"), str(tmp_path / "shared"), CHUNK_CHARS])
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, args, f"127.0.0.1:{cluster.gcs}"],
        cwd=REPO,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out["nodes"]) == 2
    per_node = Counter(out["task_nodes"])
    assert set(per_node) == set(out["nodes"]), out  # tasks ran on both nodes
    assert min(per_node.values()) >= len(out["task_nodes"]) // 3, per_node  # in turn, not a few strays

    monkeypatch.setattr(build, "CHUNK_CHARS", CHUNK_CHARS)
    alone = prepare(corpus, tokenizer, tmp_path / "alone", num_proc=1, progress=False)
    shards = sum(len(alone.manifest["splits"][split]["shards"]) for split in ("train", "val"))
    assert shards > 10 and len(out["task_nodes"]) == shards  # one task a shard
    assert prepared_digest(out["path"]) == prepared_digest(alone.path)
    tokens = sum(out["tokens"].values())
    record_property("two_node_prepare", {"tokens": tokens, "wall_s": round(out["wall_s"], 1), "tasks": len(out["task_nodes"])})
    print(f"\n[two-node prepare] {tokens} tokens in {out['wall_s']:.1f} s, {len(out['task_nodes'])} tasks on 2 nodes")
