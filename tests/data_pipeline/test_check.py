"""What `validate` and `run` refuse about a corpus's files before anything is prepared
(``data_pipeline.check``): no text, binary content, a vocabulary the text cannot fill; each
with a control that passes, and the vocabulary bound on a corpus whose answer is counted by hand."""

import shutil

import pytest
from typer.testing import CliRunner

from data_pipeline import CorpusConfig, TokenizerConfig
from data_pipeline.check import corpus_problems
from data_pipeline.errors import DataError
from data_pipeline.tokenizer import train_tokenizer
from orchestrator.cli import app

SPEC = (
    "name: s\ncorpus: {{source: text, paths: [{paths}]}}\ntokenizer: {{vocab_size: {vocab}}}\n"
    "scales: [cpu-xs]\nvariants: [standard]\nbudget: {{tokens: 40960, max_epochs: 1000}}\n"
)


def _problems(folder, vocab=16, kind="bpe", byte_fallback=True, **corpus):
    cfg = CorpusConfig(source="text", paths=[str(folder)], **corpus)
    return corpus_problems(cfg, TokenizerConfig(vocab_size=vocab, kind=kind, byte_fallback=byte_fallback))


def test_the_vocabulary_bounds_counted_by_hand(tmp_path):
    # "abc abd": 5 distinct characters (a b c d, space); segments "abc" and " abd" (whitespace goes
    # with the text after it), 6 + 10 distinct substrings at most; 5 fixed pieces, 256 more with
    # byte fallback. So 5 + 5 = 10 pieces at least and 5 + 16 = 21 at most without it.
    (tmp_path / "t.txt").write_text("abc abd\n")
    assert _problems(tmp_path, vocab=22, byte_fallback=False) == [
        (
            "tokenizer.vocab_size",
            "22 pieces cannot be filled from corpus.paths (8 characters): its text holds at most 21 "
            "(its segments' distinct substrings and 5 fixed pieces)",
        )
    ]
    assert _problems(tmp_path, vocab=21, byte_fallback=False) == [] == _problems(tmp_path, vocab=16, byte_fallback=False)
    assert _problems(tmp_path, vocab=265) == [
        ("tokenizer.vocab_size", "265 pieces are fewer than corpus.paths (8 characters) needs: 5 distinct characters and 261 fixed pieces")
    ]
    assert _problems(tmp_path, vocab=266) == [] == _problems(tmp_path, vocab=277, kind="unigram")
    assert _problems(tmp_path, vocab=278)[0][1].startswith("278 pieces cannot be filled")


def test_the_lower_bound_is_sentencepieces_own_and_the_upper_never_refuses_what_trains(tmp_path):
    """Against the real trainer: the fewest pieces it accepts is the lower bound exactly (with and
    without byte fallback); the most it fills is within the upper bound."""
    text = "the cat sat on the mat\nabc abd\n" * 200
    (tmp_path / "t.txt").write_text(text)
    for byte_fallback, need in ((True, 261 + 12), (False, 5 + 12)):  # 12 characters: a-e h m n o s t, space
        cfg = TokenizerConfig(vocab_size=need, byte_fallback=byte_fallback)
        assert _problems(tmp_path, vocab=need, byte_fallback=byte_fallback) == []
        assert train_tokenizer([text], cfg, "t")  # trains at the bound
        assert _problems(tmp_path, vocab=need - 1, byte_fallback=byte_fallback)[0][1].startswith(f"{need - 1} pieces are fewer")
        with pytest.raises(DataError, match="too small"):
            train_tokenizer([text], cfg.model_copy(update={"vocab_size": need - 1}), "t")
    assert train_tokenizer([text], TokenizerConfig(vocab_size=300), "t")  # trains 300 pieces: not refused
    assert _problems(tmp_path, vocab=300) == []


def test_lines_too_long_to_train_on_and_val_paths_are_named(tmp_path):
    (tmp_path / "long").mkdir()
    (tmp_path / "long" / "a.txt").write_text("x" * 5000 + "\n")
    assert _problems(tmp_path / "long", vocab=300) == [
        ("corpus.paths", f"source 'text' ({tmp_path / 'long'}): no line of at most 4096 bytes to train the tokenizer on")
    ]
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.txt").write_text("plenty of words here to train on\n" * 20)
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "v.bin").write_bytes(bytes(range(256)) * 10)
    ((where, message),) = _problems(tmp_path / "ok", vocab=300, val_paths=[str(tmp_path / "v"), "s3://bucket/val"])
    assert where == "corpus.val_paths" and "binary or undecodable" in message  # the local one is read, the URI left


def test_binary_and_empty_corpora_are_refused_with_the_share_and_the_files(tmp_path):
    (tmp_path / "bin").mkdir()
    shutil.copy("/bin/true", tmp_path / "bin" / "prog")
    ((field, message),) = _problems(tmp_path / "bin")
    assert field == "corpus.paths" and "of its characters are binary or undecodable as UTF-8 (at most 1%), e.g. prog (" in message
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "e.txt").write_text("")
    assert _problems(tmp_path / "empty") == [("corpus.paths", f"source 'text' ({tmp_path / 'empty'}): no text (all 1 file(s) are empty)")]
    # the control: text with a stray undecodable byte (under 1%) and enough words passes
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.txt").write_bytes(" ".join(f"word{i}" for i in range(300)).encode() + b"\xff\n")
    assert _problems(tmp_path / "ok", vocab=300) == []


def test_validate_and_run_refuse_what_cannot_train_and_validate_passes_what_can(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "a.txt").write_text("the cat sat on the mat\n" * 50)
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.format(paths="small", vocab=65536))
    for cmd in ("validate", "run"):
        res = CliRunner().invoke(app, [cmd, str(spec)])
        assert res.exit_code == 2, res.output
        assert "tokenizer.vocab_size: 65,536 pieces cannot be filled from corpus.paths (1,150 characters)" in " ".join(res.output.split())
    assert not (tmp_path / "runs").exists()
    spec.write_text(SPEC.format(paths="small", vocab=300))
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0 and "ok (s:" in res.output, res.output


@pytest.mark.parametrize("paths", ["s3://bucket/corpus", "gs://b/x/*.txt"])
def test_remote_paths_are_left_to_where_the_study_runs(paths):
    assert corpus_problems(CorpusConfig(source="text", paths=[paths]), TokenizerConfig()) == []


def test_validate_lists_every_corpus_problem_not_the_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin").mkdir()
    shutil.copy("/bin/true", tmp_path / "bin" / "prog")
    spec = tmp_path / "m.yaml"
    spec.write_text(
        "name: m\ncorpora: {b: {source: text, paths: [bin]}, c: {source: text, paths: [gone]}}\n"
        "tokenizer: {vocab_size: 512}\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n"
    )
    res = CliRunner().invoke(app, ["validate", str(spec)])
    flat = " ".join(res.output.split())
    assert res.exit_code == 2 and "corpora.c.paths[0]: no file or folder matches 'gone'" in flat, res.output
    assert "corpora.b.paths: source 'text' (bin):" in flat and "binary or undecodable" in flat, res.output


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\x8f\x00garbage" * 200, "line 1 is not valid JSON"),
        (b'{"txt": "hello"}\n', "line 1 has no column 'text' (found ['txt'])"),
        (b"", "no documents"),
    ],
)
def test_a_jsonl_corpus_is_read_to_its_first_document_of_each_file(tmp_path, content, says):
    """Row sources are checked as prepare reads them: each file's first document parses and has
    the text column (a file of random bytes passed the gate before); a good file is the control."""
    (tmp_path / "good.jsonl").write_text('{"text": "a document"}\n')
    (tmp_path / "bad.jsonl").write_bytes(content)
    tok = TokenizerConfig(vocab_size=300)
    good = CorpusConfig(source="jsonl", paths=[str(tmp_path / "good.jsonl")])
    assert corpus_problems(good, tok) == []
    both = good.model_copy(update={"paths": [str(tmp_path / "good.jsonl"), str(tmp_path / "bad.jsonl")]})
    ((field, message),) = corpus_problems(both, tok)
    assert field == "corpus.paths" and says in message
