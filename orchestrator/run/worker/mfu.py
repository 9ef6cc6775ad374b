"""Model FLOPs utilization (MFU): the share of the devices' peak FLOP/s a run's model FLOPs use.

MFU counts model FLOPs (the definition, DESIGN.md "Conventions"), not what kernels execute,
so it is comparable across implementations; it is logged as ``throughput/mfu`` on GPUs
whose peak is known, and absent on CPU.
"""

from __future__ import annotations

import torch

from orchestrator.plan.devices import peak_flops_of


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilization: ``flops_per_token x tokens_per_s / peak_flops``.

    Args:
        flops_per_token: training FLOPs per token (3 x forward: ``RunSpec.flops_per_token``).
        tokens_per_s: tokens the whole run (all workers together) trains per second.
        peak_flops: peak FLOP/s of all the run's devices together (per device x devices).

    Returns:
        A fraction (1.0 = every device at its datasheet peak).

    The estimate of nanoGPT's ``GPT.estimate_mfu`` (karpathy/nanoGPT ``model.py``: achieved
    FLOP/s over promised FLOP/s, after the PaLM paper's appendix B, Chowdhery et al. 2022),
    with the model's own FLOP count in place of nanoGPT's ``6N + 12 L H Q T`` and the device's
    peak in place of the A100's 312e12.
    """
    return flops_per_token * tokens_per_s / peak_flops


def device_peak_flops() -> float | None:
    """Peak bf16 FLOP/s of this process's CUDA device; None on CPU or an unlisted device."""
    if not torch.cuda.is_available():
        return None
    return peak_flops_of(torch.cuda.get_device_name())
