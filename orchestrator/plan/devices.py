"""Accelerators the planner knows by name: peak dense bf16 FLOP/s and memory per device.

From the vendors' datasheets (NVIDIA H100/H200 SXM, A100, L40S, A10G, L4; dense, without
sparsity). The worker's MFU (``orchestrator.run.worker.mfu``) and the plan's device-hours from
a declared MFU (``orchestrator.plan.throughput``) read the same figures.
"""

from __future__ import annotations

# A CUDA device name matches the first key it contains ("NVIDIA H100 80GB HBM3" -> H100).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}


def peak_flops_of(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of a device by its name (``"NVIDIA H100 80GB HBM3"``, ``"h100"``;
    case-insensitive), or None when ``PEAK_FLOPS`` does not list it."""
    name = device_name.upper()
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)
