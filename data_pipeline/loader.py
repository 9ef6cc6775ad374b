"""TokenLoader: deterministic, resumable, rank-aware windows over prepared token shards.

Windows: a split's token stream (shards concatenated in manifest order) is cut into
``num_windows = (tokens - 1) // seq_len`` windows; window w is tokens [w*seq_len, w*seq_len + seq_len + 1)
(consecutive windows share one boundary token, so every token is a target exactly once per epoch).
For mqar (layout "examples") each example is one window and seq_len must equal the example's.

Order: global sample g = step * global_batch + j (j < global_batch) reads window
perm_e[g mod num_windows] with e = g // num_windows and perm_e = a permutation drawn from
numpy's default_rng((seed, e)). Rank r of W takes j in [r*b, (r+1)*b), b = global_batch / W, so the
rank slices concatenate to the same global batch for every W that divides global_batch, ranks never
overlap within a step, and a run restarted at step k reads exactly what it would have read.

Evaluation: one fixed order of the val windows, independent of seed, step and world size (the
base-2 van der Corput order: every prefix is spread evenly over the split). A run's eval subset of
m windows is the first m of that order, so a larger final pass contains the curve's windows, and
it is split over ranks (rank r of W takes every W-th window, padded to equal length with unscored
rows) so that the union over ranks is the same set for every W.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from . import storage
from .errors import DataError
from .mqar import IGNORE_INDEX


class TokenLoader:
    """Batches of int64 token windows from a prepared directory.

    Args: path (PreparedData.path, local dir or URI), split ("train" | "val"), seq_len (tokens per
    model input), global_batch (windows per optimizer step, all ranks), seed.
    Raises DataError when the directory is not prepared, or the split is smaller than one window.
    """

    def __init__(self, path: str, split: str, seq_len: int, global_batch: int, seed: int):
        if split not in ("train", "val"):
            raise DataError(f"{path}: split must be 'train' or 'val', got {split!r}")
        if seq_len < 1 or global_batch < 1:
            raise DataError(f"{path}: seq_len and global_batch must be >= 1 (got {seq_len}, {global_batch})")
        manifest = storage.read_manifest(str(path))
        if manifest is None:
            raise DataError(f"{path}: not a prepared data directory (no manifest.json)")
        self.path, self.split, self.seq_len = str(path), split, seq_len
        self.global_batch, self.seed, self.manifest = global_batch, seed, manifest
        self.layout = manifest["layout"]
        self._perms: dict[int, np.ndarray] = {}
        self._eval_order: np.ndarray | None = None
        shards = manifest["splits"][split]["shards"]
        tables = [storage.read_shard(self.path, s["file"]) for s in shards]
        self._parts = [storage.flat_column(t, "ids") for t in tables]
        self._starts = np.cumsum([0] + [len(p) for p in self._parts])
        self.num_tokens = int(self._starts[-1])
        label = f"{manifest.get('source', '?')} data at {self.path}, split '{split}'"
        if self.layout == "examples":
            self._example_len = manifest["example_len"]
            if seq_len + 1 != self._example_len:
                raise DataError(
                    f"{label}: examples are {self._example_len} tokens, so seq_len must be {self._example_len - 1} (got {seq_len})"
                )
            if any("labels" not in t.column_names for t in tables):
                raise DataError(f"{label}: no 'labels' column (prepared by an older mqar generator): prepare it again")
            self._ids = np.concatenate(self._parts).reshape(-1, self._example_len)
            self._labels = np.concatenate([storage.flat_column(t, "labels") for t in tables]).reshape(-1, self._example_len)
            self.num_windows = len(self._ids)
        else:
            self.num_windows = max(0, (self.num_tokens - 1) // seq_len)
        if self.num_windows < 1:
            raise DataError(f"{label}: {self.num_tokens} tokens is smaller than one window of seq_len + 1 = {seq_len + 1} tokens")

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a step spans at most two epochs (unless batch > num_windows)
                self._perms.pop(next(iter(self._perms)))
            self._perms[epoch] = np.random.default_rng((self.seed, epoch)).permutation(self.num_windows)
        return self._perms[epoch]

    def window_indices(self, step: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
        """Window ids read by `rank` at `step` (int64 [global_batch // world_size])."""
        if world_size < 1 or self.global_batch % world_size:
            raise ValueError(f"world_size={world_size} must divide global_batch={self.global_batch}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} outside [0, {world_size})")
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        b = self.global_batch // world_size
        g = step * self.global_batch + rank * b + np.arange(b, dtype=np.int64)
        epochs, pos = np.divmod(g, self.num_windows)
        return np.array([self._permutation(int(e))[p] for e, p in zip(epochs, pos)], dtype=np.int64)

    def _windows(self, idx: np.ndarray) -> np.ndarray:
        if self.layout == "examples":
            return self._ids[idx].astype(np.int64)
        out = np.empty((len(idx), self.seq_len + 1), dtype=np.int64)
        for row, w in enumerate(idx):
            lo, hi = int(w) * self.seq_len, int(w) * self.seq_len + self.seq_len + 1
            s = int(np.searchsorted(self._starts, lo, side="right")) - 1
            filled = 0
            while filled < hi - lo:  # a window may cross shard boundaries
                a = lo + filled - self._starts[s]
                piece = self._parts[s][a : a + (hi - lo - filled)]
                out[row, filled : filled + len(piece)] = piece
                filled += len(piece)
                s += 1
        return out

    @property
    def labelled(self) -> bool:
        """True when y scores only some positions (mqar: the query keys; IGNORE_INDEX elsewhere),
        so token accuracy on them is the task's metric; False for next-token windows (all scored)."""
        return self.layout == "examples"

    def _xy(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) int64 [len(idx), seq_len] for window ids `idx`; id -1 is a padding row (x = 0,
        y = IGNORE_INDEX: it adds nothing to a loss or accuracy summed over labelled positions)."""
        pad = idx < 0
        idx = np.where(pad, 0, idx)
        if self.layout == "examples":
            x, y = self._ids[idx, :-1].astype(np.int64), self._labels[idx, 1:].astype(np.int64)
        else:
            w = self._windows(idx)
            x, y = w[:, :-1].copy(), w[:, 1:].copy()
        x[pad], y[pad] = 0, IGNORE_INDEX
        return torch.from_numpy(x), torch.from_numpy(y)

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> torch.Tensor:
        """LongTensor [global_batch // world_size, seq_len + 1] for this rank at this step (mqar:
        the examples' input ids; their labels are only in `xy`)."""
        return torch.from_numpy(self._windows(self.window_indices(step, rank, world_size)))

    def xy(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) LongTensors [b, seq_len]: y[t] = x[t+1] (next token); for mqar y is IGNORE_INDEX
        (-100) except at the query keys, where it is the key's value."""
        return self._xy(self.window_indices(step, rank, world_size))

    # -- evaluation: one fixed subset per run -----------------------------------------------
    def eval_windows(self, max_windows: int | None = None) -> np.ndarray:
        """The run's fixed eval windows: int64 [min(max_windows, num_windows)] (all when None),
        the first ones of the val split's van der Corput order. Independent of seed and world
        size; nested: eval_windows(m) is a prefix of eval_windows(m') for m <= m'. A prefix of
        2^j windows is exactly evenly spaced; any prefix of m has gaps <= 2 * num_windows / m + 1."""
        if max_windows is not None and max_windows < 1:
            raise ValueError(f"max_windows={max_windows} must be >= 1 (or None for all windows)")
        if self._eval_order is None:
            self._eval_order = _van_der_corput_order(self.num_windows)
        return self._eval_order[:max_windows].copy()

    def eval_shard(self, max_windows: int | None, rank: int = 0, world_size: int = 1, start: int = 0) -> np.ndarray:
        """Rank `rank`'s share of eval_windows(max_windows)[start:]: every world_size-th window
        from position rank, padded with -1 to ceil(n / world_size) entries so every rank runs the
        same number of equally sized batches (ZeRO-3 forwards are collective). The ranks' shares
        are disjoint and their union is the same set for every world_size."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} outside [0, world_size={world_size})")
        if start < 0:
            raise ValueError(f"start={start} must be >= 0")
        idx = self.eval_windows(max_windows)[start:]
        share = idx[rank::world_size]
        return np.concatenate([share, np.full(-(-len(idx) // world_size) - len(share), -1, dtype=np.int64)])

    def eval_xy(
        self, max_windows: int | None, batch_size: int, rank: int = 0, world_size: int = 1, start: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's eval_shard as (x, y) LongTensors [<= batch_size, seq_len] (labels as in `xy`;
        padding rows are all IGNORE_INDEX). Every rank yields the same number and shapes of batches."""
        idx = self.eval_shard(max_windows, rank, world_size, start)
        for i in range(0, len(idx), batch_size):
            yield self._xy(idx[i : i + batch_size])

    def eval_batches(self, max_windows: int | None, batch_size: int) -> Iterator[torch.Tensor]:
        """eval_windows(max_windows) as raw windows, LongTensors [<= batch_size, seq_len + 1]
        (last batch may be smaller)."""
        idx = self.eval_windows(max_windows)
        for i in range(0, len(idx), batch_size):
            yield torch.from_numpy(self._windows(idx[i : i + batch_size]))


def _van_der_corput_order(n: int) -> np.ndarray:
    """A permutation of range(n) (int64 [n]) whose every prefix is spread over [0, n): window
    floor(v_k * n) for the base-2 van der Corput sequence v_k = bit-reverse(k) / 2^b (2^b >= n),
    keeping each window's first occurrence. The first 2^j entries are, as a set, floor(i * n / 2^j)
    for i < 2^j (for 2^j <= n), so a prefix of m contains a grid with step <= 2n/m + 1."""
    bits = max(0, (n - 1).bit_length())
    k = np.arange(1 << bits, dtype=np.int64)
    rev = np.zeros_like(k)
    for b in range(bits):
        rev |= ((k >> b) & 1) << (bits - 1 - b)
    w = (rev * n) >> bits
    _, first = np.unique(w, return_index=True)
    return w[np.sort(first)]
