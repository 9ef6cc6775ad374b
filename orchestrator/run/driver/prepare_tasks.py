"""Data preparation for a study: each corpus tokenized once, as a Ray task, then checked.

One Ray task per corpus, all started at once; ``data_pipeline.prepare`` is content-addressed
and cached, so a task for a corpus already prepared returns at once. On a cluster of several
nodes the task tokenizes in Ray tasks spread over them (``ClusterPool``), each writing its
shard into the shared cache; a killed prepare is resumed by the next (its whole shards kept). ``check_data_fits``
runs before MLflow is touched: a corpus too small for one window, with token ids beyond the
model's vocabulary, or whose files changed after the study was planned (its content hash is
no longer the one in the runs' identity), leaves no record.

Each corpus's unigram baseline (``data_pipeline.unigram``: cached in the prepared data's
manifest) is set on the study's experiment by ``record_unigrams``, also when every run had
finished and Ray never starts (``find_unigrams`` reads the prepared directory the plan's
content hash names).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rich.console import Console

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.inputs import CorpusError
from orchestrator.track.tracking import client_for, ensure_experiment, set_unigram_tags

if TYPE_CHECKING:
    from data_pipeline.build import PoolFactory

__all__ = ["CorpusError", "check_data_fits", "find_unigrams", "prepare_data", "record_unigrams"]


@ray.remote(num_cpus=1)
def _pool_task(init: tuple[Callable[..., None], tuple], func: Callable, args: tuple) -> Any:
    initializer, initargs = init
    initializer(*initargs)  # a SentencePiece model from its proto: milliseconds, beside a chunk's encode
    return func(*args)


class _TaskResult:
    """The ``multiprocessing.pool.AsyncResult`` face of one Ray task."""

    def __init__(self, ref: ray.ObjectRef) -> None:
        self.ref = ref

    def ready(self) -> bool:
        return bool(ray.wait([self.ref], timeout=0)[0])

    def get(self) -> Any:
        return ray.get(self.ref)


def node_turns(cpus: Mapping[str, float]) -> list[str]:
    """One round of a weighted round-robin over nodes: node id -> CPUs in, a list in which each
    node appears once per whole CPU, its turns evenly spaced (smooth: {a: 2, b: 1} gives
    a, b, a, not a, a, b), ties in the mapping's order. Raises ValueError on no CPUs at all."""
    turns = sorted((j / int(n), k, node) for k, (node, n) in enumerate(cpus.items()) for j in range(int(n)))
    if not turns:
        raise ValueError("no node has a whole CPU to take a turn")
    return [node for _, _, node in turns]


def _cpu_nodes() -> dict[str, float]:
    """Alive nodes with CPUs: node id -> CPUs."""
    return {n["NodeID"]: n["Resources"]["CPU"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0}


class ClusterPool:
    """``data_pipeline.build.PoolFactory`` over Ray tasks: each ``apply_async`` is one task of
    one CPU (for prepare: encode a chunk of documents and write its shard into the shared
    cache), pinned in turn to the cluster's nodes, each as often as it has CPUs (``node_turns``).
    Ray's SPREAD hint does not spread short tasks: the owner reuses the worker it already leased
    for the next task of the same kind, so chunks of a fast corpus all ran on the first node.
    The pin is soft: a node gone by then runs its task elsewhere. Tasks, not a pool of actors:
    a busy cluster makes them wait their turn, where actors that must all start before any
    works could wait on each other."""

    def __init__(self, processes: int, initializer: Callable[..., None], initargs: tuple) -> None:
        self.processes = processes
        self.init = ray.put((initializer, initargs))  # once in the object store, not once per task
        self.turns = itertools.cycle(node_turns(_cpu_nodes()))

    def apply_async(self, func: Callable, args: tuple = ()) -> _TaskResult:
        where = NodeAffinitySchedulingStrategy(next(self.turns), soft=True)
        return _TaskResult(_pool_task.options(scheduling_strategy=where).remote(self.init, func, args))

    def __enter__(self) -> ClusterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def tokenizer_processes() -> tuple[int, PoolFactory | None]:
    """(processes, pool) for a prepare run inside a Ray task: on a cluster of two or more nodes
    with CPUs, their CPUs in all, as Ray tasks (``ClusterPool``); on one node the CPUs this
    process may use, in local processes (no task scheduling to pay per chunk)."""
    nodes = _cpu_nodes()
    if len(nodes) > 1:
        return int(sum(nodes.values())), ClusterPool
    return len(os.sched_getaffinity(0)), None


@ray.remote(num_cpus=1)
def _prepare_task(corpus: dict, tokenizer: dict, cache_root: str | None) -> dict[str, Any]:
    from data_pipeline import CorpusConfig, TokenizerConfig, prepare
    from data_pipeline.unigram import unigram_of

    processes, pool = tokenizer_processes()
    p = prepare(
        CorpusConfig.model_validate(corpus).with_root(corpus.get("root")),  # its components take the root too
        TokenizerConfig.model_validate(tokenizer),
        cache_root,
        num_proc=processes,
        progress=False,
        pool=pool,
    )
    tokens = {split: info["tokens"] for split, info in p.manifest.get("splits", {}).items()}
    return {
        "path": p.path,
        "content_hash": p.content_hash,
        "tokenizer_hash": p.tokenizer_hash,
        "vocab_size": p.vocab_size,
        "tokens": tokens,
        "unigram": unigram_of(p.path, p.manifest),
    }


def prepare_data(runs: list[RunSpec]) -> dict[str, dict[str, Any]]:
    """Prepare (or find cached) each corpus the runs need, one Ray task per corpus, all at
    once; returns corpus name -> {path, content_hash, tokenizer_hash (sha256 of the
    tokenizer model; empty for mqar), vocab_size, tokens (per split), unigram (the
    manifest's unigram entry: val_ppl, val_tokens, ...)}.

    Raises:
        CorpusError: a corpus cannot be prepared (the task's DataError, re-raised here).
    """
    from data_pipeline import DataError

    wanted = {r.corpus_name: ({**r.corpus, "root": r.corpus_root} if r.corpus_root else r.corpus, r.tokenizer) for r in runs}
    cache = os.environ.get("QKSTUDY_CACHE")
    refs = {name: _prepare_task.remote(c, t, cache) for name, (c, t) in wanted.items()}
    out = {}
    for name, ref in refs.items():
        try:
            out[name] = ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, DataError):  # the original error, without Ray's traceback
                raise CorpusError(name, str(e.cause)) from None
            raise
    return out


def check_data_fits(runs: list[RunSpec], datasets: dict[str, dict[str, Any]]) -> None:
    """Every run's corpus is the data it was planned with (same content hash), holds at least
    one training window and one validation window, and its token ids fit the model's vocabulary.

    Raises:
        CorpusError: naming the corpus, the split and the setting (train.seq_len, vocab).
    """
    for r in runs:
        d = datasets[r.corpus_name]
        if r.data_hash is not None and r.data_hash != d["content_hash"]:
            raise CorpusError(
                r.corpus_name,
                f"its files changed after the study was planned (content hash "
                f"{r.data_hash} planned, {d['content_hash']} prepared): run it again",
            )
        need = r.train.seq_len + 1
        for split, n in d.get("tokens", {}).items():
            if n < need:
                raise CorpusError(
                    r.corpus_name,
                    f"the {split} split has {n} tokens, fewer than one window of "
                    f"train.seq_len + 1 = {need} tokens (add documents or lower train.seq_len)",
                )
        if d["vocab_size"] > r.model["vocab_size"]:
            raise CorpusError(
                r.corpus_name,
                f"token ids go up to {d['vocab_size'] - 1}, beyond the model's vocabulary "
                f"of {r.model['vocab_size']} (tokenizer.vocab_size)",
            )


def find_unigrams(runs: list[RunSpec], console: Console) -> dict[str, dict[str, Any]]:
    """corpus name -> unigram entry (``data_pipeline.unigram.unigram_of``) of each corpus
    whose prepared directory (``<cache root>/<planned data hash>``, the cache ``prepare``
    uses here) exists; without Ray, for a re-run of a finished study. A corpus whose data is
    gone or unreadable is left out and said so on ``console``: nothing is prepared again."""
    from data_pipeline import DataError, storage
    from data_pipeline.unigram import unigram_of

    root = storage.default_cache_root()
    root = root if storage.is_uri(root) else os.path.abspath(os.path.expanduser(root))
    out = {}
    for name, data_hash in {r.corpus_name: r.data_hash for r in runs if r.data_hash}.items():
        path = storage.join(root, data_hash)
        manifest = storage.read_manifest(path)
        try:
            if manifest is None:
                raise DataError(f"{path} is not prepared (its cache was cleared?)")
            out[name] = unigram_of(path, manifest)
        except (DataError, OSError, KeyError) as e:
            console.print(f"[yellow]data {name}: unigram perplexity not recorded[/]: {e}")
    return out


def record_unigrams(tracking_uri: str, study_name: str, unigrams: Mapping[str, dict[str, Any] | None], console: Console) -> None:
    """Set each corpus's unigram baseline on the study's experiment (``tracking``'s
    ``set_unigram_tags``) and print it; corpora mapped to None are skipped."""
    found = {name: u for name, u in unigrams.items() if u}
    if not found:
        return
    client = client_for(tracking_uri)
    exp_id = ensure_experiment(client, study_name)
    for name, u in sorted(found.items()):
        set_unigram_tags(client, exp_id, name, u["val_ppl"], u["val_tokens"])
        console.print(f"data {name}: unigram perplexity {u['val_ppl']:.2f} (val split, {u['val_tokens']:,} tokens)")
