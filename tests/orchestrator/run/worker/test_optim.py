"""Batch geometry and learning-rate schedules."""

import math

import pytest

from orchestrator.run.worker.optim import batch_geometry, deepspeed_config, lr_multiplier


@pytest.mark.parametrize(
    "gb,world,mb,expect", [(16, 1, 16, (16, 1)), (16, 2, 16, (8, 1)), (32, 2, 6, (4, 4)), (512, 8, 32, (32, 2)), (12, 4, 2, (1, 3))]
)
def test_batch_geometry(gb, world, mb, expect):
    g = batch_geometry(gb, world, mb)
    assert (g.micro_batch, g.grad_accum) == expect
    assert g.micro_batch * g.grad_accum * g.world_size == gb


def test_batch_geometry_rejects_indivisible():
    with pytest.raises(ValueError, match="not divisible by 3 workers"):
        batch_geometry(16, 3, 16)


def test_cosine_schedule_shape():
    f = [lr_multiplier(s, 100, 10, "cosine", 0.1, 0.2) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    assert f[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(100, 100, 10, "cosine", 0.1, 0.2) == pytest.approx(0.1)


def test_wsd_schedule_shape():
    f = [lr_multiplier(s, 100, 5, "wsd", 0.0, 0.2) for s in range(100)]
    assert f[4] == pytest.approx(1.0) and f[50] == 1.0 and f[79] == 1.0
    assert f[80] == pytest.approx(1 - 1 / 20) and f[99] == pytest.approx(0.0)


def test_deepspeed_config_precision_by_device():
    g = batch_geometry(32, 2, 8)
    cpu, gpu = deepspeed_config(g, 3, 1.0, False), deepspeed_config(g, 1, 1.0, True)
    assert cpu["bf16"]["enabled"] is False and "data_types" not in cpu and "communication_data_type" not in cpu
    assert cpu["train_batch_size"] == 32 and cpu["gradient_accumulation_steps"] == 2
    assert cpu["zero_optimization"]["stage"] == 3
    # GPU: bf16, gradients accumulated and reduced in fp32
    assert gpu["bf16"]["enabled"] is True and gpu["zero_optimization"]["stage"] == 1
    assert gpu["data_types"] == {"grad_accum_dtype": "fp32"} and gpu["communication_data_type"] == "fp32"


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_gpu_run_at_a_stage_that_accumulates_in_bf16_is_refused(stage):
    with pytest.raises(ValueError, match=f"ZeRO stage {stage} on GPU accumulates gradients in bf16"):
        deepspeed_config(batch_geometry(32, 2, 8), stage, 1.0, True)


def test_weight_decay_only_on_weight_matrices():
    from model import GPT, build_config
    from orchestrator.run.worker.optim import param_groups

    m = GPT(build_config("cpu-xs", "coupled_differential", vocab_size=256))
    decay, no_decay = param_groups(m, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    dec = {names[id(p)].rsplit(".", 1)[-1] for p in decay["params"]}
    nod = {names[id(p)].rsplit(".", 1)[-1] for p in no_decay["params"]}
    assert dec == {"weight", "w1", "w2"}
    assert {"dt", "b1", "b2", "lambda_q1", "lambda_k2"} <= nod and "w1" not in nod
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))
