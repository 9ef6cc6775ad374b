"""MFU: model FLOPs per token x tokens/s over the devices' peak FLOP/s (nanoGPT's estimate)."""

import math

import pytest
import torch

from orchestrator.plan.devices import peak_flops_of
from orchestrator.run.worker.mfu import device_peak_flops, mfu


def test_mfu_on_known_numbers():
    # nanoGPT's own example: GPT-2 124M, 6N + 12LHQT = 6 x 124e6 + 12 x 12 x 12 x 64 x 1024
    # = 857,246,208 FLOPs per token; at 150,000 tokens/s on one A100 (312 TFLOP/s bf16):
    # 1.285869312e14 / 3.12e14 = 0.4121376.
    flops_per_token = 6 * 124e6 + 12 * 12 * 12 * 64 * 1024
    assert flops_per_token == 857_246_208
    assert math.isclose(mfu(flops_per_token, 150_000, 312e12), 0.4121376, rel_tol=1e-9)
    # Eight devices at the same per-device rate: the same MFU.
    assert math.isclose(mfu(flops_per_token, 8 * 150_000, 8 * 312e12), mfu(flops_per_token, 150_000, 312e12))
    assert mfu(1e9, 989e12 / 1e9, 989e12) == pytest.approx(1.0)  # exactly at peak


def test_peak_flops_by_device_name():
    assert peak_flops_of("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_of("NVIDIA H200") == 989e12
    # the form factors torch names, each its own peak (the SXM one for all of them made MFU 15-24% low)
    assert peak_flops_of("NVIDIA H100 PCIe") == 756e12 and peak_flops_of("NVIDIA H100 NVL") == 835e12
    assert peak_flops_of("NVIDIA H200 NVL") == 835e12
    assert peak_flops_of("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops_of("NVIDIA L40S") == 362e12  # not taken for an L4
    assert peak_flops_of("NVIDIA L4") == 121e12
    assert peak_flops_of("Tesla T4") is None  # unlisted: no MFU rather than a wrong one


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_no_peak_on_cpu():
    assert device_peak_flops() is None
