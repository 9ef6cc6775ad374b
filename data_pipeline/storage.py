"""Local paths and pyarrow filesystem URIs (s3://, gs://, file://) behind one small interface.

Plain paths are published atomically with a directory rename. Object stores have no atomic
rename, so for URIs the manifest is written last and is the commit marker: a directory without
``manifest.json`` is never treated as prepared.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

MANIFEST = "manifest.json"


def is_uri(path: str) -> bool:
    return "://" in str(path)


def default_cache_root() -> str:
    """``$QKSTUDY_CACHE`` or ``~/.cache/qkstudy/data``."""
    return os.environ.get("QKSTUDY_CACHE") or str(Path.home() / ".cache" / "qkstudy" / "data")


def resolve(path: str | os.PathLike) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a pyarrow URI."""
    path = str(path)
    if is_uri(path):
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))


def join(base: str, *parts: str) -> str:
    """Join path parts, keeping a URI's scheme intact."""
    return posixpath.join(base, *parts) if is_uri(base) else os.path.join(base, *parts)


def read_manifest(location: str) -> dict | None:
    """The manifest of a prepared directory, or None when it is absent (not prepared)."""
    fs, path = resolve(location)
    try:
        with fs.open_input_stream(posixpath.join(path, MANIFEST) if is_uri(location) else os.path.join(path, MANIFEST)) as f:
            return json.loads(f.read())
    except (FileNotFoundError, OSError):
        return None


def read_shard(location: str, name: str) -> pa.Table:
    """The Arrow shard ``name`` of a prepared directory: memory-mapped when local, read into
    memory from an object store."""
    if is_uri(location):
        fs, path = resolve(join(location, name))
        with fs.open_input_file(path) as f:
            return pa.ipc.open_file(f).read_all()
    return pa.ipc.open_file(pa.memory_map(os.path.join(location, name))).read_all()


def flat_column(table: pa.Table, column: str) -> np.ndarray:
    """Zero-copy numpy view of a list column's values (memory-mapped for local shards)."""
    chunks = [c.flatten().to_numpy(zero_copy_only=True) for c in table.column(column).chunks]
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def publish(tmp_dir: str, dest: str) -> None:
    """Move a fully written local directory to `dest` (a local path or URI).

    Local: one rename (atomic); if another process published the same content first, ours is
    discarded. URI: upload every file, then the manifest last.
    """
    if not is_uri(dest):
        try:
            os.rename(tmp_dir, dest)
        except OSError:
            if read_manifest(dest) is None:
                raise
            shutil.rmtree(tmp_dir, ignore_errors=True)
        return
    fs, path = resolve(dest)
    fs.create_dir(path, recursive=True)
    local = pafs.LocalFileSystem()
    for name in sorted(os.listdir(tmp_dir), key=lambda n: n == MANIFEST):
        pafs.copy_files(os.path.join(tmp_dir, name), posixpath.join(path, name), source_filesystem=local, destination_filesystem=fs)
    shutil.rmtree(tmp_dir, ignore_errors=True)
