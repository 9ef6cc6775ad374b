"""Synthetic multi-query associative recall (MQAR), after Zoology's `multiquery_ar` generator.

An example of length L = seq_len + 1 is: D key-value pairs (k_1 v_1 ... k_D v_D), then a query
region of (L - 2D) // 2 two-token slots. Each key is queried once, in a random order, at a slot
drawn with p(slot s) ~ (s+1)^(power_a - 1) (power-law gaps: most queries close to the pairs),
followed by its value; the other positions hold random tokens. Keys come from [1, V/2) and are
distinct within an example, values from [V/2, V); id 0 is never emitted. ``target_mask`` marks
the value tokens of the query region: the only positions a model is scored on.
"""

from __future__ import annotations

import numpy as np


def generate(n: int, vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Returns (ids int64 [n, seq_len + 1], target_mask uint8 [n, seq_len + 1])."""
    length, d, half = seq_len + 1, num_kv_pairs, vocab_size // 2
    n_slots = (length - 2 * d) // 2
    # Zoology's invariants, asserted up front.
    assert 1 <= d <= half - 1, "need distinct keys in [1, vocab/2)"
    assert n_slots >= d, "query region must fit one slot per key"
    ids = rng.integers(1, vocab_size, size=(n, length))
    mask = np.zeros((n, length), dtype=np.uint8)
    keys = np.argsort(rng.random((n, half - 1)), axis=1)[:, :d] + 1  # distinct keys per row
    values = rng.integers(half, vocab_size, size=(n, d))
    ids[:, 0:2 * d:2] = keys
    ids[:, 1:2 * d:2] = values
    p = np.arange(1, n_slots + 1, dtype=np.float64) ** (power_a - 1)
    p /= p.sum()
    rows = np.arange(n)[:, None]
    # Gumbel top-k: d slots per row without replacement with probability p.
    slots = np.argsort(-(np.log(p) + rng.gumbel(size=(n, n_slots))), axis=1)[:, :d]
    order = np.argsort(rng.random((n, d)), axis=1)
    key_pos = 2 * d + 2 * slots
    ids[rows, key_pos] = np.take_along_axis(keys, order, axis=1)
    ids[rows, key_pos + 1] = np.take_along_axis(values, order, axis=1)
    mask[rows, key_pos + 1] = 1
    return ids, mask
