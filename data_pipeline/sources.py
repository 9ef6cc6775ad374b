"""Sources: turn a CorpusConfig into an ordered list of documents, plus a fingerprint of its inputs.

Every source yields documents in a deterministic order (sorted relative paths, then row order),
each with a stable id (``relpath`` or ``relpath#row``) that decides its train/val split. The
fingerprint (sha256 of every input file, or the generator parameters) enters the content hash,
so a changed file means a new prepared dataset. Undecodable bytes are replaced with U+FFFD and
counted (never a crash mid-way); everything else that is wrong raises DataError naming the source.

Documents are held in memory during prepare; cap large corpora with `max_bytes`/`max_documents`.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import mmap
import os
import re
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs

from . import mqar
from .config import STDLIB_DEFAULT_EXCLUDE, CorpusConfig
from .errors import DataError
from .storage import is_uri, resolve

# A WikiText article title row: " = Title = " (sections use " = = Section = = ").
_WIKITEXT_TITLE = re.compile(r"^ = [^=].*[^=] = \n?$")
_BLANK_LINES = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    split: str | None = None  # forced split ("val" from val_paths / hf_val_split), else by hash


@dataclass
class DecodeStats:
    """Undecodable input, counted rather than fatal."""

    documents: int = 0
    replaced_chars: int = 0
    where: list[str] = field(default_factory=list)  # first few document ids, for the log

    def decode(self, data: bytes, doc_id: str) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("utf-8", errors="replace")
            self.documents += 1
            self.replaced_chars += text.count("\ufffd") - data.count("\ufffd".encode())
            if len(self.where) < 10:
                self.where.append(doc_id)
            return text


@dataclass(frozen=True)
class _File:
    id: str  # path relative to the pattern's base: stable across machines
    fs: pafs.FileSystem
    path: str


def read_bytes(f: _File) -> bytes:
    """The whole content of one input file (local or on a pyarrow filesystem)."""
    with f.fs.open_input_stream(f.path) as s:
        return s.read()


def _excluded(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in patterns)


def _list_files(patterns: list[str], corpus: CorpusConfig) -> list[_File]:
    """Files named by paths, directories (recursive) or globs; sorted by id; DataError if none."""
    exclude = corpus.exclude or []
    files: dict[str, _File] = {}
    for pattern in patterns:
        if is_uri(pattern):
            fs, path = resolve(pattern)
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                found = [
                    (i.path, os.path.relpath(i.path, path))
                    for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                    if i.type == pafs.FileType.File
                ]
            elif info.type == pafs.FileType.File:
                found = [(path, posixpath_basename(path))]
            else:
                raise DataError(f"{corpus.label()}: {pattern} does not exist")
        else:
            fs = pafs.LocalFileSystem()
            p = corpus.local_path(pattern)
            if os.path.isdir(p):
                found = [(str(q), str(q.relative_to(p))) for q in Path(p).rglob("*") if q.is_file()]
            elif os.path.isfile(p):  # before the glob: a file named "[draft].txt" is that file
                found = [(p, os.path.basename(p))]
            elif glob.has_magic(p):
                magic = re.search(r"[*?\[]", p)
                base = p[: magic.start()] if magic else p
                base = base if base.endswith(os.sep) else os.path.dirname(base)
                found = [(q, os.path.relpath(q, base or ".")) for q in glob.glob(p, recursive=True) if os.path.isfile(q)]
            elif os.path.exists(p):  # /dev/null, a FIFO, a socket: there, but no file to read text from
                raise DataError(f"{corpus.label()}: {pattern} is neither a file nor a folder")
            else:
                raise DataError(f"{corpus.label()}: {pattern} does not exist")
            found = [(os.path.abspath(a), r) for a, r in found]
        for abs_path, rel in found:
            if not any(part.startswith(".") for part in Path(rel).parts) and not _excluded(rel, exclude):
                files.setdefault(rel, _File(rel, fs, abs_path))
    if not files:
        raise DataError(f"{corpus.label()}: no files match {patterns}")
    return [files[k] for k in sorted(files)]


def posixpath_basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def stdlib_root() -> Path:
    """The running interpreter's standard library directory (sysconfig ``stdlib``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(corpus: CorpusConfig) -> list[_File]:
    root = stdlib_root()
    exclude = STDLIB_DEFAULT_EXCLUDE if corpus.exclude is None else corpus.exclude
    fs = pafs.LocalFileSystem()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        # prune third-party packages (hundreds of MB) and caches instead of filtering afterwards
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.endswith(".py"):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not _excluded(rel, exclude):
                    out.append(_File(rel, fs, os.path.join(dirpath, name)))
    if not out:
        raise DataError(f"source 'stdlib' ({root}): no .py files found")
    return sorted(out, key=lambda f: f.id)


def input_files(corpus: CorpusConfig) -> list[tuple[_File, str | None]]:
    """The corpus's input files in their deterministic order, each with its forced split
    ("val" for `val_paths`, else None). Raises DataError when a path matches no file."""
    if corpus.source == "stdlib":
        return [(f, None) for f in _stdlib_files(corpus)]
    out: list[tuple[_File, str | None]] = [(f, None) for f in _list_files(corpus.paths, corpus)]
    if corpus.val_paths:
        out += [(f, "val") for f in _list_files(corpus.val_paths, corpus)]
    return out


def input_file_sizes(corpus: CorpusConfig) -> list[tuple[int, str | None]]:
    """(bytes on disk, split: None for train or "val") of every input file of a file corpus
    (stdlib, text, jsonl, parquet), without reading them. Raises DataError as the listing does."""
    return [(f.fs.get_file_info(f.path).size or 0, split) for f, split in input_files(corpus)]


def fingerprint(corpus: CorpusConfig) -> dict:
    """What the prepared data depends on besides the configs: sha256 of every input file
    (stdlib: plus the interpreter version), the dataset identity for `hf`, the generator's
    version for `mqar` (so examples from an older generator are never reused)."""
    if corpus.source == "mqar":
        return {"generator": f"mqar-v{mqar.GENERATOR_VERSION}"}
    if corpus.source == "mixture":
        return {str(i): fingerprint(c.corpus) for i, c in enumerate(corpus.components)}
    if corpus.source == "hf":
        return {"hf": f"{corpus.hf_path}/{corpus.hf_name}/{corpus.hf_split}/{corpus.hf_val_split}"}
    out = {}
    for f, split in input_files(corpus):
        out[("val:" if split else "") + f.id] = hashlib.sha256(read_bytes(f)).hexdigest()
    if corpus.source == "stdlib":
        out["python"] = sys.version
    return out


def _group_rows(rows: Iterator[tuple[int, str]], boundary: str, file_id: str, split) -> Iterator[Document]:
    """Rows -> documents: one per row, or WikiText articles started at their title row."""
    if boundary != "wikitext_heading":
        for i, text in rows:
            yield Document(f"{file_id}#{i}", text, split)
        return
    start: int | None = None
    buf: list[str] = []
    for i, text in rows:
        if _WIKITEXT_TITLE.match(text) and buf:
            yield Document(f"{file_id}#{start}", "".join(buf), split)
            buf = []
        if not buf:
            start = i
        buf.append(text)
    if buf:
        yield Document(f"{file_id}#{start}", "".join(buf), split)


def _jsonl_rows(f: _File, corpus: CorpusConfig, stats: DecodeStats) -> Iterator[tuple[int, str]]:
    for lineno, raw in enumerate(read_bytes(f).split(b"\n"), start=1):
        if not raw.strip():
            continue
        line = stats.decode(raw, f"{f.id}:{lineno}")
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{corpus.label()}: {f.id} line {lineno} is not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or corpus.text_column not in row:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise DataError(f"{corpus.label()}: {f.id} line {lineno} has no column '{corpus.text_column}' (found {keys})")
        value = row[corpus.text_column]
        if value is not None:
            yield lineno, str(value)


def _parquet_rows(f: _File, corpus: CorpusConfig) -> Iterator[tuple[int, str]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f.path, filesystem=f.fs)
    except Exception as e:  # pyarrow raises several types for a non-Parquet file
        raise DataError(f"{corpus.label()}: {f.id} is not a readable Parquet file ({e})") from None
    names = pf.schema_arrow.names
    if corpus.text_column not in names:
        raise DataError(f"{corpus.label()}: {f.id} has no column '{corpus.text_column}' (columns: {names})")
    i = 0
    for batch in pf.iter_batches(columns=[corpus.text_column], batch_size=65536):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield i, value if isinstance(value, str) else str(value)
            i += 1


def _hf_documents(corpus: CorpusConfig) -> Iterator[Document]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{corpus.label()}: needs the optional 'hf' extra (pip install 'qkstudy[hf]')") from None
    boundary = "row" if corpus.document_boundary == "auto" else corpus.document_boundary
    for split_name, split in ((corpus.hf_split, None), (corpus.hf_val_split, "val")):
        if split_name is None:
            continue
        try:
            ds = datasets.load_dataset(corpus.hf_path, corpus.hf_name, split=split_name)
        except Exception as e:  # hub unreachable, unknown dataset, ...
            raise DataError(f"{corpus.label()}: load_dataset failed ({e})") from None
        if corpus.text_column not in ds.column_names:
            raise DataError(f"{corpus.label()}: split '{split_name}' has no column '{corpus.text_column}' (columns: {ds.column_names})")
        rows = ((i, t) for i, t in enumerate(ds[corpus.text_column]) if t is not None)
        yield from _group_rows(rows, boundary, split_name, split)


def _file_documents(corpus: CorpusConfig, stats: DecodeStats) -> Iterator[Document]:
    src = corpus.source
    for f, split in input_files(corpus):
        if src in ("stdlib", "text"):
            text = stats.decode(read_bytes(f), f.id)
            if corpus.document_boundary == "blank_lines":
                for i, part in enumerate(_BLANK_LINES.split(text)):
                    yield Document(f"{f.id}#{i}", part, split)
            else:
                yield Document(f.id, text, split)
        else:
            boundary = "row" if corpus.document_boundary == "auto" else corpus.document_boundary
            rows = _jsonl_rows(f, corpus, stats) if src == "jsonl" else _parquet_rows(f, corpus)
            yield from _group_rows(rows, boundary, f.id, split)


def _mixture_picks(corpus: CorpusConfig, sizes: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """Weighted sampling without replacement: component i contributes round(w_i * M) documents,
    M the largest total no component runs out at (or `max_documents`). Weights are in documents.
    Returns each component's picked document indices (sorted) and the mixture's order: a
    permutation of the picks taken component by component."""
    w = np.array([c.weight for c in corpus.components], dtype=np.float64)
    w /= w.sum()
    total = min(n / wi for n, wi in zip(sizes, w))
    if corpus.max_documents is not None:
        total = min(total, corpus.max_documents)
    rng = np.random.default_rng(corpus.seed)
    picks = []
    for n, wi in zip(sizes, w):
        k = max(1, min(n, int(round(wi * total))))
        picks.append(np.sort(rng.choice(n, size=k, replace=False)))
    return picks, rng.permutation(sum(len(p) for p in picks))


def _mixture_documents(corpus: CorpusConfig, stats: DecodeStats) -> Iterator[Document]:
    """The mixture's documents (``_mixture_picks``), streamed: a pass counts each component's
    documents, a second writes the picked ones' text to a temporary spill file (UTF-8, ids and
    offsets kept apart), which is memory-mapped and read in the mixture's order. Never holds
    the texts; costs their size on the temp disk (``TMPDIR``) while iterated."""
    sizes = [sum(1 for _ in iter_documents(c.corpus, DecodeStats())) for c in corpus.components]
    picks, order = _mixture_picks(corpus, sizes)
    ids: list[str] = []
    splits: list[str | None] = []
    bounds = [0]
    with tempfile.TemporaryFile(prefix="qkstudy-mixture-") as spill:
        for i, (c, picked) in enumerate(zip(corpus.components, picks)):
            wanted = iter(picked.tolist())
            nxt = next(wanted, None)
            for j, d in enumerate(iter_documents(c.corpus, stats)):
                if j != nxt:
                    continue
                data = d.text.encode("utf-8", "surrogatepass")
                spill.write(data)
                ids.append(f"{i}:{d.id}")
                splits.append(d.split)
                bounds.append(bounds[-1] + len(data))
                nxt = next(wanted, None)  # read on to the end all the same: the decode counts are the whole component's
        spill.flush()
        if not bounds[-1]:
            return  # nothing picked (mmap cannot map an empty file)
        with mmap.mmap(spill.fileno(), 0, access=mmap.ACCESS_READ) as text:
            for k in order:
                yield Document(ids[k], text[bounds[k] : bounds[k + 1]].decode("utf-8", "surrogatepass"), splits[k])


def iter_documents(corpus: CorpusConfig, stats: DecodeStats | None = None) -> Iterator[Document]:
    """The non-empty documents of a text corpus, in deterministic order, caps applied, one at a
    time: file sources are read file by file and never held whole (prepare streams over them,
    ``data_pipeline.build``); a mixture's picked documents wait in a temporary spill file, not
    in memory (``_mixture_documents``).

    Raises DataError (naming the source) for missing files, missing columns, malformed JSONL,
    an unreachable `hf` dataset, or no documents at all (once the inputs are exhausted).
    """
    stats = stats if stats is not None else DecodeStats()
    if corpus.source == "mqar":
        raise DataError("source 'mqar' is generated, it has no documents")
    if corpus.source == "mixture":
        docs = _mixture_documents(corpus, stats)
    elif corpus.source == "hf":
        docs = _hf_documents(corpus)
    else:
        docs = _file_documents(corpus, stats)
    count, nbytes = 0, 0
    for d in docs:
        if not d.text.strip():
            continue
        if corpus.max_documents is not None and count >= corpus.max_documents:
            break
        size = len(d.text.encode("utf-8"))
        if corpus.max_bytes is not None and count and nbytes + size > corpus.max_bytes:
            break
        yield d
        count += 1
        nbytes += size
    if not count:
        raise DataError(f"{corpus.label()}: no documents (all inputs are empty)")


def load_documents(corpus: CorpusConfig, stats: DecodeStats | None = None) -> list[Document]:
    """``iter_documents`` as a list (the whole corpus in memory: for small corpora and tests)."""
    return list(iter_documents(corpus, stats))
