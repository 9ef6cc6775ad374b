"""Worker side of parallel tokenization: encode a chunk of documents, write one Arrow shard.

Kept free of torch/pydantic imports so spawned workers start fast. A shard is an Arrow IPC file
(uncompressed, so the loader can memory-map it) with one row per document: column ``ids``,
list<uint16|uint32>, the document's token ids followed by the end-of-document id.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import sentencepiece as spm

_sp: spm.SentencePieceProcessor | None = None


def init_worker(model_proto: bytes) -> None:
    global _sp
    _sp = spm.SentencePieceProcessor(model_proto=model_proto)


def write_shard(path: str, rows: list[np.ndarray], dtype: str, extra: dict[str, list[np.ndarray]] | None = None) -> int:
    """Write `rows` (one int array per row) as list column ``ids`` (+ optional list columns).
    Returns the number of tokens."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    cols = {"ids": rows, **(extra or {})}
    arrays = {}
    for name, col in cols.items():
        col_dtype = dtype if name == "ids" else "uint8"
        flat = np.concatenate(col).astype(col_dtype, copy=False) if rows else np.zeros(0, col_dtype)
        arrays[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    table = pa.table(arrays)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(1, len(rows)))
    return int(offsets[-1])


def encode_chunk(task: tuple[str, list[str], int, str]) -> tuple[int, int]:
    """(shard path, texts, eod id, dtype) -> (documents, tokens) written to that shard."""
    path, texts, eod_id, dtype = task
    ids = _sp.encode(texts, num_threads=1)
    rows = [np.array(x + [eod_id], dtype=dtype) for x in ids]
    return len(rows), write_shard(path, rows, dtype)
