import json
import os

import numpy as np
import pyarrow as pa

from data_pipeline import CorpusConfig, PreparedData, TokenizerConfig, prepare
from data_pipeline.build import split_documents
from data_pipeline.sources import load_documents
from data_pipeline.tokenizer import load_tokenizer


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
