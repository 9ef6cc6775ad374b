"""A torn or damaged checkpoint is never resumed: manifests written after the save
(``run.checkpoint``, checked on their own in ``test_ckpt_format.py``) and the newest-whole
pick (``restore_newest_whole``) over real Ray Train ``Checkpoint`` objects on real directories, loaded
with torch's weights-only loader. One rank here (``any_rank`` is the identity); the
multi-rank, DeepSpeed path is in ``test_torn_checkpoint.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ray.train as ray_train
import torch

from orchestrator.run.checkpoint import FALLBACK_KEY, manifest_name, restore_newest_whole, write_manifest
from orchestrator.run.checkpoint import STATE_FILE as STATE


def _save(root: Path, name: str, step: int, run_id: str = "r1", world: int = 1, manifest: bool = True) -> Path:
    """A checkpoint as the worker writes one: a state file, a tensor file, the manifest last."""
    d = root / name
    (d / "ckpt").mkdir(parents=True)
    torch.save({"w": torch.full((256,), float(step))}, d / "ckpt" / "model_states.pt")
    (d / STATE).write_text(json.dumps({"step": step, "run_id": run_id, "mlflow_run_id": "m", "data_hash": "h"}))
    if manifest:
        for r in range(world):
            write_manifest(d, r, world)
    return d


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


class Engine:
    """What the loader fills: the last tensor loaded (weights-only, as the worker's loader)."""

    def __init__(self) -> None:
        self.w: Any = None  # a tensor once loaded
        self.rebuilt = 0

    def load(self, d: str) -> None:
        self.w = torch.load(Path(d) / "ckpt" / "model_states.pt", weights_only=True)["w"]

    def rebuild(self) -> None:
        self.w, self.rebuilt = None, self.rebuilt + 1


def _restore(cands: list[Path], eng: Engine, log: list[str], run_id: str = "r1") -> dict | None:
    return restore_newest_whole(
        [ray_train.Checkpoint.from_directory(str(c)) for c in cands],
        eng.load,
        run_id=run_id,
        data_hash="h",
        rank=0,
        any_rank=lambda f: f,
        log=log.append,
        rebuild=eng.rebuild,
    )


def test_a_save_that_stopped_before_its_manifest_is_never_loaded(tmp_path):
    old = _save(tmp_path, "checkpoint_a", 10)
    torn = _save(tmp_path, "checkpoint_b", 20, manifest=False)
    (torn / manifest_name(0)).with_suffix(".json.tmp").write_text("{")  # killed while writing it
    # another rank wrote its manifest: the directory is of the manifest era, rank 0's is missing
    write_manifest(torn, 1, 2)
    eng, log = Engine(), []
    state = _restore([torn, old], eng, log)
    assert state["step"] == 10 and float(eng.w[0]) == 10.0
    assert "checkpoint_b (step 20): manifest qkstudy_manifest.rank0.json missing" in state[FALLBACK_KEY]
    assert state[FALLBACK_KEY].endswith("resumed from checkpoint_a (step 10)") and log[-1] == state[FALLBACK_KEY]


def test_truncated_latest_falls_back_to_the_previous_and_says_so(tmp_path):
    prev, latest = _save(tmp_path, "checkpoint_1", 10), _save(tmp_path, "checkpoint_2", 20)
    _truncate(latest / "ckpt" / "model_states.pt")
    eng, log = Engine(), []
    state = _restore([latest, prev], eng, log)
    assert state["step"] == 10 and float(eng.w[0]) == 10.0 and eng.rebuilt == 0
    assert "checkpoint_2 (step 20): ckpt/model_states.pt has" in state[FALLBACK_KEY] and "truncated" in state[FALLBACK_KEY]
    assert any("rank 0: checkpoint" in line and "checkpoint_2" in line for line in log)


def test_whole_latest_resumes_with_no_note(tmp_path):
    prev, latest = _save(tmp_path, "checkpoint_1", 10), _save(tmp_path, "checkpoint_2", 20)
    eng, log = Engine(), []
    state = _restore([latest, prev], eng, log)
    assert state["step"] == 20 and float(eng.w[0]) == 20.0 and FALLBACK_KEY not in state and log == []


def test_no_whole_checkpoint_starts_fresh_with_a_clean_engine_and_says_so(tmp_path):
    # a checkpoint written before manifests existed whose file is damaged: the load itself fails
    legacy = _save(tmp_path, "checkpoint_1", 10, manifest=False)
    latest = _save(tmp_path, "checkpoint_2", 20)
    _truncate(legacy / "ckpt" / "model_states.pt")
    (latest / STATE).write_text('{"step": 2')  # the state file itself torn
    eng, log = Engine(), []
    state = _restore([latest, legacy], eng, log)
    assert "step" not in state and eng.rebuilt == 1 and eng.w is None
    note = state[FALLBACK_KEY]
    assert "checkpoint_2: qkstudy_state.json missing or unreadable" in note
    assert "checkpoint_1 (step 10): load failed:" in note and note.endswith("started fresh")


def test_checkpoints_of_another_run_end_the_search_silently(tmp_path):
    other = _save(tmp_path, "checkpoint_1", 10, run_id="other")
    eng, log = Engine(), []
    assert _restore([other], eng, log) is None and eng.w is None and log == []
    mine = _save(tmp_path, "checkpoint_0", 5)  # older than the other run's: never reached
    assert _restore([other, mine], eng, log) is None and eng.w is None
