"""What `validate` and `run` refuse about a corpus's files before anything is prepared
(``data_pipeline.check``): no text, binary content, a vocabulary the text cannot fill; each
with a control that passes, and the vocabulary bound on a corpus whose answer is counted by hand."""

import shutil

import pytest
from typer.testing import CliRunner

from data_pipeline import CorpusConfig, TokenizerConfig
from data_pipeline.check import corpus_problems
from orchestrator.cli import app

SPEC = (
    "name: s\ncorpus: {{source: text, paths: [{paths}]}}\ntokenizer: {{vocab_size: {vocab}}}\n"
    "scales: [cpu-xs]\nvariants: [standard]\nbudget: {{tokens: 40960, max_epochs: 1000}}\n"
)


def _problems(folder, vocab=16, kind="bpe"):
    return corpus_problems(CorpusConfig(source="text", paths=[str(folder)]), TokenizerConfig(vocab_size=vocab, kind=kind))


def test_the_vocabulary_bound_is_counted_exactly(tmp_path):
    # "abc abd\n": 6 characters (a b c d, space, newline), words abc and abd. BPE: at most
    # 6 + 2 + 2 = 10 pieces; unigram: every substring of each word, 6 + 6 + 6 = 18.
    (tmp_path / "t.txt").write_text("abc abd\n")
    assert _problems(tmp_path, vocab=16, kind="bpe") == [
        ("tokenizer.vocab_size", "16 pieces cannot be filled from corpus (8 characters): a bpe vocabulary of it holds at most 10")
    ]
    assert _problems(tmp_path, vocab=18, kind="unigram") == []  # the bound itself fits
    assert _problems(tmp_path, vocab=19, kind="unigram")[0][1].endswith("a unigram vocabulary of it holds at most 18")


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
    assert _problems(tmp_path / "ok", vocab=256) == []


def test_validate_and_run_refuse_what_cannot_train_and_validate_passes_what_can(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "a.txt").write_text("the cat sat on the mat\n" * 50)
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.format(paths="small", vocab=65536))
    for cmd in ("validate", "run"):
        res = CliRunner().invoke(app, [cmd, str(spec)])
        assert res.exit_code == 2, res.output
        assert "tokenizer.vocab_size: 65,536 pieces cannot be filled from corpus (1,150 characters)" in " ".join(res.output.split())
    assert not (tmp_path / "runs").exists()
    spec.write_text(SPEC.format(paths="small", vocab=16))
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0 and "ok (s:" in res.output, res.output


@pytest.mark.parametrize("paths", ["s3://bucket/corpus", "gs://b/x/*.txt"])
def test_remote_paths_are_left_to_where_the_study_runs(paths):
    assert corpus_problems(CorpusConfig(source="text", paths=[paths]), TokenizerConfig()) == []
