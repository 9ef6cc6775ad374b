"""The unigram baseline of a prepared corpus: the perplexity a model that ignores context gets.

Why: a language model's validation perplexity means little without the level it must get
below; a model that only learnt token frequencies reaches the unigram perplexity, so a
study's finals are read against it (``qkstudy.unigram_ppl.<corpus>`` in MLflow, the report's
"Unigram baseline"). It is cheap (one bincount per shard), so ``prepare`` stores it in the
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
    return perplexity_from_counts(token_counts(train_tokens, vocab_size, "train"), token_counts(val_tokens, vocab_size, "val"))


def token_counts(tokens: np.ndarray, vocab_size: int, name: str) -> np.ndarray:
    """int64 [vocab_size]: how often each id occurs in ``tokens`` (any shape, integer ids).

    Raises DataError: a non-integer array, or an id outside [0, vocab_size) (``name`` says
    which split)."""
    a = np.asarray(tokens).reshape(-1)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise DataError(f"unigram perplexity: {name} tokens must be integer ids, got dtype {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= vocab_size):
        raise DataError(
            f"unigram perplexity: {name} token ids span [{int(a.min())}, {int(a.max())}], outside the vocabulary [0, {vocab_size})"
        )
    return np.bincount(a, minlength=vocab_size).astype(np.int64)


def perplexity_from_counts(train_counts: np.ndarray, val_counts: np.ndarray) -> float:
    """``unigram_perplexity`` from per-id counts (int [V] each, ``token_counts``), so a corpus
    is counted shard by shard and never held as one array.

    Raises DataError: no val token."""
    n_val = int(val_counts.sum())
    if not n_val:
        raise DataError("unigram perplexity: the val split has no token to score")
    v = len(train_counts)
    log_p = np.log(train_counts + 1.0) - np.log(int(train_counts.sum()) + v)
    # sum over val tokens of ln p(t) = sum over ids of (val count of id) * ln p(id)
    return float(np.exp(-(val_counts.astype(np.float64) @ log_p) / n_val))


def split_counts(location: str, manifest: dict, split: str) -> np.ndarray:
    """``token_counts`` of the scored tokens (module docstring) of one split of a prepared
    directory, summed shard by shard (each memory-mapped when local)."""
    v = int(manifest["vocab_size"])
    total = np.zeros(v, dtype=np.int64)
    for s in manifest["splits"][split]["shards"]:
        t = storage.read_shard(location, s["file"])
        if manifest.get("layout") == "examples":
            labels = storage.flat_column(t, "labels")
            scored = labels[labels != IGNORE_INDEX]
        else:
            scored = storage.flat_column(t, "ids")
        total += token_counts(scored, v, split)
    return total


def prepared_unigram(location: str, manifest: dict) -> dict[str, Any]:
    """The manifest's ``unigram`` entry, counted from the shards at ``location``: ``val_ppl``
    (perplexity per token of the val split, ``unigram_perplexity``), ``val_tokens`` and
    ``train_tokens`` (scored tokens counted), ``vocab_size``, ``smoothing`` ("add-one").

    Raises DataError when the split has no scored token or an id lies beyond the vocabulary."""
    v = int(manifest["vocab_size"])
    try:
        train, val = split_counts(location, manifest, "train"), split_counts(location, manifest, "val")
        ppl = perplexity_from_counts(train, val)
    except DataError as e:
        raise DataError(f"prepared data at {location}: {e}") from None
    return {"val_ppl": ppl, "val_tokens": int(val.sum()), "train_tokens": int(train.sum()), "vocab_size": v, "smoothing": SMOOTHING}


def unigram_of(location: str, manifest: dict) -> dict[str, Any]:
    """``manifest["unigram"]`` when ``prepare`` stored it, else ``prepared_unigram`` (a
    directory prepared before the key existed)."""
    cached = manifest.get("unigram")
    return cached if cached else prepared_unigram(location, manifest)
