"""Pick the checkpoint a run resumes from: the newest whole one of this run, else a fresh start.

Ray Train hands a restarted worker group its latest checkpoint and keeps the ones before it
(``CheckpointConfig(num_to_keep=2)`` in ``run.driver.packing``). A latest checkpoint that is damaged
(a truncated optimizer file, a share whose save never finished: ``run.ckpt_format``) is
skipped for the one before it, and the run says so: a ``[qkstudy]`` line in the worker log
and the ``resume_fallback`` tag on its MLflow run (``Recorder.start``). When none is whole
the run starts fresh, with that said the same way. Every rank takes the same decision: each
checks its own share, and the ranks agree through ``any_rank`` (an all-reduce) before anyone
loads, so no rank resumes from a checkpoint another rank refused. Checkpoints of other runs
(an earlier run of a pack, this run on other data) end the search silently, as before:
older checkpoints are older runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.run.ckpt_format import read_state, verify_share

__all__ = ["FALLBACK_KEY", "candidates", "restore_newest_whole"]

FALLBACK_KEY = "resume_fallback"  # key in the returned state, and the MLflow tag's bare name (tracking.tag)


def candidates() -> list[Any]:
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
