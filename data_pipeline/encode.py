"""Worker side of parallel tokenization: encode a chunk of documents, write one Arrow shard.

Kept free of torch/pydantic imports so spawned workers start fast. A shard is an Arrow IPC file
(uncompressed, so the loader can memory-map it) with one row per document: column ``ids``,
list<uint16|uint32>, the document's token ids followed by the end-of-document id.

Documents are encoded line by line. Newline is a user-defined piece, so no piece spans a line
break and the ids equal those of encoding the whole document (tests check this); SentencePiece's
BPE encode is superlinear in input length, so lines are faster and balance better across workers.
"""

from __future__ import annotations

import os
from itertools import chain

import numpy as np
import pyarrow as pa
import sentencepiece as spm

_sp: spm.SentencePieceProcessor | None = None


def init_worker(model_proto: bytes) -> None:
    global _sp
    _sp = spm.SentencePieceProcessor(model_proto=model_proto)


def write_shard(path: str, offsets: np.ndarray, columns: dict[str, np.ndarray]) -> None:
    """Write list columns sharing `offsets` (int [rows + 1]) from flat value arrays, to a temp
    name renamed onto ``path``: a shard that exists is whole (a resumed prepare keeps it)."""
    pa_offsets = pa.array(offsets.astype(np.int32))
    table = pa.table({name: pa.ListArray.from_arrays(pa_offsets, pa.array(flat)) for name, flat in columns.items()})
    part = f"{path}.{os.getpid()}.part"
    with pa.OSFile(part, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(1, table.num_rows))
    os.replace(part, path)


def shard_counts(path: str) -> tuple[int, int]:
    """(documents, tokens) of a written shard (its rows and its ``ids`` values), read from the
    memory-mapped file without copying the tokens."""
    table = pa.ipc.open_file(pa.memory_map(path)).read_all()
    return table.num_rows, sum(len(c.flatten()) for c in table.column("ids").chunks)


def split_lines(text: str) -> list[str]:
    """`text` cut after every "\\n" (each piece keeps its newline); "".join(result) == text."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def encode_documents(sp: spm.SentencePieceProcessor, texts: list[str], eod_id: int, dtype: str):
    """(flat ids with eod_id after each document, offsets int64 [len(texts) + 1])."""
    lines, lines_per_doc = [], np.empty(len(texts), dtype=np.int64)
    for i, t in enumerate(texts):
        seg = split_lines(t)
        lines += seg
        lines_per_doc[i] = len(seg)
    ids = sp.encode(lines, num_threads=1)
    line_len = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(line_len.sum()))
    line_end = np.concatenate([[0], np.cumsum(line_len)])
    doc_end = line_end[np.cumsum(lines_per_doc)]  # token index where each document ends
    flat = np.insert(flat, doc_end, np.asarray(eod_id, dtype=dtype))
    offsets = np.concatenate([[0], doc_end + np.arange(1, len(texts) + 1)])
    return flat, offsets


def encode_chunk(task: tuple[str, list[str], int, str]) -> tuple[int, int]:
    """(shard path, texts, eod id, dtype) -> (documents, tokens) written to that shard."""
    path, texts, eod_id, dtype = task
    if _sp is None:
        raise RuntimeError("encode_chunk: init_worker(model_proto) was not called in this process")
    flat, offsets = encode_documents(_sp, texts, eod_id, dtype)
    write_shard(path, offsets, {"ids": flat})
    return len(texts), len(flat)
