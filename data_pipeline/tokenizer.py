"""SentencePiece tokenizer training on a deterministic sample of the train split.

Normalisation is the identity and whitespace is kept (``remove_extra_whitespaces=False``,
no dummy prefix, whitespace-only pieces allowed) so that decode(encode(text)) == text for code
as well as prose; newline and tab are user-defined pieces because SentencePiece trains on lines.
With ``byte_fallback`` unseen characters become byte pieces instead of ``<unk>``.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable

import numpy as np
import sentencepiece as spm

from .config import TokenizerConfig
from .errors import DataError

EOD_PIECE = "</s>"


def eligible_lines(text: str, cfg: TokenizerConfig) -> list[str]:
    """The lines of ``text`` the tokenizer may train on: non-empty, at most ``max_sentence_length`` bytes."""
    return [ln for ln in text.split("\n") if ln.strip() and len(ln.encode("utf-8")) <= cfg.max_sentence_length]


def sample_indices(total: int, cfg: TokenizerConfig) -> np.ndarray | None:
    """Which of ``total`` eligible lines (numbered in corpus order) the sample keeps: sorted
    indices of a fixed-seed draw of ``max_sentences``, or None when all are kept. Depends on
    the count only, so a streaming pass that knows the count draws what a list would."""
    if total <= cfg.max_sentences:
        return None
    return np.sort(np.random.default_rng(0).choice(total, cfg.max_sentences, replace=False))


def sample_sentences(texts: Iterable[str], cfg: TokenizerConfig, total: int | None = None) -> list[str]:
    """The eligible lines of ``texts`` (``eligible_lines``), sampled down to ``max_sentences``
    with a fixed-seed draw so the tokenizer is reproducible. ``total``: the number of eligible
    lines in ``texts`` when known (a streamed corpus, counted in an earlier pass): then
    ``texts`` is read once and only the kept lines are held; else ``texts`` is a sequence."""
    if total is None:
        texts = list(texts)
        total = sum(len(eligible_lines(t, cfg)) for t in texts)
    keep = sample_indices(total, cfg)
    out: list[str] = []
    k, next_i = 0, 0
    for t in texts:
        for ln in eligible_lines(t, cfg):
            if keep is None:
                out.append(ln)
            elif next_i < len(keep) and keep[next_i] == k:
                out.append(ln)
                next_i += 1
            k += 1
    return out


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig, label: str, num_threads: int = 1, total_lines: int | None = None) -> bytes:
    """Train a SentencePiece model on a sample of `texts` (``sample_sentences``; ``total_lines``
    as its ``total``); returns the serialized model proto.

    Raises DataError naming `label` (the source) when there is nothing to train on or the vocab
    is larger than the sample supports.
    """
    sentences = sample_sentences(texts, cfg, total_lines)
    if not sentences:
        raise DataError(f"{label}: no text lines to train the tokenizer on")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            model_type=cfg.kind,
            vocab_size=cfg.vocab_size,
            byte_fallback=cfg.byte_fallback,
            character_coverage=cfg.character_coverage,
            max_sentence_length=cfg.max_sentence_length,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            user_defined_symbols=["\n", "\t"],
            input_sentence_size=0,
            num_threads=max(1, num_threads),
            minloglevel=2,
        )
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        if "too high" in msg:
            raise DataError(f"{label}: tokenizer vocab_size={cfg.vocab_size} is larger than the corpus supports ({msg})") from None
        if "required_chars" in msg:
            raise DataError(
                f"{label}: tokenizer vocab_size={cfg.vocab_size} is too small for the corpus's "
                f"characters (raise vocab_size or lower character_coverage; {msg})"
            ) from None
        raise DataError(f"{label}: tokenizer training failed ({msg})") from None
    proto = _canonical(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=proto)
    if sp.get_piece_size() != cfg.vocab_size:
        raise DataError(
            f"{label}: tokenizer vocab_size={cfg.vocab_size} is larger than the corpus supports (trained only {sp.get_piece_size()} pieces)"
        )
    return proto


def _canonical(proto: bytes) -> bytes:
    """The model with machine-dependent trainer settings reset, so its hash depends on the pieces
    and options only (training with 1 or 16 threads yields the same pieces, not the same bytes)."""
    from sentencepiece import sentencepiece_model_pb2

    m = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf, no stubs
    m.ParseFromString(proto)
    m.trainer_spec.num_threads = 1
    return m.SerializeToString(deterministic=True)


def model_hash(proto: bytes) -> str:
    """sha256 of the serialized model: enters the manifest and the run identity."""
    return hashlib.sha256(proto).hexdigest()


def load_tokenizer(path: str) -> spm.SentencePieceProcessor:
    """Load a tokenizer written by prepare (local path or pyarrow URI)."""
    from .storage import resolve

    fs, p = resolve(path)
    with fs.open_input_stream(p) as f:
        return spm.SentencePieceProcessor(model_proto=f.read())
