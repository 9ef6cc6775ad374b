"""Resume from DeepSpeed checkpoints without unpickling arbitrary objects.

Why: checkpoints come back from shared storage (NFS, a bucket) that other people and other
jobs can write to, and DeepSpeed's default `TorchCheckpointEngine.load` ends in
``torch.load(weights_only=False)``: a tampered ``*_model_states.pt`` would run its code in
every worker that resumes. `load_engine_checkpoint` swaps the engine's checkpoint engine for
`WeightsOnlyCheckpointEngine` before calling DeepSpeed's own ``engine.load_checkpoint``, so
every file DeepSpeed reads (model states, ZeRO optimizer partitions, the LR scheduler) goes
through ``torch.load(weights_only=True)``. DeepSpeed's files pickle a few of its own plain
data classes besides tensors and containers; exactly those are allow-listed
(`DEEPSPEED_SAFE_GLOBALS`, measured on ZeRO stages 0-3), and ``getattr`` only as an enum
member lookup (how Python 3.11.2 pickles enum members); nothing callable is. Imports
DeepSpeed: import this module where the engine is built, not at package import.
"""

from __future__ import annotations

import enum
import importlib
import pickle
from collections.abc import Callable
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

__all__ = ["UnsafeCheckpointError", "WeightsOnlyCheckpointEngine", "deepspeed_safe_globals", "load_engine_checkpoint"]

# (module, class) of the objects DeepSpeed 0.19 pickles into its own checkpoints: loss-scaler
# state (ZeRO 1-3 optimizer files), the ZeRO stage enum (stage 3) and fragment addresses
# (ZeRO 1-2 partitions). Plain attribute holders: restoring one sets fields, runs no code.
DEEPSPEED_SAFE_GLOBALS: tuple[tuple[str, str], ...] = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds objects that a weights-only load refuses (possible code)."""


def _classes() -> list[type]:
    return [getattr(importlib.import_module(mod), name) for mod, name in DEEPSPEED_SAFE_GLOBALS]


def _enum_member(cls: Any, name: Any) -> Any:
    """What ``builtins.getattr`` may do while loading: look up a member of an allow-listed
    Enum. CPython 3.11.0-3.11.4 (Debian bookworm's 3.11.2, so the CPU image) pickles an Enum
    member as ``getattr(EnumClass, "name")``; any other getattr is refused."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and cls in _classes() and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not a member lookup of an allowed enum")


def deepspeed_safe_globals() -> list[Callable[..., Any] | tuple[Callable[..., Any], str]]:
    """For ``torch.serialization.safe_globals``: the classes of `DEEPSPEED_SAFE_GLOBALS` and
    `_enum_member` standing in for ``builtins.getattr``."""
    return [*_classes(), (_enum_member, "builtins.getattr")]


class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine whose ``load`` is ``torch.load(weights_only=True)``,
    with DeepSpeed's plain state classes allowed; anything else raises `UnsafeCheckpointError`."""

    def load(self, path: str, map_location: Any = None) -> Any:
        try:
            with torch.serialization.safe_globals(deepspeed_safe_globals()):
                return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:
            # torch wraps the unpickler's reason in advice; keep the reason.
            text = str(err)
            why = " ".join(text.split("WeightsUnpickler error:", 1)[-1].split("Check the documentation")[0].split())
            raise UnsafeCheckpointError(
                f"checkpoint file {path} refused by a weights-only load (it pickles objects other "
                f"than tensors, containers and DeepSpeed's state classes): {why}"
            ) from err


def load_engine_checkpoint(engine: Any, load_dir: str, tag: str) -> tuple[str | None, dict | None]:
    """``engine.load_checkpoint(load_dir, tag)`` with optimizer and LR-scheduler states, every
    file read weights-only.

    Returns DeepSpeed's (load_path, client_state). Raises:
        UnsafeCheckpointError: a file pickles something other than tensors, containers and
            `DEEPSPEED_SAFE_GLOBALS` (a tampered or foreign checkpoint); nothing in it ran.
        TypeError: the engine uses a checkpoint engine other than DeepSpeed's torch one (its
            loader cannot be made weights-only here).
    """
    current = engine.checkpoint_engine
    if not isinstance(current, WeightsOnlyCheckpointEngine):
        if type(current) is not TorchCheckpointEngine:
            raise TypeError(f"cannot load {load_dir} weights-only through a {type(current).__name__}")
        engine.checkpoint_engine = WeightsOnlyCheckpointEngine(engine._config)
    return engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
