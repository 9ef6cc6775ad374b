"""A checkpoint is published only once it is whole, and a resume checks that it still is.

Why: a save can stop midway (disk full, a killed worker, a partial copy to shared storage)
and a published file can be damaged later (a truncated copy, a bad disk). DeepSpeed then
fails deep inside ``load_checkpoint`` after it has loaded part of the state, or worse loads
a short file that happens to parse. So each rank, after DeepSpeed's save returned and the
loop state is written, lists every file of its own share with its size and SHA-256 in
``qkstudy_manifest.rank<r>.json``, written last under a temporary name and renamed: a rank's
share without its manifest was never finished. The checkpoint is handed to Ray Train only
after every rank wrote its manifest, and a resume (``run.resume``) loads a checkpoint only
when every rank's manifest is there and every file matches it. Pure file work: no Ray, no
torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["MANIFEST_PREFIX", "manifest_name", "verify_share", "write_manifest"]

MANIFEST_PREFIX = "qkstudy_manifest.rank"
_CHUNK = 1 << 20


def manifest_name(rank: int) -> str:
    """File name of rank ``rank``'s manifest inside a checkpoint directory."""
    return f"{MANIFEST_PREFIX}{rank}.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: str | Path, rank: int, world: int) -> dict[str, list]:
    """List every file under ``directory`` (this rank's share of a checkpoint; other ranks'
    manifests excluded) as {relative path: [bytes, sha256]} in ``manifest_name(rank)``,
    written to a temporary name, flushed to disk and renamed. Returns the file map.
    Call after the save returned: the manifest is the mark that this share is complete."""
    d = Path(directory)
    files = {str(p.relative_to(d)): [p.stat().st_size, _sha256(p)] for p in sorted(d.rglob("*"))
             if p.is_file() and not p.name.startswith(MANIFEST_PREFIX)}
    tmp = d / (manifest_name(rank) + ".tmp")
    with tmp.open("w") as f:
        json.dump({"rank": rank, "world": world, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(d / manifest_name(rank))
    return files


def verify_share(directory: str | Path, rank: int) -> str | None:
    """Why rank ``rank``'s share of the checkpoint in ``directory`` cannot be loaded, or None
    when it is whole: its manifest exists and parses, every file it lists has the listed size
    and SHA-256, and (rank 0 only, for the whole checkpoint) every rank of the saving world
    left its manifest. A rank beyond the saving world has nothing to check.

    A directory with no manifest at all was written before manifests existed: None (the
    caller loads it unverified, and a failing load still falls back)."""
    d = Path(directory)
    if not any(d.glob(f"{MANIFEST_PREFIX}*.json")):
        return None
    own = d / manifest_name(rank)
    try:
        m = json.loads((d / manifest_name(0)).read_text())
        world = int(m["world"])
        if rank >= world:
            return None
        m = json.loads(own.read_text()) if rank else m
        files: dict[str, list] = m["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"manifest {own.name} missing or unreadable ({type(e).__name__}: {e}): the save never completed"
    if rank == 0:
        missing = [r for r in range(world) if not (d / manifest_name(r)).is_file()]
        if missing:
            return f"rank(s) {missing} of {world} never finished their share (no manifest)"
    for rel, (size, digest) in files.items():
        p = d / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != size:
            return f"{rel} has {p.stat().st_size} bytes, {size} were saved (truncated or torn)"
        if _sha256(p) != digest:
            return f"{rel} differs from what was saved (SHA-256 mismatch)"
    return None
