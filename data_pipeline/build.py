"""prepare(): corpus + tokenizer config -> content-addressed directory of Arrow token shards.

Identity: ``content_hash`` = sha256 over (format version, corpus config, tokenizer config, source
fingerprint = sha256 of every input file). The output lives at ``<cache_root>/<content_hash>``;
if its manifest exists, prepare returns at once (a no-op). Otherwise it streams over the
documents three times, never holding the corpus (a mixture's picks wait in a spill file on
disk: ``sources._mixture_documents``): a survey splits them train/val by a hash of each document id and
counts the lines the tokenizer may train on; the tokenizer trains on a bounded, fixed-seed
sample of the train split's lines (``tokenizer.max_sentences``, drawn from the count, so it is
the sample a list would give); chunks of documents are tokenized in a process pool (spawned
local processes, or Ray tasks over a cluster's nodes: ``PoolFactory``) with a bounded number
in flight. Everything is written to a locked work directory, each file renamed into place
whole, so a killed prepare is resumed by the next (``_work_dir``), and published with one
rename (or, for object-store URIs, from a local temp directory, an upload with the manifest
last). The shards and content hash are those of the in-memory version it replaced.

Layout of a prepared directory::

    manifest.json        counts, hashes, shard list, unigram baseline (the commit marker)
    tokenizer.model      SentencePiece model (absent for mqar)
    train-00000.arrow    one row per document: ids list<uint16|uint32>, ending in eod_id
    val-00000.arrow      (mqar: one row per example, plus a labels column list<int32>, -100 = unscored)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import chain, islice
from typing import Any

import numpy as np

from . import encode, mqar, sources, storage, unigram
from .config import CorpusConfig, TokenizerConfig
from .errors import DataError
from .tokenizer import eligible_lines, model_hash, train_tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CHUNK_CHARS = 1 << 20  # text per tokenization task / shard: ~1 MiB keeps 2+ cores balanced on stdlib


@dataclass(frozen=True)
class PreparedData:
    """A prepared corpus. `path` is a local directory or URI; `manifest` is manifest.json as a dict
    (source hashes, tokenizer hash, per-split document/token counts and shards, dtype, layout)."""

    path: str
    content_hash: str
    vocab_size: int
    eod_id: int
    tokenizer_path: str
    tokenizer_hash: str
    manifest: dict = field(hash=False)

    @classmethod
    def from_manifest(cls, path: str, manifest: dict) -> PreparedData:
        tok = manifest.get("tokenizer") or {}
        return cls(
            path=path,
            content_hash=manifest["content_hash"],
            vocab_size=manifest["vocab_size"],
            eod_id=manifest["eod_id"],
            tokenizer_path=storage.join(path, tok["file"]) if tok.get("file") else "",
            tokenizer_hash=tok.get("sha256", ""),
            manifest=manifest,
        )


def content_hash(corpus: CorpusConfig, tokenizer: TokenizerConfig, fingerprint: dict) -> str:
    """Hex sha256 (first 20 chars) of everything the prepared tokens depend on."""
    ident = {
        "format": FORMAT_VERSION,
        "corpus": corpus.model_dump(mode="json"),
        "tokenizer": None if corpus.source == "mqar" else tokenizer.model_dump(mode="json"),
        "sources": fingerprint,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]


def _default_num_proc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _val_score(doc_id: str) -> float:
    return int.from_bytes(hashlib.sha1(doc_id.encode()).digest()[:8], "big") / 2.0**64


_SPLIT_CODES = {None: 0, "train": 1, "val": 2}  # a document's split as one byte


def _val_flags(split_codes: np.ndarray, scores: np.ndarray, val_fraction: float, label: str) -> np.ndarray:
    """bool [documents], in order: True for val. Forced when any document names its split
    (``split_codes``, uint8 [documents], ``_SPLIT_CODES`` of each document's split: val_paths),
    else val when the hash score of its id (``scores``, float64 [documents], ``_val_score``)
    < val_fraction; tiny corpora: the lowest-scoring document goes to val so val is never empty.

    Raises DataError naming ``label`` when a split would be empty."""
    forced = bool(split_codes.any())
    is_val = split_codes == _SPLIT_CODES["val"] if forced else scores < val_fraction
    if not is_val.any() and len(is_val) > 1:
        is_val[int(np.argmin(scores))] = True
    n_val = int(is_val.sum())
    if not n_val or n_val == len(is_val):
        raise DataError(f"{label}: needs at least one train and one val document (got {len(is_val) - n_val} train, {n_val} val)")
    return is_val


def split_documents(docs: list[sources.Document], val_fraction: float, label: str):
    """(train, val) lists of ``docs``, order preserved, split as ``_val_flags`` says."""
    codes = np.array([_SPLIT_CODES[d.split] for d in docs], dtype=np.uint8)
    is_val = _val_flags(codes, np.array([_val_score(d.id) for d in docs]), val_fraction, label)
    return [d for d, v in zip(docs, is_val) if not v], [d for d, v in zip(docs, is_val) if v]


@dataclass(frozen=True)
class _Survey:
    """The first pass over a streamed corpus: per document (in order) whether it is val and how
    many lines the tokenizer may train on, and the text's size: about 17 bytes a document
    (170 MB for 10 M documents), whatever their text."""

    is_val: np.ndarray  # bool [documents]
    lines: np.ndarray  # int64 [documents]: eligible tokenizer lines
    text_bytes: int


def _survey(corpus: CorpusConfig, tokenizer: TokenizerConfig, stats: sources.DecodeStats, label: str) -> _Survey:
    codes, scores, lines = bytearray(), array("d"), array("q")  # compact: no Python object per document
    nbytes = 0
    for d in sources.iter_documents(corpus, stats):
        codes.append(_SPLIT_CODES[d.split])
        scores.append(_val_score(d.id))
        lines.append(len(eligible_lines(d.text, tokenizer)))
        nbytes += len(d.text.encode("utf-8"))
    split_codes = np.frombuffer(codes, dtype=np.uint8)
    is_val = _val_flags(split_codes, np.frombuffer(scores, dtype=np.float64), corpus.val_fraction, label)
    return _Survey(is_val, np.frombuffer(lines, dtype=np.int64), nbytes)


def _documents(corpus: CorpusConfig, survey: _Survey, label: str) -> Iterator[tuple[sources.Document, bool]]:
    """(document, is val) of a later pass over the corpus. Raises DataError when the inputs
    changed since the survey (another document count)."""
    n = 0
    for n, d in enumerate(sources.iter_documents(corpus), 1):
        if n > len(survey.is_val):
            break
        yield d, bool(survey.is_val[n - 1])
    if n != len(survey.is_val):
        raise DataError(f"{label}: the inputs changed while being prepared ({len(survey.is_val)} documents, then {n})")


def _chunk_tasks(docs: Iterator[tuple[sources.Document, bool]], eod_id: int, dtype: str, tmp: str, names: list[tuple[str, str]]):
    """Tokenization tasks (shard path, texts, eod id, dtype): each split's documents cut, in
    order, into chunks of at least ``CHUNK_CHARS`` characters (the last one shorter), shard
    ``<split>-<i>.arrow`` the i-th chunk of its split. Appends (split, shard name) to ``names``
    as each task is made; holds one open chunk per split."""
    cur: dict[str, list[str]] = {"train": [], "val": []}
    size, count = dict.fromkeys(cur, 0), dict.fromkeys(cur, 0)

    def emit(split: str):
        name = f"{split}-{count[split]:05d}.arrow"
        count[split] += 1
        names.append((split, name))
        texts, cur[split], size[split] = cur[split], [], 0
        return (os.path.join(tmp, name), texts, eod_id, dtype)

    for d, is_val in docs:
        split = "val" if is_val else "train"
        cur[split].append(d.text)
        size[split] += len(d.text)
        if size[split] >= CHUNK_CHARS:
            yield emit(split)
    for split in cur:
        if cur[split]:
            yield emit(split)


@contextmanager
def _spawn_without_main():
    """Start spawned workers without re-running the caller's __main__ (a script without an
    `if __name__ == "__main__"` guard, or Ray's worker entry point): the task function lives in
    data_pipeline.encode, so workers never need it."""
    main = sys.modules["__main__"]
    saved: dict[str, object] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


PoolFactory = Callable[[int, Callable[..., None], tuple], Any]
"""(processes, initializer, initargs) -> a ``multiprocessing.pool.Pool``-like object (a context
manager with ``apply_async``), e.g. ``orchestrator.run.driver.prepare_tasks.ClusterPool`` (Ray tasks)."""


def _local_pool(processes: int, initializer: Callable[..., None], initargs: tuple) -> Any:
    # spawn, not fork: forking a process that runs Ray/gRPC threads can deadlock.
    with _spawn_without_main():
        return mp.get_context("spawn").Pool(processes, initializer, initargs)


def _tokenize(
    tasks: Iterator[tuple],
    names: list[tuple[str, str]],
    tmp: str,
    proto: bytes,
    num_proc: int,
    progress: bool,
    label: str,
    pool: PoolFactory | None = None,
) -> dict:
    """Tokenize ``tasks`` (``_chunk_tasks``) into their shards under ``tmp`` in ``pool`` (default: spawned
    local processes); returns the manifest's `splits` entry. A shard already written (whole: see
    ``encode.write_shard``) by a killed prepare is counted, not encoded again. At most 2 x
    ``num_proc`` chunks are in memory at once (read, queued or encoding).

    Raises:
        DataError: a shard a pool process wrote is not visible here (a cluster's nodes do not
            share the cache).
    """
    from tqdm.auto import tqdm

    todo: Iterator[tuple] = (t for t in tasks if not os.path.exists(t[0]))  # names still lists every shard
    # No more processes than chunks: a corpus of one chunk (every small study) starts no pool.
    head = list(islice(todo, num_proc))
    num_proc = max(1, min(num_proc, len(head)))
    todo = chain(head, todo)
    bar = tqdm(desc=f"tokenize {label}", unit="shard", disable=not progress)
    if num_proc == 1 and pool is None:
        encode.init_worker(proto)
        for t in todo:
            encode.encode_chunk(t)
            bar.update()
    elif head:
        with (pool or _local_pool)(num_proc, encode.init_worker, (proto,)) as workers:
            pending: deque = deque()
            for t in todo:
                pending.append(workers.apply_async(encode.encode_chunk, (t,)))
                while len(pending) >= 2 * num_proc or (pending and pending[0].ready()):
                    pending.popleft().get()
                    bar.update()
            while pending:
                pending.popleft().get()
                bar.update()
    bar.close()
    out: dict[str, dict[str, Any]] = {s: {"documents": 0, "tokens": 0, "shards": []} for s in ("train", "val")}
    for split, name in names:
        path = os.path.join(tmp, name)
        if not os.path.exists(path):
            raise DataError(
                f"{label}: shard {path} was written by a process that does not see this cache: "
                "QKSTUDY_CACHE must be storage every node mounts"
            )
        n_docs, n_tok = encode.shard_counts(path)
        out[split]["documents"] += n_docs
        out[split]["tokens"] += n_tok
        out[split]["shards"].append({"file": name, "documents": n_docs, "tokens": n_tok})
    return out


def _prepare_text(
    corpus: CorpusConfig, tokenizer: TokenizerConfig, tmp: str, num_proc: int, progress: bool, pool: PoolFactory | None
) -> dict:
    """Three streamed passes over the documents, none holding the corpus: a survey (split and
    tokenizer-line count per document), the tokenizer's sample, the tokenization. A tokenizer
    and shards a killed prepare left in ``tmp`` are kept (the pass that made them is skipped)."""
    label = corpus.label()
    timings = {}
    t0 = time.perf_counter()
    stats = sources.DecodeStats()
    survey = _survey(corpus, tokenizer, stats, label)
    if stats.documents:
        log.warning(
            "%s: %d documents had undecodable bytes (%d chars replaced by U+FFFD), e.g. %s",
            label,
            stats.documents,
            stats.replaced_chars,
            stats.where[:3],
        )
    timings["read_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = os.path.join(tmp, "tokenizer.model")
    if os.path.exists(model):  # written whole (renamed into place) by a killed prepare of this content hash
        with open(model, "rb") as f:
            proto = f.read()
    else:
        train_lines = int(survey.lines[~survey.is_val].sum())
        train_texts = (d.text for d, is_val in _documents(corpus, survey, label) if not is_val)
        proto = train_tokenizer(train_texts, tokenizer, label, num_threads=num_proc, total_lines=train_lines)
        with open(f"{model}.part", "wb") as f:
            f.write(proto)
        os.replace(f"{model}.part", model)
    timings["tokenizer_train_s"] = time.perf_counter() - t0
    eod_id = 2  # SentencePiece </s>
    dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
    t0 = time.perf_counter()
    names: list[tuple[str, str]] = []
    tasks = _chunk_tasks(_documents(corpus, survey, label), eod_id, dtype, tmp, names)
    resumed = sum(n.endswith(".arrow") for n in os.listdir(tmp))
    if resumed:
        log.warning("%s: resuming a prepare that was stopped: %d shards already written are kept", label, resumed)
    splits = _tokenize(tasks, names, tmp, proto, num_proc, progress, label, pool)
    timings["tokenize_s"] = time.perf_counter() - t0
    return {
        "layout": "stream",
        "vocab_size": tokenizer.vocab_size,
        "eod_id": eod_id,
        "dtype": dtype,
        "tokenizer": {"file": "tokenizer.model", "sha256": model_hash(proto), "config": tokenizer.model_dump(mode="json")},
        "splits": splits,
        "text_bytes": survey.text_bytes,
        "decode_errors": {"documents": stats.documents, "replaced_chars": stats.replaced_chars},
        "timings": timings,
    }


def _prepare_mqar(corpus: CorpusConfig, tmp: str) -> dict:
    p = corpus.resolved_mqar().resolved()
    dtype = "uint16" if p["vocab_size"] <= 1 << 16 else "uint32"
    splits = {}
    for i, (split, n) in enumerate((("train", p["num_train_examples"]), ("val", p["num_val_examples"]))):
        ids, labels = mqar.generate(
            int(n),
            int(p["vocab_size"]),
            int(p["seq_len"]),
            int(p["num_kv_pairs"]),
            float(p["power_a"]),
            np.random.default_rng([corpus.seed, i]),
        )
        name = f"{split}-00000.arrow"
        n_tok = ids.size
        encode.write_shard(
            os.path.join(tmp, name),
            np.arange(n + 1) * ids.shape[1],
            {"ids": ids.reshape(-1).astype(dtype), "labels": labels.reshape(-1).astype(np.int32)},
        )
        splits[split] = {"documents": n, "tokens": n_tok, "shards": [{"file": name, "documents": n, "tokens": n_tok}]}
    return {
        "layout": "examples",
        "example_len": p["seq_len"] + 1,
        "vocab_size": p["vocab_size"],
        "eod_id": 0,
        "dtype": dtype,
        "tokenizer": None,
        "mqar": p,
        "splits": splits,
    }


@contextmanager
def _work_dir(root: str, h: str, remote: bool) -> Iterator[str | None]:
    """The directory a prepare writes into before publishing, or None when, once it may write,
    the data is already published.

    A local cache: ``<root>/.partial-<hash>-v<format>``, held under an exclusive lock
    (``flock`` on a sibling ``.lock``) for the whole prepare: a second prepare of the same
    content waits, then finds it published; a killed one's directory stays, and the next
    prepare resumes it (its tokenizer and whole shards kept). A bad-input DataError removes it.
    A URI: a fresh local temp directory, uploaded by ``storage.publish`` (no resume)."""
    if remote:
        tmp = tempfile.mkdtemp(prefix=f".tmp-{h}-")
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    os.makedirs(root, exist_ok=True)
    work = os.path.join(root, f".partial-{h}-v{FORMAT_VERSION}")
    with open(f"{work}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel when a holder dies
        if storage.read_manifest(os.path.join(root, h)) is not None:
            yield None
            return
        os.makedirs(work, exist_ok=True)
        os.chmod(work, 0o755)  # shards on shared storage are read by other users and containers
        try:
            yield work
        except DataError:
            shutil.rmtree(work, ignore_errors=True)  # bad input: nothing to resume
            raise
        finally:
            if not os.path.exists(work):  # published or removed: a prepare that opens the lock from now on need not wait
                os.unlink(f"{work}.lock")


def prepare(
    corpus: CorpusConfig,
    tokenizer: TokenizerConfig,
    cache_root=None,
    *,
    num_proc: int | None = None,
    progress: bool = True,
    pool: PoolFactory | None = None,
) -> PreparedData:
    """Prepare `corpus` with `tokenizer` into ``<cache_root>/<content_hash>``, or return it if present.

    cache_root: local path or pyarrow URI (s3://, gs://, file://); default $QKSTUDY_CACHE or
    ~/.cache/qkstudy/data. num_proc: tokenization processes (default: CPUs this process may use).
    pool: where the tokenization processes run (``PoolFactory``; default spawned local processes;
    a local cache only, since every process writes its shards straight into it). A killed
    prepare of a local cache is resumed by the next (``_work_dir``).
    Raises DataError (a ValueError) naming the source for bad input; nothing is left half-written.
    """
    root = str(cache_root) if cache_root is not None else storage.default_cache_root()
    remote = storage.is_uri(root)
    if not remote:
        root = os.path.abspath(os.path.expanduser(root))
    fp = sources.fingerprint(corpus)
    h = content_hash(corpus, tokenizer, fp)
    dest = storage.join(root, h)
    manifest = storage.read_manifest(dest)
    if manifest is not None:
        return PreparedData.from_manifest(dest, manifest)
    with _work_dir(root, h, remote) as tmp:
        if tmp is not None:
            _build(corpus, tokenizer, fp, h, tmp, num_proc or _default_num_proc(), progress, None if remote else pool)
            storage.publish(tmp, dest)
    manifest = storage.read_manifest(dest)
    if manifest is None:  # published, yet unreadable: storage lost it or another writer removed it
        raise DataError(f"{corpus.label()}: {dest} has no readable manifest.json after publishing")
    return PreparedData.from_manifest(dest, manifest)


def _build(
    corpus: CorpusConfig, tokenizer: TokenizerConfig, fp: dict, h: str, tmp: str, num_proc: int, progress: bool, pool: PoolFactory | None
) -> None:
    """Write the prepared directory's files (shards, tokenizer, then the manifest) into ``tmp``."""
    t0 = time.perf_counter()
    body = _prepare_mqar(corpus, tmp) if corpus.source == "mqar" else _prepare_text(corpus, tokenizer, tmp, num_proc, progress, pool)
    for split, info in body["splits"].items():
        if info["tokens"] < 2:
            raise DataError(f"{corpus.label()}: split '{split}' has {info['tokens']} tokens, too few for a window")
    body["unigram"] = unigram.prepared_unigram(tmp, body)  # cheap (a bincount); data_pipeline.unigram
    manifest = {
        "format_version": FORMAT_VERSION,
        "content_hash": h,
        "source": corpus.source,
        "corpus": corpus.model_dump(mode="json"),
        "source_hashes": fp,
        **body,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    manifest.setdefault("timings", {})["total_s"] = time.perf_counter() - t0
    with open(os.path.join(tmp, storage.MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
