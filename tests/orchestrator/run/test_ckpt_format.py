"""The checkpoint format (``run.checkpoint``) on real files: two ranks' shares saved each into
its own folder and merged into one (as a branch point is), their manifests round-tripped, and
each kind of damage found by the rank that owns the damaged file (negative controls: a
truncated file, a changed byte, a missing file, a missing rank, a torn state file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.run.checkpoint import (
    CKPT_TAG,
    STATE_FILE,
    has_manifest,
    manifest_name,
    merge_share,
    read_state,
    save_share,
    verify_share,
    write_manifest,
)


class _Engine:
    """Writes what DeepSpeed's save writes per rank: rank 0 the model states and ``latest``,
    every rank its own optimizer partition."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def save_checkpoint(self, d: str, tag: str) -> None:
        (Path(d) / tag).mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            (Path(d) / tag / "mp_rank_00_model_states.pt").write_bytes(b"m" * 4096)
            (Path(d) / "latest").write_text(tag)
        (Path(d) / tag / f"zero_pp_rank_{self.rank}_optim_states.pt").write_bytes(bytes([self.rank]) * 8192)


def _merged(root: Path, world: int = 2) -> Path:
    """A ``world``-rank checkpoint saved share by share and merged into ``root/ckpt-dir``."""
    into = root / "ckpt-dir"
    for r in range(world):
        share = into / f".share-rank{r}"
        save_share(_Engine(r), share, {"step": 7, "run_id": "t"}, r, world)
        merge_share(share, into)
    return into


def test_shares_saved_apart_and_merged_round_trip_with_one_manifest_per_rank(tmp_path):
    d = _merged(tmp_path)
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) == sorted(
        [
            f"{CKPT_TAG}/mp_rank_00_model_states.pt",
            f"{CKPT_TAG}/zero_pp_rank_0_optim_states.pt",
            f"{CKPT_TAG}/zero_pp_rank_1_optim_states.pt",
            "latest",
            STATE_FILE,
            manifest_name(0),
            manifest_name(1),
        ]
    )
    m0, m1 = (json.loads((d / manifest_name(r)).read_text()) for r in (0, 1))
    assert (m0["rank"], m0["world"], m1["rank"], m1["world"]) == (0, 2, 1, 2)
    assert sorted(m1["files"]) == [f"{CKPT_TAG}/zero_pp_rank_1_optim_states.pt"]  # only what rank 1 wrote
    assert sorted(m0["files"]) == sorted(
        [f"{CKPT_TAG}/mp_rank_00_model_states.pt", f"{CKPT_TAG}/zero_pp_rank_0_optim_states.pt", "latest", STATE_FILE]
    )
    assert m0["files"][f"{CKPT_TAG}/mp_rank_00_model_states.pt"][0] == 4096
    assert has_manifest(d) and verify_share(d, 0) is None and verify_share(d, 1) is None
    assert verify_share(d, 2) is None  # beyond the saving world: nothing of its own
    assert read_state(d) == ({"step": 7, "run_id": "t"}, None)
    assert not list(d.rglob("*.tmp")) and not list(d.glob(".share-rank*"))


def test_a_truncated_file_is_found_by_the_rank_that_saved_it(tmp_path):
    d = _merged(tmp_path)
    f = d / CKPT_TAG / "zero_pp_rank_1_optim_states.pt"
    f.write_bytes(f.read_bytes()[:100])
    assert verify_share(d, 0) is None  # rank 0's share is whole
    assert verify_share(d, 1) == f"{CKPT_TAG}/zero_pp_rank_1_optim_states.pt has 100 bytes, 8192 were saved (truncated or torn)"


def test_a_changed_byte_and_a_missing_file_are_found(tmp_path):
    d = _merged(tmp_path)
    f = d / CKPT_TAG / "mp_rank_00_model_states.pt"
    f.write_bytes(b"m" * 4095 + b"x")
    assert verify_share(d, 0) == f"{CKPT_TAG}/mp_rank_00_model_states.pt differs from what was saved (SHA-256 mismatch)"
    f.unlink()
    assert verify_share(d, 0) == f"{CKPT_TAG}/mp_rank_00_model_states.pt is missing"


def test_a_missing_rank_is_found_by_rank_0_and_by_the_rank_itself(tmp_path):
    d = _merged(tmp_path)
    (d / manifest_name(1)).unlink()  # rank 1's save never finished
    assert verify_share(d, 0) == "rank(s) [1] of 2 never finished their share (no manifest)"
    assert "manifest qkstudy_manifest.rank1.json missing" in verify_share(d, 1)
    (d / manifest_name(0)).write_text("{")  # rank 0 killed while writing it (a rename never half-writes; a bad disk)
    assert "never completed" in verify_share(d, 0)


def test_a_torn_state_file_and_a_legacy_folder(tmp_path):
    d = _merged(tmp_path)
    (d / STATE_FILE).write_text('{"step": 7')
    state, why = read_state(d)
    assert state is None and why == f"{STATE_FILE} missing or unreadable (JSONDecodeError)"
    assert "has 10 bytes" in verify_share(d, 0)  # rank 0's share lists the state file too
    legacy = tmp_path / "legacy"
    (legacy / CKPT_TAG).mkdir(parents=True)
    assert not has_manifest(legacy) and verify_share(legacy, 0) is None  # loaded unverified
    write_manifest(legacy, 1, 2)
    assert "never completed" in verify_share(legacy, 0)  # of the manifest era: rank 0's is missing


def test_two_ranks_writing_one_name_is_refused(tmp_path):
    into = tmp_path / "ckpt-dir"
    for _ in range(2):
        share = into / ".share"
        save_share(_Engine(0), share, {"step": 1}, 0, 1)
        if (into / "latest").exists():
            with pytest.raises(FileExistsError, match="two ranks saved the same checkpoint file"):
                merge_share(share, into)
        else:
            merge_share(share, into)
