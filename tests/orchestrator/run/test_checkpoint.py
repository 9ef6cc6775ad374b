"""Resume loads DeepSpeed checkpoints weights-only: real engines (one gloo process, CPU), real
checkpoints for ZeRO 0-3 round-trip exactly, and a crafted checkpoint file whose pickle runs
code is refused before its payload runs (while DeepSpeed's default loader does run it: the
negative control that shows the payload is live). The same engines hold the optimizer bytes the
plan's memory estimate assumes (``orchestrator.plan.memory``)."""

from __future__ import annotations

import os
from pathlib import Path

import deepspeed
import pytest
import torch

from orchestrator.plan import memory
from orchestrator.run.worker.optim import batch_geometry, deepspeed_config
from orchestrator.run.worker.safe_load import UnsafeCheckpointError, load_engine_checkpoint
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.slow

TAG = "ckpt"


class Payload:
    """Unpickling this creates `marker`: what a tampered checkpoint would do, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker), 0o777, True))  # exist_ok: loaders may read twice


@pytest.fixture(scope="module")
def process_group():
    saved = {k: os.environ.get(k) for k in ("DS_ACCELERATOR", "LOCAL_RANK")}
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_RANK", "0")  # what a launcher sets; DeepSpeed asserts on it
    if torch.distributed.is_initialized():
        yield
        return
    port = free_port()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)


def engine(stage: int, seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    cfg = deepspeed_config(batch_geometry(8, 1, 8), stage, 1.0, False)
    eng, *_ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=cfg, dist_init_required=False)
    return eng


def train(eng, steps: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 8, generator=gen)
        loss = eng(x).pow(2).mean()
        eng.backward(loss)
        eng.step()


def params(eng) -> list[torch.Tensor]:
    if eng.zero_optimization_stage() == 3:
        with deepspeed.zero.GatheredParameters(list(eng.module.parameters())):
            return [p.detach().clone() for p in eng.module.parameters()]
    return [p.detach().clone() for p in eng.module.parameters()]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_real_checkpoints_round_trip_weights_only(process_group, tmp_path, stage):
    src = engine(stage, seed=0)
    train(src, 3)
    src.save_checkpoint(str(tmp_path), tag=TAG)
    dst = engine(stage, seed=123)  # different initial weights: the load must overwrite them
    assert not all(torch.equal(a, b) for a, b in zip(params(src), params(dst)))
    load_engine_checkpoint(dst, str(tmp_path), TAG)
    assert type(dst.checkpoint_engine).__name__ == "WeightsOnlyCheckpointEngine"
    assert all(torch.equal(a, b) for a, b in zip(params(src), params(dst)))
    assert dst.global_steps == src.global_steps == 3
    assert dst.lr_scheduler.get_last_lr() == src.lr_scheduler.get_last_lr()
    # The optimizer moments came back too: one more identical step keeps them identical.
    train(src, 1)
    train(dst, 1)
    assert all(torch.equal(a, b) for a, b in zip(params(src), params(dst)))


def _tamper(ckpt_dir: Path, pattern: str, marker: Path) -> Path:
    (target,) = sorted((ckpt_dir / TAG).glob(pattern))
    state = torch.load(target, weights_only=False)  # our own file, just written
    state["qkstudy_payload"] = Payload(marker)
    torch.save(state, target)
    return target


@pytest.mark.parametrize("stage,pattern", [(2, "mp_rank_*_model_states.pt"), (2, "*optim_states.pt"), (3, "*optim_states.pt")])
def test_crafted_checkpoint_is_refused_before_its_payload_runs(process_group, tmp_path, stage, pattern):
    ckpt = tmp_path / "ckpt"
    src = engine(stage, seed=0)
    train(src, 2)
    src.save_checkpoint(str(ckpt), tag=TAG)
    marker = tmp_path / "payload-ran"
    tampered = _tamper(ckpt, pattern, marker)

    with pytest.raises(UnsafeCheckpointError, match=tampered.name):
        load_engine_checkpoint(engine(stage, seed=1), str(ckpt), TAG)
    assert not marker.exists(), "the crafted checkpoint ran its payload"

    # Negative control: DeepSpeed's default loader (what resume used before) runs it.
    engine(stage, seed=1).load_checkpoint(str(ckpt), tag=TAG)
    assert marker.exists()


def load_checkpoint_calls(source: str) -> list[int]:
    """Line numbers of ``<anything>.load_checkpoint(...)`` calls in `source`."""
    import ast

    return [
        n.lineno
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "load_checkpoint"
    ]


def test_resume_goes_through_the_weights_only_loader():
    """No product code calls DeepSpeed's ``engine.load_checkpoint`` except safe_load.py (which
    first swaps in the weights-only engine); the scanner finds such a call when there is one."""
    assert load_checkpoint_calls("self.engine.load_checkpoint(d, tag='ckpt')\n") == [1]
    found = {
        str(p.relative_to(REPO)): lines
        for p in sorted((REPO / "orchestrator").rglob("*.py"))
        if (lines := load_checkpoint_calls(p.read_text()))
    }
    assert set(found) == {"orchestrator/run/worker/safe_load.py"}, found


class ByName:
    """Pickles as ``getattr(owner, name)``: how CPython 3.11.0-3.11.4 (the CPU image's
    Debian 3.11.2) pickles an Enum member, and how a crafted file could reach any attribute."""

    def __init__(self, owner, name: str) -> None:
        self.owner, self.name = owner, name

    def __reduce__(self):
        return (getattr, (self.owner, self.name))


def test_enum_members_pickled_by_name_load_and_other_getattrs_do_not(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from orchestrator.run.worker.safe_load import WeightsOnlyCheckpointEngine

    ok = tmp_path / "enum.pt"
    torch.save({"zero_stage": ByName(ZeroStageEnum, "gradients")}, ok)
    assert WeightsOnlyCheckpointEngine().load(str(ok)) == {"zero_stage": ZeroStageEnum.gradients}
    for owner, name in [(LossScaler, "__init__"), (ZeroStageEnum, "__class__"), (ZeroStageEnum, "nope")]:
        bad = tmp_path / "bad.pt"
        torch.save({"x": ByName(owner, name)}, bad)
        with pytest.raises(UnsafeCheckpointError, match="not a member lookup"):
            WeightsOnlyCheckpointEngine().load(str(bad))


def _optimizer_bytes(eng) -> int:
    """Bytes the engine's optimizer holds: AdamW's moments and, under ZeRO 1-2, DeepSpeed's
    fp32 copy of the partition it steps (every distinct tensor counted once)."""
    opt = eng.optimizer
    tensors = {id(t): t for st in getattr(opt, "optimizer", opt).state.values() for k, t in st.items() if k != "step"}
    for t in getattr(opt, "single_partition_of_fp32_groups", []):
        tensors[id(t)] = t
    return sum(t.numel() * t.element_size() for t in tensors.values())


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_optimizer_bytes_are_what_the_memory_estimate_assumes(process_group, stage):
    eng = engine(stage, seed=0)
    train(eng, 1)
    n = sum(p.numel() for p in eng.module.parameters())
    _, _, optim = memory.model_states(n, stage, world_size=1, bf16=False)
    measured = _optimizer_bytes(eng)
    # 8 bytes/param at stage 0, 12 under ZeRO 1-2, whose flat partition DeepSpeed pads to its
    # alignment (161 parameters -> 162 here)
    assert optim <= measured <= optim + 12 * 8
    # negative control: stage 0's accounting misses DeepSpeed's fp32 copy under ZeRO 1-2
    stage0 = memory.model_states(n, 0, 1, False)[2]
    assert (stage0 <= measured <= stage0 + 12 * 8) == (stage == 0)
