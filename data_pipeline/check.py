"""Whether a corpus's files can train a tokenizer and a model, checked where they stand before
anything is prepared: the paths exist and match files, the files hold text (not binary or
undecodable bytes), and the tokenizer's vocabulary fits the text.

Which sources: ``text`` (and ``text`` components of a ``mixture``), the files a user points at;
``paths`` and ``val_paths`` each checked and named. ``jsonl`` and ``parquet`` are checked for
existence only (their readers refuse malformed rows when preparing); ``stdlib``, ``hf`` and
``mqar`` are not user files. A path that is a URI (``s3://...``) is left to where the study runs.

The vocabulary, against the lines SentencePiece trains on (``data_pipeline.tokenizer``:
non-empty lines of at most ``max_sentence_length`` bytes), by two safe bounds that never refuse
what could train: at least its ``FIXED_PIECES`` (plus 256 byte pieces with ``byte_fallback``)
and, at ``character_coverage`` 1, one piece per distinct character; at most those fixed pieces
and every distinct substring of the whitespace-delimited segments it splits lines into (each
segment's ``L (L + 1) / 2``, counted until the bound passes the vocabulary, so a large corpus
is read once and stops early). Between the bounds, preparing decides.
"""

from __future__ import annotations

import dataclasses
import re

from data_pipeline.config import CorpusConfig, TokenizerConfig
from data_pipeline.errors import DataError
from data_pipeline.sources import DecodeStats, input_files, iter_documents, read_bytes
from data_pipeline.storage import is_uri
from data_pipeline.tokenizer import eligible_lines

__all__ = ["BINARY_SHARE_MAX", "FIXED_PIECES", "corpus_problems"]

BINARY_SHARE_MAX = 0.01  # share of a text corpus's characters that may be undecodable or NUL
FIXED_PIECES = 5  # <unk>, <s>, </s> and the user symbols "\n", "\t" (data_pipeline.tokenizer)
BYTE_PIECES = 256
SHOWN = 3  # files named in a binary-content problem
_SEGMENT = re.compile(r"\s*\S+|\s+")  # SentencePiece keeps whitespace with the text after it


@dataclasses.dataclass
class _Tally:
    """What one pass over a split's files found."""

    files: int = 0
    chars: int = 0
    bad: int = 0  # U+FFFD from undecodable bytes, and NUL characters
    worst: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (bad share, file id)
    lines: int = 0  # lines the tokenizer may train on
    alphabet: set[str] = dataclasses.field(default_factory=set)
    segments: set[str] = dataclasses.field(default_factory=set)
    most_pieces: int = 0  # the substring bound so far (without the fixed pieces)


def _tally(corpus: CorpusConfig, tokenizer: TokenizerConfig, enough: int) -> _Tally:
    """One pass over ``corpus``'s files; the piece bound stops growing past ``enough``."""
    t, decoding = _Tally(), DecodeStats()
    for f, _ in input_files(corpus):
        replaced = decoding.replaced_chars
        text = decoding.decode(read_bytes(f), f.id)  # as prepare decodes it, counting what it replaces
        bad = decoding.replaced_chars - replaced + text.count("\x00")
        t.files, t.chars, t.bad = t.files + 1, t.chars + len(text), t.bad + bad
        if bad:
            t.worst.append((bad / len(text), f.id))
        for line in eligible_lines(text, tokenizer):
            t.lines += 1
            t.alphabet.update(line)
            if t.most_pieces <= enough:
                for seg in _SEGMENT.findall(line):
                    if seg not in t.segments:
                        t.segments.add(seg)
                        t.most_pieces += len(seg) * (len(seg) + 1) // 2
    return t


def _local(paths: list[str]) -> list[str]:
    return [p for p in paths if not is_uri(p)]


def corpus_problems(corpus: CorpusConfig, tokenizer: TokenizerConfig, field: str = "corpus") -> list[tuple[str, str]]:
    """(spec field, message) for each reason ``corpus`` cannot train here; [] when none. Its
    local paths are read (URIs are left to where the study runs); ``field`` is the corpus's
    place in the spec (``corpus``, ``corpora.NAME``), the prefix of the fields named."""
    if corpus.source == "mixture":
        return [p for i, c in enumerate(corpus.components) for p in corpus_problems(c.corpus, tokenizer, f"{field}.components[{i}].corpus")]
    if corpus.source not in ("text", "jsonl", "parquet"):
        return []
    problems = []
    for name, paths in (("paths", _local(corpus.paths)), ("val_paths", _local(corpus.val_paths))):
        if paths:
            problems += _split_problems(_only_paths(corpus, paths), tokenizer, f"{field}.{name}", vocabulary=name == "paths")
    return problems


def _only_paths(corpus: CorpusConfig, paths: list[str]) -> CorpusConfig:
    """``corpus`` reading ``paths`` as its only (train) files."""
    return corpus.model_copy(update={"paths": paths, "val_paths": []})


def _split_problems(corpus: CorpusConfig, tokenizer: TokenizerConfig, field: str, vocabulary: bool) -> list[tuple[str, str]]:
    fixed = FIXED_PIECES + (BYTE_PIECES if tokenizer.byte_fallback else 0)
    try:
        if corpus.source != "text":  # jsonl, parquet: each file's first document (parses, has the column)
            empty = [f.id for f, _ in input_files(corpus) if next(iter_documents(_only_paths(corpus, [f.path])), None) is None]
            return [(field, f"{corpus.label()}: no document in {', '.join(empty[:SHOWN])}")] if empty else []
        t = _tally(corpus, tokenizer, tokenizer.vocab_size - fixed)
    except DataError as e:
        return [(field, str(e))]
    except OSError as e:
        return [(field, f"{e.filename or corpus.label()}: cannot be read ({e.strerror or e})")]
    if t.chars == 0:
        return [(field, f"{corpus.label()}: no text (all {t.files} file(s) are empty)")]
    if t.bad > BINARY_SHARE_MAX * t.chars:
        named = ", ".join(f"{fid} ({share:.0%})" for share, fid in sorted(t.worst, reverse=True)[:SHOWN])
        return [
            (
                field,
                f"{corpus.label()}: {t.bad / t.chars:.1%} of its characters are binary or undecodable as UTF-8 "
                f"(at most {BINARY_SHARE_MAX:.0%}), e.g. {named}",
            )
        ]
    if not vocabulary:
        return []
    if t.lines == 0:
        return [(field, f"{corpus.label()}: no line of at most {tokenizer.max_sentence_length} bytes to train the tokenizer on")]
    v, where = tokenizer.vocab_size, f"{field} ({t.chars:,} characters)"
    need = fixed + len(t.alphabet)
    if tokenizer.character_coverage == 1.0 and v < need:
        return [
            (
                "tokenizer.vocab_size",
                f"{v:,} pieces are fewer than {where} needs: {len(t.alphabet):,} distinct characters and {fixed} fixed pieces",
            )
        ]
    if v > fixed + t.most_pieces:
        return [
            (
                "tokenizer.vocab_size",
                f"{v:,} pieces cannot be filled from {where}: its text holds at most {fixed + t.most_pieces:,} "
                f"(its segments' distinct substrings and {fixed} fixed pieces)",
            )
        ]
    return []
