"""model.timing: the timed optimizer steps calibration measures (and the step-time benchmark
reports): variant specs, the step's autocast and SDPA contexts, tokens per second per spec."""

import math

import pytest
import torch

from model.timing import StepOptions, build_runs, parse_variant, timed_steps, tokens_per_second


def test_parse_variant():
    assert parse_variant("standard") == ("standard", {})
    assert parse_variant("coupled:integrator=leapfrog,n_steps=2,dt_init=0.5,coupling_hidden=None") == (
        "coupled",
        {"integrator": "leapfrog", "n_steps": 2, "dt_init": 0.5, "coupling_hidden": None},
    )
    with pytest.raises(ValueError, match="not key=value"):
        parse_variant("coupled:leapfrog")


def test_step_options_enter_autocast_and_the_flash_backend():
    with StepOptions(amp="bf16", sdpa="flash").context("cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert not torch.backends.cuda.math_sdp_enabled()  # only the flash backend is allowed
    with StepOptions().context("cpu"):  # auto: no autocast off CUDA, every backend
        assert not torch.is_autocast_enabled("cpu") and torch.backends.cuda.math_sdp_enabled()


def test_tokens_per_second_of_every_spec_standard_first():
    tps = tokens_per_second("cpu-xs", ["coupled:n_steps=2", "standard"], steps=1, batch_size=2, vocab_size=64, seq_len=16, device="cpu")
    assert list(tps) == ["standard", "coupled:n_steps=2"]
    assert all(0 < v < math.inf for v in tps.values())  # 32 tokens over one step's seconds (a loaded machine: slow)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        tokens_per_second("cpu-xs", ["nope"], 1, 1, 64, 16, "cpu")


def test_timed_steps_are_seconds_per_step_and_train_the_model():
    (run,) = build_runs("cpu-xs", ["standard"], 1, 64, 16, "cpu", "auto")
    before = [p.detach().clone() for p in run.model.parameters()]
    wall, cpu, mem = timed_steps(run, 2, StepOptions())
    assert 0 < wall < 60 and cpu > 0 and mem is None  # memory is measured on CUDA only
    assert any(not torch.equal(a, b) for a, b in zip(before, run.model.parameters()))  # AdamW stepped
