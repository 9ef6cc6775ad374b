"""Attention diagnostics under a real DeepSpeed ZeRO-3 engine (one CPU process, gloo).

ZeRO-3 partitions every parameter; module calls gather theirs through DeepSpeed's hooks,
but the differential lambdas are read outside a forward. Without a gather the diagnostics
must refuse (they used to read lambda_init silently); with
gather=deepspeed.zero.GatheredParameters they must equal the unpartitioned model's.
Runs in a subprocess: it initialises torch.distributed, which is process-global.
"""

import json
import subprocess
import sys

import pytest

from tests.helpers import free_port

SCRIPT = r"""
import json, os, sys
import torch, deepspeed
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
from model import GPT, build_config
from model.diagnostics import attention_diagnostics, lambda_parameters
model = GPT(build_config("cpu-xs", "coupled_differential", vocab_size=97, seq_len=16), seed=0)
with torch.no_grad():
    for p in lambda_parameters(model):
        p.mul_(6.0)  # lambda far from lambda_init, so reading lambda_init would show
idx = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(0))
expected = attention_diagnostics(model, idx)
config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3},
          "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config,
                                  dist_init_required=False)
partitioned = all(p.numel() == 0 for p in lambda_parameters(engine.module))
try:
    attention_diagnostics(engine.module, idx)
    refused = False
except RuntimeError:
    refused = True
got = attention_diagnostics(engine.module, idx, gather=deepspeed.zero.GatheredParameters)
print("RESULT" + json.dumps({"partitioned": partitioned, "refused": refused, "expected": expected, "got": got}))
"""


@pytest.mark.slow
def test_diagnostics_under_zero3_gather_the_lambdas():
    port = free_port()
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(port)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1])
    assert result["partitioned"] and result["refused"]
    assert result["got"] == pytest.approx(result["expected"], rel=1e-6)
