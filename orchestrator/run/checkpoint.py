"""A qkstudy checkpoint: its on-disk layout, the manifests that say one is whole, and the pick
of the checkpoint a run resumes from.

One format for the three kinds of checkpoint: a Ray Train checkpoint (``run.worker.loop`` saves
every rank's share into its own temporary folder, ``ray.train.report`` merges them), a branch
point of ``protocol: branches`` (``run.worker.branching``: every rank's share merged into one folder
of the study's storage) and what a resume (``restore_newest_whole``) or a branch's start
(``run.worker.branching``) reads back. A checkpoint folder holds:

- ``CKPT_TAG``/: DeepSpeed's ``engine.save_checkpoint(folder, tag=CKPT_TAG)`` files (model
  states, each rank's ZeRO partition) and DeepSpeed's ``latest`` and recovery script;
- ``STATE_FILE``: the loop state as JSON (step, wall time, MLflow run id, run_id, data hash),
  written by rank 0 under a temporary name and renamed;
- ``manifest_name(r)`` for every rank r of the saving world, written last.

Why the manifests: a save can stop midway (disk full, a killed worker, a partial copy to
shared storage) and a published file can be damaged later (a truncated copy, a bad disk).
DeepSpeed then fails deep inside ``load_checkpoint`` after it has loaded part of the state,
or worse loads a short file that happens to parse. So each rank, after DeepSpeed's save
returned and the loop state is written, lists every file of its own share with its size and
SHA-256 in ``qkstudy_manifest.rank<r>.json``, written last under a temporary name and
renamed: a rank's share without its manifest was never finished. A reader loads a checkpoint
only when every rank's manifest is there and every file matches it (``verify_share``, each
rank its own share). A rank's share is saved into a folder of its own (``save_share``), so
its manifest lists exactly the files it wrote, also when the shares are then merged into one
folder (``merge_share``).

Resume: Ray Train hands a restarted worker group its latest checkpoint and keeps the ones
before it (``CheckpointConfig(num_to_keep=2)`` in ``run.driver.packing``). A latest checkpoint
that is damaged (a truncated optimizer file, a share whose save never finished) is skipped for
the one before it, and the run says so: a ``[qkstudy]`` line in the worker log and the
``resume_fallback`` tag on its MLflow run (``Recorder.start``). When none is whole the run
starts fresh, with that said the same way. Every rank takes the same decision: each checks
its own share, and the ranks agree through ``any_rank`` (an all-reduce) before anyone loads,
so no rank resumes from a checkpoint another rank refused. Checkpoints of other runs (an
earlier run of a pack, this run on other data) end the search silently: older checkpoints are
older runs. Loading itself is the caller's (``run.worker.safe_load``: weights-only, as storage
is shared). File work and Ray Train's checkpoint listing only: no torch, no DeepSpeed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "CKPT_TAG",
    "FALLBACK_KEY",
    "MANIFEST_PREFIX",
    "STATE_FILE",
    "has_manifest",
    "manifest_name",
    "merge_share",
    "read_state",
    "restore_newest_whole",
    "resume_candidates",
    "save_share",
    "verify_share",
    "write_manifest",
    "write_state",
]

CKPT_TAG = "ckpt"  # DeepSpeed's tag: its files go to <checkpoint>/ckpt/
STATE_FILE = "qkstudy_state.json"  # the loop state, rank 0's share
MANIFEST_PREFIX = "qkstudy_manifest.rank"
FALLBACK_KEY = "resume_fallback"  # key in a restored state, and the MLflow tag's bare name (tracking.tag)
_CHUNK = 1 << 20


def manifest_name(rank: int) -> str:
    """File name of rank ``rank``'s manifest inside a checkpoint directory."""
    return f"{MANIFEST_PREFIX}{rank}.json"


def has_manifest(directory: str | Path) -> bool:
    """Whether any rank left a manifest in ``directory`` (False: saved before manifests existed)."""
    return any(Path(directory).glob(f"{MANIFEST_PREFIX}*.json"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_state(directory: str | Path, state: dict[str, Any]) -> None:
    """Write the loop ``state`` (JSON-serializable) as ``STATE_FILE`` in ``directory``: to a
    temporary name, then renamed, so a reader sees all of it or none."""
    tmp = Path(directory) / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.rename(Path(directory) / STATE_FILE)


def read_state(directory: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the loop state in ``directory``'s ``STATE_FILE``, None), or (None, why it cannot be
    read) when the file is missing or is not JSON. Never raises for a bad file."""
    try:
        return json.loads((Path(directory) / STATE_FILE).read_text()), None
    except (OSError, ValueError) as e:
        return None, f"{STATE_FILE} missing or unreadable ({type(e).__name__})"


def write_manifest(directory: str | Path, rank: int, world: int) -> dict[str, list]:
    """List every file under ``directory`` (this rank's share of a checkpoint; other ranks'
    manifests excluded) as {relative path: [bytes, sha256 hex]} in ``manifest_name(rank)``,
    written to a temporary name, flushed to disk and renamed. Returns the file map.
    Call after the save returned: the manifest is the mark that this share is complete.
    Raises OSError when the directory cannot be read or written."""
    d = Path(directory)
    files = {
        str(p.relative_to(d)): [p.stat().st_size, _sha256(p)]
        for p in sorted(d.rglob("*"))
        if p.is_file() and not p.name.startswith(MANIFEST_PREFIX)
    }
    tmp = d / (manifest_name(rank) + ".tmp")
    with tmp.open("w") as f:
        json.dump({"rank": rank, "world": world, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(d / manifest_name(rank))
    return files


def save_share(engine: Any, directory: str | Path, state: dict[str, Any], rank: int, world: int) -> None:
    """Save this rank's share of a checkpoint into ``directory`` (this rank's own folder,
    created if missing): DeepSpeed's ``engine.save_checkpoint`` under ``CKPT_TAG``, on rank 0
    the loop ``state`` (``write_state``), then the manifest of what this rank wrote
    (``write_manifest``, of a ``world``-rank save). Collective: every rank calls it (DeepSpeed
    synchronizes the ranks inside its save). Raises whatever the save raises; a share left
    without its manifest is never loaded (``verify_share``)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    engine.save_checkpoint(str(d), tag=CKPT_TAG)
    if rank == 0:
        write_state(d, state)
    write_manifest(d, rank, world)  # last: this share is whole


def merge_share(share: str | Path, into: str | Path) -> None:
    """Move every file of one rank's share (``save_share``'s folder) to the same relative
    path under ``into`` (the folder the ranks' shares make up together, on the same
    filesystem: a rename per file) and remove the emptied share folder. Ray Train merges a
    reported checkpoint's shares the same way.

    Raises FileExistsError when a file is already there (two ranks wrote the same name: the
    layout this module assumes, a distinct file per rank except rank 0's, does not hold)."""
    share, into = Path(share), Path(into)
    for p in sorted(share.rglob("*")):
        if not p.is_file():
            continue
        dest = into / p.relative_to(share)
        if dest.exists():
            raise FileExistsError(f"{dest} exists: two ranks saved the same checkpoint file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        p.rename(dest)
    shutil.rmtree(share)


def verify_share(directory: str | Path, rank: int) -> str | None:
    """Why rank ``rank``'s share of the checkpoint in ``directory`` cannot be loaded, or None
    when it is whole: its manifest exists and parses, every file it lists has the listed size
    and SHA-256, and (rank 0 only, for the whole checkpoint) every rank of the saving world
    left its manifest. A rank beyond the saving world has nothing to check. Reads every file
    of the share once (hashing); never raises for a damaged checkpoint.

    A directory with no manifest at all was written before manifests existed: None (the
    caller loads it unverified, and a failing load still falls back; ``has_manifest`` tells)."""
    d = Path(directory)
    if not has_manifest(d):
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


def resume_candidates() -> list[Any]:
    """This worker group's reported Ray Train checkpoints, newest first ([] when none, or
    outside Ray Train). The latest comes from ``ray.train.get_checkpoint``; the older ones
    Ray still keeps from ``get_all_reported_checkpoints`` (a restored controller knows them
    from its snapshot). Should that listing fail, only the latest is a candidate."""
    import ray.train

    try:
        latest = ray.train.get_checkpoint()
    except Exception:  # noqa: BLE001 - not inside a Ray Train worker: nothing to resume
        return []
    if latest is None:
        return []
    try:
        reported = [rc.checkpoint for rc in ray.train.get_all_reported_checkpoints(timeout_s=60)]
    except Exception:  # noqa: BLE001 - an older Ray or a slow controller: the latest alone
        reported = []
    out, seen = [latest], {latest.path}
    for c in reversed(reported):  # reported in report order
        if c.path not in seen:
            out.append(c)
            seen.add(c.path)
    return out


def restore_newest_whole(
    cands: list[Any],
    load: Callable[[str], Any],
    *,
    run_id: str,
    data_hash: str | None,
    rank: int,
    any_rank: Callable[[bool], bool],
    log: Callable[[str], None],
    rebuild: Callable[[], None],
) -> dict | None:
    """Load the newest checkpoint of ``cands`` (Ray Train checkpoints, newest first) that is
    this run's (``run_id``, and ``data_hash`` when both know it), whole on every rank and
    loads (``load(dir)`` raises on a bad file); return its loop state, or None to start fresh.

    ``any_rank(flag)``: True when any rank passes True (every rank calls it in the same order).
    A skipped checkpoint is named with its reason in the state's ``FALLBACK_KEY`` entry (and,
    on rank 0, in ``log``); with no loadable checkpoint the note is returned as
    ``{FALLBACK_KEY: note}`` without a step (start fresh). ``rebuild()`` is called before a
    fresh start when a failed load may have left part of a checkpoint in the engine. Each
    rank logs its own reason for refusing a checkpoint; the note is rank 0's view."""
    skipped: list[str] = []
    dirty = False
    for ckpt in cands:
        with ckpt.as_directory() as d:
            state, why = read_state(d)
            other = state is not None and (
                state.get("run_id") != run_id or (data_hash is not None and state.get("data_hash", data_hash) != data_hash)
            )
            if any_rank(other):
                break  # another run's (or this run on other data): older ones are older still
            why = why or verify_share(d, rank)
            if not any_rank(why is not None):
                try:
                    load(d)
                except Exception as e:  # noqa: BLE001 - a bad file DeepSpeed found: try the one before
                    why = f"load failed: {type(e).__name__}: {str(e)[:300]}"
                failed = any_rank(why is not None)
                dirty = dirty or failed  # some rank's engine may hold part of it
                if not failed:
                    assert state is not None
                    if skipped:
                        state[FALLBACK_KEY] = _note(skipped, f"resumed from {Path(ckpt.path).name} (step {state['step']})")
                        if rank == 0:
                            log(state[FALLBACK_KEY])
                    return state
            if why:
                log(f"rank {rank}: checkpoint {ckpt.path} cannot be resumed: {why}")
            step = f" (step {state['step']})" if state and "step" in state else ""
            skipped.append(f"{Path(ckpt.path).name}{step}: {why or 'refused by another rank'}")
    if not skipped:
        return None
    if dirty:
        rebuild()
    note = _note(skipped, "no whole checkpoint of this run is left: started fresh")
    if rank == 0:
        log(note)
    return {FALLBACK_KEY: note}


def _note(skipped: list[str], outcome: str) -> str:
    return f"skipped corrupt checkpoint(s): {'; '.join(skipped)}; {outcome}"
