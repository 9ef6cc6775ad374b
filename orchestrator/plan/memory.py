"""Per-device memory of a run before launch: model states under its ZeRO stage, plus activations.

Model states (Rajbhandari et al. 2020, "ZeRO", section 3 and figure 1): with Psi parameters,
weights take ``w`` bytes per parameter, gradients ``g`` and the optimizer ``k``; ZeRO stage 1
partitions the optimizer states over the ``N`` data-parallel workers, stage 2 also the
gradients, stage 3 also the weights:

    stage 0: (w + g + k) Psi        stage 2: w Psi + (g + k) Psi / N
    stage 1: (w + g) Psi + k Psi / N  stage 3: (w + g + k) Psi / N

Precision follows the worker (``run.worker.optim.deepspeed_config``): bf16 on GPU (w = g = 2,
k = 12: fp32 master weights and AdamW's two moments, the paper's mixed precision), plus, under
stage 1, the fp32 gradient DeepSpeed's BF16_Optimizer accumulates in (g = 6; a GPU run is
stage 1), fp32 on CPU (w = g = 4; k = 8 for
AdamW's two moments, 12 under ZeRO >= 1, where DeepSpeed keeps its own fp32 copy of the
partition it steps).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", equation 2, no recomputation, no tensor parallelism): ``s b h (34 + 5 a s / h)``
bytes per layer in 16 bits (double in fp32), ``s`` the sequence length, ``b`` the micro-batch,
``h`` d_model, ``a`` heads; plus the logits and their gradient in fp32 (``2 x 4 s b V``).
A variant's own extra activations (the coupled QK network's states) are not counted, nor are a
modern backbone's (a SwiGLU MLP keeps about 5 s b h more per layer than the GELU MLP the 34
assumes; RoPE and QK-norm a few s b h): the estimate is a floor for them, which the report of a GPU run can check against
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.contract import RunSpec

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device of one run: ``weights``, ``gradients``, ``optimizer`` (model states
    under its ZeRO stage) and ``activations`` (one micro-batch, forward and backward)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def states(self) -> float:
        """Model states: weights + gradients + optimizer, bytes."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        """Everything estimated, bytes."""
        return self.states + self.activations


def bytes_per_param(bf16: bool, zero_stage: int) -> tuple[int, int, int]:
    """(w, g, k): bytes per parameter of weights, gradients and optimizer states (module docstring)."""
    if bf16:
        return 2, 6 if zero_stage == 1 else 2, 12
    return 4, 4, 8 if zero_stage == 0 else 12


def model_states(n_params: int, zero_stage: int, world_size: int, bf16: bool) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per device of ``n_params`` parameters trained by
    ``world_size`` data-parallel workers under ``zero_stage`` (ZeRO, section 3).

    Raises:
        ValueError: a stage outside 0-3 or a world size below 1.
    """
    if zero_stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(f"ZeRO stage must be 0-3 and world size >= 1, got stage {zero_stage}, world size {world_size}")
    w, g, k = (b * n_params for b in bytes_per_param(bf16, zero_stage))
    n = world_size
    return (w / n if zero_stage >= 3 else w, g / n if zero_stage >= 2 else g, k / n if zero_stage >= 1 else k)


def activation_bytes(n_layer: int, d_model: int, n_head: int, seq_len: int, micro_batch: int, vocab_size: int, bf16: bool) -> float:
    """Activations of one micro-batch (Korthikanti et al. 2022, equation 2, plus fp32 logits
    and their gradient), bytes."""
    s, b, h, a = seq_len, micro_batch, d_model, n_head
    per_layer = s * b * h * (34 + 5 * a * s / h) * (1 if bf16 else 2)
    return n_layer * per_layer + 2 * 4 * s * b * vocab_size


def estimate(run: RunSpec, bf16: bool | None = None) -> MemoryEstimate:
    """Per-device memory of ``run``: its ``n_params_total`` under its ZeRO stage and worker
    count, activations at its per-worker micro-batch and sequence length. ``bf16``: the
    precision (default: bf16 when the run takes GPUs, as the worker chooses)."""
    r = run.resources
    bf16 = r.gpus_per_worker > 0 if bf16 is None else bf16
    m = run.model
    micro = min(run.train.micro_batch, run.train.global_batch // r.workers or 1)
    weights, grads, optim = model_states(run.n_params_total, r.zero_stage, r.workers, bf16)
    acts = activation_bytes(m["n_layer"], m["d_model"], m["n_head"], run.train.seq_len, micro, m["vocab_size"], bf16)
    return MemoryEstimate(weights, grads, optim, acts)


# What one device can hold at most when a spec declares nothing (GiB): a run past these fits no
# GPU (NVIDIA B300, 288 GB, the largest in 2026) or CPU machine (6 TiB) anyone has, so a
# mistyped size is refused with its number instead of planned at millions of GiB per device.
LARGEST_DEVICE_GIB = {"GPU": 288e9 / GIB, "CPU": 6 * 1024.0}


def memory_problems(runs: list[RunSpec], limit_gb: float | None, shown: int = 5) -> list[str]:
    """One line per run whose estimate exceeds ``limit_gb`` GiB per device (``resources.device_memory_gb``;
    the first ``shown``, then a count); without a declared limit, per run past the largest
    device of its kind (``LARGEST_DEVICE_GIB``); [] when every run fits."""
    over = []
    for r in runs:
        kind = "GPU" if r.resources.gpus_per_worker else "CPU"
        bound = limit_gb if limit_gb is not None else LARGEST_DEVICE_GIB[kind]
        if (e := estimate(r)).total > bound * GIB:
            why = f"resources.device_memory_gb {limit_gb:g}" if limit_gb is not None else f"any {kind} holds ({bound:,.0f} GiB)"
            over.append((r, e, why))
    lines = [
        f"run {r.run_name} ({r.run_id}) needs ~{e.total / GIB:,.3g} GiB per device (states {e.states / GIB:,.3g}, "
        f"activations {e.activations / GIB:,.3g} under ZeRO stage {r.resources.zero_stage} over {r.resources.workers} "
        f"worker(s)) > {why}"
        for r, e, why in over[:shown]
    ]
    if len(over) > shown:
        lines.append(f"... and {len(over) - shown} more run(s) over {over[shown][2]}")
    return lines
