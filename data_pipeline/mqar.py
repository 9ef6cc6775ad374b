"""Synthetic multi-query associative recall (MQAR), laid out as Zoology's `multiquery_ar`.

Source: Arora, Eyuboglu et al. 2023, "Zoology: Measuring and improving recall in efficient
language models", generator HazyResearch/zoology `zoology/data/multiquery_ar.py` with its
defaults num_passes=1, random_non_queries=True. An example of L = seq_len + 1 tokens is

    k_1 v_1 ... k_D v_D  |  query region: S = (seq_len - 2D) // 2 two-token slots

Keys are D distinct ids from [1, V/2) and values D distinct ids from [V/2, V), both drawn without
replacement per example. Pair i's key is queried once, at slot s_i (the i-th of D slots drawn
without replacement with p(s) ~ (s+1)^(power_a - 1): power-law gaps, most queries close to the
pairs): the key sits at position q_i = 2D + 2 s_i and its value is the *label* of q_i; the value is
not in the input there. Every other position, the one after each query key included, holds a
filler drawn uniformly from [0, V). So with x = ids[:-1], y = labels[1:] a model is scored only on
predicting each value from its queried key (y[q_i] = v_i, IGNORE_INDEX elsewhere).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import DataError

IGNORE_INDEX = -100  # torch cross_entropy's default: a label equal to it is not scored
# Part of an mqar corpus's content hash (sources.fingerprint): bump when the examples change.
# 2: Zoology's filler after each query key (the value is only a label), distinct values.
GENERATOR_VERSION = 2
_CHUNK = 1 << 22  # uniform draws per chunk in _distinct: bounds its memory at ~64 MB


def check_params(vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float) -> None:
    """Raise DataError naming the field unless an example can be laid out (Zoology's up-front
    checks, as errors that also hold under ``python -O``): num_kv_pairs >= 1 distinct keys fit in
    [1, vocab_size // 2) (so the values, a larger range, fit too); seq_len >= 4 * num_kv_pairs
    (the pairs plus one query slot per key); power_a finite and > 0."""
    d = num_kv_pairs
    if d < 1:
        raise DataError(f"mqar: num_kv_pairs={d} must be >= 1")
    if d > vocab_size // 2 - 1:
        raise DataError(
            f"mqar: num_kv_pairs={d} needs vocab_size >= {2 * d + 2} (distinct keys from [1, vocab_size/2)), got vocab_size={vocab_size}"
        )
    if seq_len < 4 * d:
        raise DataError(
            f"mqar: seq_len={seq_len} too short for num_kv_pairs={d}: needs seq_len >= "
            f"4 * num_kv_pairs = {4 * d} (the pairs plus one query slot per key)"
        )
    if not (math.isfinite(power_a) and power_a > 0):
        raise DataError(f"mqar: power_a={power_a} must be a finite number > 0")


def _distinct(rng: np.random.Generator, n: int, lo: int, hi: int, k: int) -> np.ndarray:
    """int64 [n, k]: per row, a uniformly random ordered k-subset of [lo, hi) (Zoology's per-row
    choice(replace=False), vectorised: the indices of the k smallest of hi - lo uniform draws, in
    increasing order of the draws). Rows are drawn in chunks so memory stays bounded."""
    m = hi - lo
    out = np.empty((n, k), dtype=np.int64)
    rows = max(1, _CHUNK // m)
    for a in range(0, n, rows):
        r = rng.random((min(rows, n - a), m))
        part = np.argpartition(r, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(r, part, axis=1), axis=1)
        out[a : a + len(r)] = np.take_along_axis(part, order, axis=1) + lo
    return out


def _query_slots(rng: np.random.Generator, n: int, n_slots: int, k: int, power_a: float) -> np.ndarray:
    """int64 [n, k]: k slots of [0, n_slots) per row drawn without replacement with
    p(s) ~ (s+1)^(power_a - 1); column i is the i-th draw (Gumbel top-k, which has the law of
    sequential draws without replacement, i.e. of numpy's choice(replace=False, p=p))."""
    log_p = (power_a - 1) * np.log(np.arange(1, n_slots + 1, dtype=np.float64))
    return np.argsort(-(log_p + rng.gumbel(size=(n, n_slots))), axis=1)[:, :k]


def generate(
    n: int, vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """n MQAR examples (layout in the module docstring).

    Returns (ids int64 [n, seq_len + 1], labels int64 [n, seq_len + 1]): the model reads
    ids[:, :-1] and is scored on labels[:, 1:], which is IGNORE_INDEX except at the query keys.
    Deterministic given `rng`'s state. Raises DataError naming the field for parameters an example
    cannot be laid out with (check_params) or n < 1.
    """
    if n < 1:
        raise DataError(f"mqar: {n} examples requested; num_train_examples and num_val_examples must be >= 1")
    check_params(vocab_size, seq_len, num_kv_pairs, power_a)
    d, half = num_kv_pairs, vocab_size // 2
    ids = rng.integers(0, vocab_size, size=(n, seq_len + 1))  # the filler, as Zoology's randint(V)
    keys = _distinct(rng, n, 1, half, d)
    values = _distinct(rng, n, half, vocab_size, d)
    ids[:, 0 : 2 * d : 2] = keys
    ids[:, 1 : 2 * d : 2] = values
    key_pos = 2 * d + 2 * _query_slots(rng, n, (seq_len - 2 * d) // 2, d, power_a)
    rows = np.arange(n)[:, None]
    ids[rows, key_pos] = keys  # pair i is queried at its i-th drawn slot, as in Zoology
    labels = np.full_like(ids, IGNORE_INDEX)
    labels[rows, key_pos + 1] = values
    return ids, labels
