"""The unigram baseline of a prepared corpus: the perplexity a model that ignores context gets.

Why: a language model's validation perplexity means little without the level it must get
below; a model that only learnt token frequencies reaches the unigram perplexity, so a
study's finals are read against it (``qkstudy.unigram_ppl.<corpus>`` in MLflow, the report's
"Unigram baseline"). It is cheap (one bincount per split), so ``prepare`` stores it in the
manifest (key ``unigram``) and a directory prepared before that key existed is counted on
demand (``unigram_of``), never rewritten: a published directory is immutable.

Scored tokens: every token of a split for next-token text (layout ``stream``: each token is a
target once per epoch, bar the first), the labelled positions (``labels`` != -100) for MQAR
(layout ``examples``), since those are the only targets its perplexity scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import storage
from .errors import DataError
from .mqar import IGNORE_INDEX

SMOOTHING = "add-one"


def unigram_perplexity(train_tokens: np.ndarray, val_tokens: np.ndarray, vocab_size: int) -> float:
    """Perplexity per token of ``val_tokens`` under a unigram model fit on ``train_tokens``.

    The model is add-one (Laplace) smoothed over the whole vocabulary, so a token never seen
    in train keeps a finite probability:

        p(v) = (c_train(v) + 1) / (N_train + V),   v in [0, V)
        ppl  = exp(-(1 / N_val) * sum_{t in val} ln p(t))

    (Jurafsky & Martin, "Speech and Language Processing", 3rd ed., ch. 3: Laplace smoothing
    and perplexity.) A uniform train split over V ids gives ppl = V on any val split.

    Args:
        train_tokens: integer token ids, any shape (flattened), may be empty.
        val_tokens: integer token ids, any shape (flattened), at least one.
        vocab_size: V, the tokenizer's vocabulary; every id must lie in [0, V).

    Returns:
        The perplexity (per token; ln of it is the cross-entropy in nats/token), in [1, inf).

    Raises:
        DataError: V < 1, no val token, a non-integer array, or an id outside [0, V).
    """
    if vocab_size < 1:
        raise DataError(f"unigram perplexity: vocab_size must be >= 1, got {vocab_size}")
    train, val = np.asarray(train_tokens).reshape(-1), np.asarray(val_tokens).reshape(-1)
    for name, a in (("train", train), ("val", val)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise DataError(f"unigram perplexity: {name} tokens must be integer ids, got dtype {a.dtype}")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= vocab_size):
            raise DataError(
                f"unigram perplexity: {name} token ids span [{int(a.min())}, {int(a.max())}], outside the vocabulary [0, {vocab_size})"
            )
    if not val.size:
        raise DataError("unigram perplexity: the val split has no token to score")
    log_p = np.log(np.bincount(train, minlength=vocab_size) + 1.0) - np.log(train.size + vocab_size)
    # sum over val tokens of ln p(t) = sum over ids of (val count of id) * ln p(id): one bincount
    val_counts = np.bincount(val, minlength=vocab_size).astype(np.float64)
    return float(np.exp(-(val_counts @ log_p) / val.size))


def scored_tokens(location: str, manifest: dict, split: str) -> np.ndarray:
    """The scored token ids of one split of a prepared directory (module docstring), as one
    1-D integer array (memory-mapped for local text shards)."""
    shards = manifest["splits"][split]["shards"]
    tables = [storage.read_shard(location, s["file"]) for s in shards]
    ids = [storage.flat_column(t, "ids") for t in tables]
    if manifest.get("layout") == "examples":
        labels = np.concatenate([storage.flat_column(t, "labels") for t in tables])
        return labels[labels != IGNORE_INDEX]
    return ids[0] if len(ids) == 1 else np.concatenate(ids)


def prepared_unigram(location: str, manifest: dict) -> dict[str, Any]:
    """The manifest's ``unigram`` entry, counted from the shards at ``location``: ``val_ppl``
    (perplexity per token of the val split, ``unigram_perplexity``), ``val_tokens`` and
    ``train_tokens`` (scored tokens counted), ``vocab_size``, ``smoothing`` ("add-one").

    Raises DataError when the split has no scored token or an id lies beyond the vocabulary."""
    train, val = scored_tokens(location, manifest, "train"), scored_tokens(location, manifest, "val")
    v = int(manifest["vocab_size"])
    try:
        ppl = unigram_perplexity(train, val, v)
    except DataError as e:
        raise DataError(f"prepared data at {location}: {e}") from None
    return {"val_ppl": ppl, "val_tokens": int(val.size), "train_tokens": int(train.size), "vocab_size": v, "smoothing": SMOOTHING}


def unigram_of(location: str, manifest: dict) -> dict[str, Any]:
    """``manifest["unigram"]`` when ``prepare`` stored it, else ``prepared_unigram`` (a
    directory prepared before the key existed)."""
    cached = manifest.get("unigram")
    return cached if cached else prepared_unigram(location, manifest)
