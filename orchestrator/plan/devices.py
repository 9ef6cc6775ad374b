"""Accelerators the planner knows by name: peak dense bf16 FLOP/s and memory per device.

From the vendors' datasheets (NVIDIA H100 SXM / PCIe / NVL, H200 SXM / NVL, A100, L40S, A10G,
L4; dense, i.e. half the datasheets' "with sparsity" figures). The H100's three form factors
differ by clock and SM count: 989 (SXM), 756 (PCIe), 835 (NVL) TFLOP/s; taking a PCIe card for
an SXM one puts its MFU 24% low. The worker's MFU (``orchestrator.run.worker.mfu``) and the plan's device-hours from
a declared MFU (``orchestrator.plan.throughput``) read the same figures.
"""

from __future__ import annotations

# A CUDA device name matches the first key it contains, so a form factor comes before its family
# ("NVIDIA H100 PCIe" -> H100 PCIE; "NVIDIA H100 80GB HBM3", the SXM part's name -> H100).
PEAK_FLOPS = {
    "H100 PCIE": 756e12,
    "H100 NVL": 835e12,
    "H200 NVL": 835e12,
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
}


def peak_flops_of(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of a device by its name (``"NVIDIA H100 80GB HBM3"``, ``"h100"``;
    case-insensitive), or None when ``PEAK_FLOPS`` does not list it."""
    name = device_name.upper()
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)
