import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pytest

from data_pipeline import CorpusConfig, PreparedData, TokenizerConfig, prepare
from data_pipeline.build import split_documents
from data_pipeline.errors import DataError
from data_pipeline.sources import load_documents
from data_pipeline.tokenizer import eligible_lines, load_tokenizer, sample_sentences


def _shard_rows(prep: PreparedData, split: str) -> list[np.ndarray]:
    rows = []
    for s in prep.manifest["splits"][split]["shards"]:
        table = pa.ipc.open_file(pa.memory_map(os.path.join(prep.path, s["file"]))).read_all()
        assert table.schema.field("ids").type == pa.list_(pa.uint16())
        rows += [np.asarray(r, dtype=np.int64) for r in table.column("ids").to_pylist()]
    return rows


def test_manifest_counts_equal_shard_contents(small_stdlib):
    prep = small_stdlib[0]
    m = prep.manifest
    assert m["dtype"] == "uint16" and m["vocab_size"] == 512 == prep.vocab_size
    assert m["tokenizer"]["sha256"] == prep.tokenizer_hash
    assert os.path.basename(prep.path) == prep.content_hash
    total_docs = 0
    for split in ("train", "val"):
        rows = _shard_rows(prep, split)
        info = m["splits"][split]
        assert info["documents"] == len(rows) == sum(s["documents"] for s in info["shards"])
        assert info["tokens"] == sum(len(r) for r in rows) == sum(s["tokens"] for s in info["shards"])
        flat = np.concatenate(rows)
        assert (flat == prep.eod_id).sum() == len(rows)  # exactly one EOD per document, at its end
        assert all(r[-1] == prep.eod_id for r in rows)
        total_docs += len(rows)
    assert total_docs == 60
    assert set(m["source_hashes"]) >= {"__future__.py", "python"}


def test_shards_decode_to_the_source_documents_in_order(small_stdlib):
    prep, corpus, _, _ = small_stdlib
    sp = load_tokenizer(prep.tokenizer_path)
    train, val = split_documents(load_documents(corpus), corpus.val_fraction, corpus.label())
    assert len(val) >= 1
    for split, docs in (("train", train), ("val", val)):
        decoded = [sp.decode(r[:-1].tolist()) for r in _shard_rows(prep, split)]
        assert decoded == [d.text for d in docs]


def test_second_prepare_is_a_no_op(small_stdlib):
    prep, corpus, tokenizer, root = small_stdlib
    manifest_file = os.path.join(prep.path, "manifest.json")
    before = os.stat(manifest_file).st_mtime_ns
    again = prepare(corpus, tokenizer, root, progress=False)
    assert again == prep and os.stat(manifest_file).st_mtime_ns == before
    assert not [p for p in os.listdir(root) if p.startswith(".tmp")]


def test_hash_changes_with_config(small_stdlib):
    prep, corpus, _, root = small_stdlib
    other = prepare(corpus, TokenizerConfig(vocab_size=600), root, num_proc=1, progress=False)
    assert other.content_hash != prep.content_hash and other.vocab_size == 600


def test_parallel_prepare_matches_single_process(tmp_path, monkeypatch):
    import data_pipeline.build as build

    monkeypatch.setattr(build, "CHUNK_CHARS", 50_000)  # several shards from a small corpus
    corpus, tokenizer = CorpusConfig(max_documents=30), TokenizerConfig(vocab_size=600)
    one = prepare(corpus, tokenizer, tmp_path / "a", num_proc=1, progress=False)
    two = prepare(corpus, tokenizer, tmp_path / "b", num_proc=2, progress=False)
    assert len(two.manifest["splits"]["train"]["shards"]) > 2
    assert one.content_hash == two.content_hash and one.tokenizer_hash == two.tokenizer_hash
    for split in ("train", "val"):
        a, b = _shard_rows(one, split), _shard_rows(two, split)
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_uri_cache_root(tmp_path):
    corpus, tokenizer = CorpusConfig(max_documents=8), TokenizerConfig(vocab_size=600)
    prep = prepare(corpus, tokenizer, f"file://{tmp_path}", num_proc=1, progress=False)
    assert prep.path.startswith("file://") and prep.tokenizer_path.startswith("file://")
    with open(tmp_path / prep.content_hash / "manifest.json") as f:
        assert json.load(f)["content_hash"] == prep.content_hash
    from data_pipeline import TokenLoader

    loader = TokenLoader(prep.path, "train", seq_len=32, global_batch=4, seed=0)
    assert loader.num_tokens == prep.manifest["splits"]["train"]["tokens"]
    assert load_tokenizer(prep.tokenizer_path).get_piece_size() == 600


def test_parallel_prepare_from_an_unguarded_script(tmp_path):
    """Spawned workers must not re-run the caller's __main__ (a script without a main guard)."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import data_pipeline.build as build\n"
        "from data_pipeline import CorpusConfig, TokenizerConfig, prepare\n"
        "build.CHUNK_CHARS = 40_000\n"
        "print('MAIN RAN')\n"
        f"p = prepare(CorpusConfig(max_documents=12), TokenizerConfig(vocab_size=600), {str(tmp_path)!r},"
        " num_proc=2, progress=False)\n"
        "print(len(p.manifest['splits']['train']['shards']))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines.count("MAIN") == 1 and int(lines[-1]) > 1


def _write_words_corpus(root) -> None:
    """80 text files of seeded random words: real-looking lines, the same on every machine."""
    rng = np.random.default_rng(7)
    words = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 9))) for _ in range(400)]
    for i in range(80):
        lines = [" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(rng.integers(20, 200))]
        (root / f"doc{i:03d}.txt").write_text("\n".join(lines) + "\n")


def _digest(path: str) -> str:
    """sha256 of a prepared directory: its manifest (less times, paths and hashes that name the
    machine's temp folder) and every file's name and bytes."""
    h = hashlib.sha256()
    m = json.load(open(os.path.join(path, "manifest.json")))
    kept = {k: v for k, v in m.items() if k not in ("created_utc", "timings", "content_hash", "source_hashes", "corpus")}
    h.update(json.dumps(kept, sort_keys=True).encode())
    for f in sorted(os.listdir(path)):
        if f != "manifest.json":
            h.update(f.encode())
            h.update(open(os.path.join(path, f), "rb").read())
    return h.hexdigest()


# Digests of what the in-memory prepare (commit 80eec05, before prepare streamed) wrote for these
# three corpora: a tokenizer sample drawn below the line count, several shards per split from a
# process pool, and the tiny-corpus fallback that moves one document to val.
IN_MEMORY_DIGESTS = {
    "sampled": "02beb4d675ba0f55d8f2d1d6caa9456031bf7142e130ce296b5fcc281d3af4a2",
    "shards": "1ec1dcee5328da06c87418b99b3669adf93520a611eefbd74a2ef4eaaf8941c3",
    "fallback": "d021c95f15e4a1e2dc5cfe4d26b6f97b68acad3eae9db838b85452b6e257dc1a",
}


@pytest.mark.parametrize(
    "case, chunk_chars, corpus_kw, tokenizer_kw, num_proc",
    [
        ("sampled", 1 << 20, {}, {"vocab_size": 300, "max_sentences": 500}, 1),
        ("shards", 20_000, {}, {"vocab_size": 300}, 2),
        ("fallback", 1 << 20, {"val_fraction": 0.001}, {"vocab_size": 300}, 1),
    ],
)
def test_streamed_prepare_writes_what_the_in_memory_one_did(tmp_path, monkeypatch, case, chunk_chars, corpus_kw, tokenizer_kw, num_proc):
    """Streaming changed how prepare reads, not what it writes: the prepared corpora of published
    studies keep their content (and so their runs' identities)."""
    import data_pipeline.build as build

    root = tmp_path / "corpus"
    root.mkdir()
    _write_words_corpus(root)
    monkeypatch.setattr(build, "CHUNK_CHARS", chunk_chars)
    corpus = CorpusConfig(source="text", paths=[str(root)], **corpus_kw)
    prep = prepare(corpus, TokenizerConfig(**tokenizer_kw), tmp_path / "cache", num_proc=num_proc, progress=False)
    if case == "shards":
        assert len(prep.manifest["splits"]["train"]["shards"]) > 5
    assert _digest(prep.path) == IN_MEMORY_DIGESTS[case]


def test_a_different_draw_is_detected_by_the_digest(tmp_path):
    """Negative control: the digest sees a one-line change of the tokenizer's sample."""
    root = tmp_path / "corpus"
    root.mkdir()
    _write_words_corpus(root)
    corpus = CorpusConfig(source="text", paths=[str(root)])
    prep = prepare(corpus, TokenizerConfig(vocab_size=300, max_sentences=499), tmp_path / "cache", num_proc=1, progress=False)
    assert _digest(prep.path) != IN_MEMORY_DIGESTS["sampled"]


def test_the_streamed_sample_is_the_listed_one():
    texts = ["a\nbb\n\n   \nccc", "dd\n" * 50, "x" * 5000 + "\ne"]
    cfg = TokenizerConfig(vocab_size=300, max_sentences=7, max_sentence_length=4096)
    listed = sample_sentences(texts, cfg)
    total = sum(len(eligible_lines(t, cfg)) for t in texts)
    assert len(listed) == 7 and sample_sentences(iter(texts), cfg, total) == listed
    assert sample_sentences(texts, TokenizerConfig(vocab_size=300, max_sentences=1000)) == ["a", "bb", "ccc"] + ["dd"] * 50 + ["e"]


def test_inputs_that_change_between_passes_are_refused(tmp_path, monkeypatch):
    import data_pipeline.build as build
    import data_pipeline.sources as sources

    root = tmp_path / "corpus"
    root.mkdir()
    _write_words_corpus(root)
    corpus = CorpusConfig(source="text", paths=[str(root)])
    real, calls = sources.iter_documents, []

    def growing(c, stats=None):  # a second pass that finds one more document (a file was added)
        calls.append(1)
        yield from real(c, stats)
        if len(calls) > 1:
            yield sources.Document("late", "late text\n", None)

    monkeypatch.setattr(build.sources, "iter_documents", growing)
    with pytest.raises(DataError, match="changed while being prepared"):
        prepare(corpus, TokenizerConfig(vocab_size=300), tmp_path / "cache", num_proc=1, progress=False)
    assert not any((tmp_path / "cache").glob("*/manifest.json"))


def test_no_more_tokenizer_processes_than_chunks(tmp_path, monkeypatch):
    """A small corpus (one train and one val chunk: every test study, the demo's) starts two
    tokenizer processes however many CPUs are offered, not one per CPU. The real pool runs;
    the wrapper around multiprocessing's spawn context only records its size."""
    import data_pipeline.build as build

    real, sizes = build.mp.get_context, []

    class Recording:
        def __init__(self, method):
            self.ctx = real(method)

        def Pool(self, processes, *args):  # noqa: N802 - multiprocessing's name
            sizes.append(processes)
            return self.ctx.Pool(processes, *args)

    monkeypatch.setattr(build.mp, "get_context", Recording)
    prep = prepare(CorpusConfig(max_documents=20), TokenizerConfig(vocab_size=512), tmp_path, num_proc=8, progress=False)
    assert [len(prep.manifest["splits"][sp]["shards"]) for sp in ("train", "val")] == [1, 1]
    assert sizes == [2]
