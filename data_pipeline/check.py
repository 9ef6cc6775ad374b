"""Whether a corpus's files can train a tokenizer and a model, checked where they stand before
anything is prepared: the paths exist and match files, the files hold text (not binary or
undecodable bytes), and there is enough of it for the tokenizer's vocabulary.

Which sources: ``text`` (and ``text`` components of a ``mixture``), the files a user points at.
``jsonl`` and ``parquet`` are checked for existence only (their readers refuse malformed rows
when preparing); ``stdlib``, ``hf`` and ``mqar`` are not user files. Paths that are URIs
(``s3://...``) are skipped: they are read where the study runs.

The vocabulary bound is exact, not a heuristic: sentencepiece splits text into pieces within
whitespace-separated words, so a BPE vocabulary holds at most the distinct characters plus
``len(w) - 1`` merges per distinct word ``w``, and a unigram vocabulary at most the distinct
substrings of the distinct words (``len(w) (len(w) + 1) / 2`` each). A vocabulary over it can
never be filled (sentencepiece refuses it when preparing). It is computed only for corpora
smaller than ``SMALL_CORPUS_BYTES_PER_PIECE`` bytes per requested piece; a larger corpus is
taken to support its vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from data_pipeline.config import CorpusConfig, TokenizerConfig
from data_pipeline.errors import DataError
from data_pipeline.sources import input_files, read_bytes
from data_pipeline.storage import is_uri

__all__ = ["BINARY_SHARE_MAX", "corpus_problems"]

BINARY_SHARE_MAX = 0.01  # share of a text corpus's characters that may be undecodable or NUL
SMALL_CORPUS_BYTES_PER_PIECE = 64
SHOWN = 3  # files named in a binary-content problem


@dataclass(frozen=True)
class _FileText:
    id: str
    chars: int
    bad: int  # U+FFFD from undecodable bytes, and NUL characters
    text: str


def _texts(corpus: CorpusConfig) -> Iterator[_FileText]:
    for f, _ in input_files(corpus):
        data = read_bytes(f)
        text = data.decode("utf-8", errors="replace")
        bad = text.count("\ufffd") - data.count("\ufffd".encode()) + text.count("\x00")
        yield _FileText(f.id, len(text), bad, text)


def _vocabulary_bound(texts: list[str], kind: str) -> int:
    """The most pieces a ``kind`` ("bpe" or "unigram") vocabulary can hold for ``texts``."""
    chars: set[str] = set()
    words: set[str] = set()
    for t in texts:
        chars.update(t)
        words.update(t.split())
    if kind == "unigram":
        return len(chars) + sum(len(w) * (len(w) + 1) // 2 for w in words)
    return len(chars) + sum(len(w) - 1 for w in words)


def corpus_problems(corpus: CorpusConfig, tokenizer: TokenizerConfig, field: str = "corpus") -> list[tuple[str, str]]:
    """(spec field, message) for each reason ``corpus`` cannot train here; [] when none (or
    when its paths are URIs, checked where the study runs). ``field`` is the corpus's place in
    the spec (``corpus``, ``corpora.NAME``), the prefix of the fields named."""
    if corpus.source == "mixture":
        return [p for i, c in enumerate(corpus.components) for p in corpus_problems(c.corpus, tokenizer, f"{field}.components[{i}].corpus")]
    if corpus.source not in ("text", "jsonl", "parquet") or any(is_uri(p) for p in [*corpus.paths, *corpus.val_paths]):
        return []
    paths = f"{field}.paths"
    try:
        if corpus.source != "text":
            input_files(corpus)  # existence: DataError when a path matches nothing
            return []
        files = list(_texts(corpus))
    except DataError as e:
        return [(paths, str(e))]
    except OSError as e:
        return [(paths, f"{e.filename or corpus.label()}: cannot be read ({e.strerror or e})")]
    chars = sum(f.chars for f in files)
    if chars == 0:
        return [(paths, f"{corpus.label()}: no text (all {len(files)} file(s) are empty)")]
    bad = sum(f.bad for f in files)
    if bad > BINARY_SHARE_MAX * chars:
        worst = sorted((f for f in files if f.bad), key=lambda f: -f.bad / max(f.chars, 1))[:SHOWN]
        named = ", ".join(f"{f.id} ({f.bad / max(f.chars, 1):.0%})" for f in worst)
        return [
            (
                paths,
                f"{corpus.label()}: {bad / chars:.1%} of its characters are binary or undecodable as UTF-8 "
                f"(at most {BINARY_SHARE_MAX:.0%}), e.g. {named}",
            )
        ]
    if chars < SMALL_CORPUS_BYTES_PER_PIECE * tokenizer.vocab_size:
        bound = _vocabulary_bound([f.text for f in files], tokenizer.kind)
        if tokenizer.vocab_size > bound:
            return [
                (
                    "tokenizer.vocab_size",
                    f"{tokenizer.vocab_size:,} pieces cannot be filled from {field} ({chars:,} characters): "
                    f"a {tokenizer.kind} vocabulary of it holds at most {bound:,}",
                )
            ]
    return []
