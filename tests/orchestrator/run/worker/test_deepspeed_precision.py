"""What a real DeepSpeed engine builds from `deepspeed_config`, per ZeRO stage and precision
(one process, gloo; CPU stands in for the GPU: DeepSpeed picks the optimizer from the config,
not the device). The GPU config (bf16, stage 1) gets the BF16_Optimizer, which accumulates in
fp32; the controls show why the other stages are refused on GPU: stage 0 refuses fp32
accumulation, without it builds an optimizer that accumulates in bf16, and stages 2 and 3 build
their ZeRO optimizers whatever ``grad_accum_dtype`` says. The CPU config (fp32) builds what it
did: torch's AdamW at stage 0, the ZeRO optimizers above."""

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, free_port

pytestmark = pytest.mark.slow

PROBE = """
import json, os, logging, torch, deepspeed
from orchestrator.run.worker.optim import batch_geometry, deepspeed_config
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
deepspeed.init_distributed(dist_backend="gloo")
logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
geom = batch_geometry(4, 1, 2)  # two micro-steps per optimizer step
gpu = deepspeed_config(geom, 1, 1.0, True)
cases = {{f"cpu{{s}}": deepspeed_config(geom, s, 1.0, False) for s in (0, 1, 2, 3)}}
cases["gpu1"] = gpu
for s in (0, 2, 3):  # what the refused GPU stages would build
    cases[f"gpu{{s}}"] = {{**gpu, "zero_optimization": {{"stage": s}}}}
cases["gpu0-bf16-accum"] = {{k: v for k, v in cases["gpu0"].items() if k != "data_types"}}
out = {{}}
for name, cfg in cases.items():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    try:
        _, opt, _, _ = deepspeed.initialize(model=m, optimizer=torch.optim.AdamW(m.parameters()), config=cfg, dist_init_required=False)
        out[name] = type(opt).__name__
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)[:120]
print(json.dumps(out))
"""


def test_each_stage_and_precision_builds_the_optimizer_said():
    res = subprocess.run([sys.executable, "-c", PROBE.format(port=free_port())], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    built = json.loads(res.stdout.strip().splitlines()[-1])
    assert built["gpu1"] == "BF16_Optimizer"  # fp32 accumulation and master weights
    assert built["gpu0"].startswith("NotImplementedError: unsupported mix of model_dtype=torch.bfloat16 and grad_accum_dtype=torch.float32")
    assert built["gpu0-bf16-accum"] == "FP16_UnfusedOptimizer"  # what `{stage: 0}` alone built: bf16 accumulation
    assert (built["gpu2"], built["gpu3"]) == ("DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3")
    assert built["cpu0"] == "AdamW" and built["cpu1"] == built["cpu2"] == "DeepSpeedZeroOptimizer"
    assert built["cpu3"] == "DeepSpeedZeroOptimizer_Stage3"
