"""The fused QK transform inside a real DeepSpeed ZeRO-3 engine (one CPU process, gloo).

ZeRO-3 partitions every parameter and gathers a module's own parameters in its pre-forward
hook. The fused and compiled paths read f's weights (`transform.f.weights()`) without
calling f: DeepSpeed gathers a partitioned parameter on attribute access inside a forward
(its ZeROOrderedDict) and keeps it for the Function's backward. A training step through the
engine must give the unpartitioned eager model's loss and gradients.
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
from deepspeed.utils import safe_get_full_grad
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
from model import GPT, build_config
cfg = build_config("cpu-xs", "coupled", vocab_size=97, seq_len=16, dt_init=0.5)
idx = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(0))
ref = GPT(cfg, seed=0, qk_impl="eager")
_, ref_loss = ref(idx, targets=idx)
ref_loss.backward()
expected = {n: p.grad.flatten().tolist() for n, p in ref.named_parameters()}
model = GPT(cfg, seed=0)  # auto: the fused path for CPU training
# persistence threshold 0: no parameter stays gathered between module calls (DeepSpeed's
# default keeps ones under 1e5 elements, i.e. all of f's at this size, and would hide a missing gather)
config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config,
                                  dist_init_required=False)
partitioned = all(p.numel() == 0 for p in engine.module.blocks[0].attn.qk_transform.f.parameters())
_, loss = engine(idx, idx)
engine.backward(loss)
got = {n: safe_get_full_grad(p).flatten().tolist() for n, p in engine.module.named_parameters()}
print("RESULT" + json.dumps({"partitioned": partitioned, "loss": [loss.item(), ref_loss.item()],
                             "got": got, "expected": expected}))
"""


@pytest.mark.slow
def test_fused_transform_trains_under_zero3():
    port = free_port()
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(port)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1])
    assert result["partitioned"]
    assert result["loss"][0] == pytest.approx(result["loss"][1], rel=1e-6)
    assert result["got"].keys() == result["expected"].keys()
    for name, want in result["expected"].items():
        assert result["got"][name] == pytest.approx(want, rel=1e-4, abs=1e-7), name
