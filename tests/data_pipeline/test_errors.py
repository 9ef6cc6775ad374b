"""Every bad input gets a DataError naming its source, and nothing half-written is left behind."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipeline import CorpusConfig, DataError, TokenizerConfig, TokenLoader, prepare
from data_pipeline.cli_support import prepare_from_args

TOK = TokenizerConfig(vocab_size=300, byte_fallback=False)


def _prepare_fails(corpus, tmp_path, match, tokenizer=TOK):
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=match):
        prepare(corpus, tokenizer, cache, num_proc=1, progress=False)
    assert not cache.exists() or os.listdir(cache) == []  # nothing half-written


def test_empty_source(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n\n")
    _prepare_fails(
        CorpusConfig(source="text", paths=[str(tmp_path / "empty.txt")]), tmp_path, r"source 'text' \(.*empty.txt\): no documents"
    )


def test_no_matching_files(tmp_path):
    _prepare_fails(CorpusConfig(source="text", paths=[str(tmp_path / "*.md")]), tmp_path, r"source 'text'.*no files match")
    _prepare_fails(
        CorpusConfig(source="jsonl", paths=[str(tmp_path / "missing.jsonl")]), tmp_path, r"source 'jsonl'.*missing.jsonl does not exist"
    )
    # there, but no file or folder to read (was called missing)
    _prepare_fails(CorpusConfig(source="text", paths=["/dev/null"]), tmp_path, r"/dev/null is neither a file nor a folder")


def test_missing_column_parquet(tmp_path):
    pq.write_table(pa.table({"page": ["a b c"] * 5}), tmp_path / "wiki.parquet")
    _prepare_fails(
        CorpusConfig(source="parquet", paths=[str(tmp_path / "wiki.parquet")]),
        tmp_path,
        r"source 'parquet'.*wiki.parquet has no column 'text' \(columns: \['page'\]\)",
    )


def test_missing_column_and_bad_json_jsonl(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    _prepare_fails(CorpusConfig(source="jsonl", paths=[str(tmp_path / "a.jsonl")]), tmp_path, r"a.jsonl line 1 has no column 'text'")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "fine"}) + "\n{not json\n")
    _prepare_fails(CorpusConfig(source="jsonl", paths=[str(tmp_path / "b.jsonl")]), tmp_path, r"b.jsonl line 2 is not valid JSON")


def test_not_a_parquet_file(tmp_path):
    (tmp_path / "x.parquet").write_text("hello")
    _prepare_fails(
        CorpusConfig(source="parquet", paths=[str(tmp_path / "x.parquet")]), tmp_path, r"x.parquet is not a readable Parquet file"
    )


def test_vocab_larger_than_corpus_supports(tmp_path):
    for i in range(4):
        (tmp_path / f"{i}.txt").write_text(f"tiny corpus number {i}\n")
    _prepare_fails(
        CorpusConfig(source="text", paths=[str(tmp_path / "*.txt")]),
        tmp_path,
        r"source 'text'.*vocab_size=4096 is larger than the corpus supports",
        tokenizer=TokenizerConfig(vocab_size=4096, byte_fallback=False),
    )


def test_corpus_smaller_than_one_window(tmp_path):
    for i in range(5):
        (tmp_path / f"{i}.txt").write_text(f"short document number {i} with a few words\n")
    tok = TokenizerConfig(vocab_size=40, byte_fallback=False)
    prep = prepare(CorpusConfig(source="text", paths=[str(tmp_path / "*.txt")]), tok, tmp_path / "cache", num_proc=1, progress=False)
    val_tokens = prep.manifest["splits"]["val"]["tokens"]
    with pytest.raises(DataError, match=rf"text data at .*split 'val'.*{val_tokens} tokens is smaller than one window"):
        TokenLoader(prep.path, "val", seq_len=val_tokens, global_batch=1, seed=0)
    TokenLoader(prep.path, "val", seq_len=val_tokens - 1, global_batch=1, seed=0)  # exactly one window fits


def test_loader_on_unprepared_directory(tmp_path):
    with pytest.raises(DataError, match="not a prepared data directory"):
        TokenLoader(str(tmp_path), "train", 8, 1, 0)


def test_cli_support_errors(tmp_path):
    with pytest.raises(DataError, match="unknown option 'vocab'"):
        prepare_from_args("text", str(tmp_path), str(tmp_path / "out"), vocab=10)
    with pytest.raises(DataError, match="val_fraction"):
        prepare_from_args("text", str(tmp_path), str(tmp_path / "out"), val_fraction=2.0)
    with pytest.raises(DataError, match="source 'text'.*no files match"):
        prepare_from_args("text", str(tmp_path / "none" / "*.txt"), str(tmp_path / "out"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "b.dat").write_bytes(bytes(range(256)) * 8)  # what validate refuses, prepare refuses
    with pytest.raises(DataError, match=r"^--path: source 'text' \(.*bin\): .* binary or undecodable"):
        prepare_from_args("text", str(tmp_path / "bin"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_cli_support_builds_configs(tmp_path):
    (tmp_path / "docs").mkdir()
    from data_pipeline.sources import load_documents

    for i, d in enumerate(load_documents(CorpusConfig(max_documents=6))):
        (tmp_path / "docs" / f"{i}.txt").write_text(d.text)
    prep = prepare_from_args(
        "text",
        str(tmp_path / "docs"),
        str(tmp_path / "out"),
        vocab_size=300,
        tokenizer_kind="unigram",
        byte_fallback=False,
        num_proc=1,
        progress=False,
        max_documents=None,
    )
    assert prep.path.startswith(str(tmp_path / "out")) and prep.vocab_size == 300
    assert prep.manifest["tokenizer"]["config"]["kind"] == "unigram"
    m = prepare_from_args("mqar", None, str(tmp_path / "out"), preset="easy", num_train_examples=50, num_val_examples=10, progress=False)
    assert m.manifest["mqar"]["seq_len"] == 64 and m.manifest["splits"]["train"]["documents"] == 50
