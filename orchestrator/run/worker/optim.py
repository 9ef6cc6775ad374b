"""Batch geometry, learning-rate schedules and the DeepSpeed config: derived in one place.

Every worker calls these with the run's recipe and its world size, so 1-worker and
N-worker runs of one RunSpec take identical optimizer steps over identical global batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class BatchGeometry:
    """How one optimizer step's global batch is split.

    global_batch = micro_batch x grad_accum x world_size (sequences).
    """

    global_batch: int
    world_size: int
    micro_batch: int
    grad_accum: int

    @property
    def per_rank(self) -> int:
        """Sequences each rank processes per optimizer step."""
        return self.micro_batch * self.grad_accum


def batch_geometry(global_batch: int, world_size: int, max_micro_batch: int) -> BatchGeometry:
    """Largest micro-batch <= ``max_micro_batch`` that divides the per-rank share exactly.

    Raises:
        ValueError: ``global_batch`` is not divisible by ``world_size``.
    """
    if global_batch % world_size:
        raise ValueError(f"global batch {global_batch} is not divisible by {world_size} workers")
    per_rank = global_batch // world_size
    micro = max(d for d in range(1, min(max_micro_batch, per_rank) + 1) if per_rank % d == 0)
    return BatchGeometry(global_batch, world_size, micro, per_rank // micro)


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str, min_lr_ratio: float, decay_fraction: float) -> float:
    """LR multiplier (of the peak) before optimizer step ``step`` (0-based).

    cosine: linear warmup over ``warmup_steps``, then cosine from 1 to ``min_lr_ratio`` at
    ``total_steps`` (the GPT-3 / nanoGPT schedule). wsd (warmup-stable-decay, Hu et al.
    2024, MiniCPM): warmup, constant 1, then linear decay to ``min_lr_ratio`` over the last
    ``decay_fraction`` of the steps.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "wsd":
        decay_steps = max(1, int(round(decay_fraction * total_steps)))
        start = total_steps - decay_steps
        if step < start:
            return 1.0
        return 1.0 - (1 - min_lr_ratio) * min(1.0, (step - start + 1) / decay_steps)
    raise ValueError(f"unknown schedule {schedule!r}; allowed: cosine, wsd")


# Parameters of dim >= 2 that are not weight matrices: the coupled transform's per-head step
# dt [H, 1] and its MLP biases b1 [groups, hidden], b2 [groups, head_dim].
_NO_DECAY_LEAVES = ("dt", "b1", "b2", "bias")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on weight matrices only (linear, embedding and coupling-MLP
    weights), not on biases, norm gains, lambda vectors or the learned step dt (GPT-2 /
    nanoGPT practice; decaying dt would pull every coupled model towards standard attention)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        leaf = name.rsplit(".", 1)[-1]
        (no_decay if p.dim() < 2 or leaf in _NO_DECAY_LEAVES else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def deepspeed_config(geom: BatchGeometry, zero_stage: int, grad_clip: float, on_gpu: bool) -> dict[str, Any]:
    """DeepSpeed config for one run: ZeRO stage, batch split, clipping, precision.

    Precision is chosen by device: fp32 on CPU (CPU bf16 matmuls are slow and the study's CPU
    numbers must be exact across worker counts); on GPU bf16 weights and activations with
    gradients accumulated over the micro-steps and reduced in fp32. What DeepSpeed 0.19 builds
    for bf16 (tests/orchestrator/run/worker/test_deepspeed_precision.py): stage 0 an
    ``FP16_UnfusedOptimizer`` that accumulates in bf16 and refuses ``grad_accum_dtype: fp32``;
    stage 1 with it a ``BF16_Optimizer`` (fp32 accumulation and master weights); stages 2 and
    3 their ZeRO optimizers, which ignore it and accumulate in bf16. The study's effects are a
    few hundredths of a nat, so a GPU run is stage 1 (``ResourcesSpec`` refuses the others).

    Raises:
        ValueError: ``on_gpu`` with a stage other than 1.
    """
    if on_gpu and zero_stage != 1:
        raise ValueError(f"ZeRO stage {zero_stage} on GPU accumulates gradients in bf16; only stage 1 accumulates in fp32")
    precision: dict[str, Any] = {"bf16": {"enabled": False}}
    if on_gpu:
        precision = {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}
    return {
        "train_batch_size": geom.global_batch,
        "train_micro_batch_size_per_gpu": geom.micro_batch,
        "gradient_accumulation_steps": geom.grad_accum,
        "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": zero_stage},
        **precision,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
