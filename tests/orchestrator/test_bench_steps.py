"""The steps benchmark compares like with like: its bare PyTorch loop trains the same run as
the stack (same weights, batches, optimizer, schedule, clipping, gradient accumulation), so its
per-step losses equal the stack's logged ``train/loss`` under ZeRO 0 and, with micro-batches of
2 (4 accumulation steps), under ZeRO 2; other weights (negative control) do not."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow.tracking import MlflowClient

from benchmarks import plain_loop
from benchmarks.bare_steps import bench_study, run_bare, run_stack
from orchestrator.track.tracking import default_tracking_uri

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("zero_stage,micro_batch", [(0, None), (2, 2)])
def test_bare_loop_trains_the_stacks_run_step_for_step(local_ray, tmp_path, capsys, zero_stage, micro_batch):
    study = {
        **bench_study("steps-check", zero_stage, 20, "cpu-xs"),
        "corpus": {"source": "stdlib", "max_documents": 60},
        "tokenizer": {"vocab_size": 512},
    }
    study["train"] = {**study["train"], "log_every_steps": 1, **({"micro_batch": micro_batch} if micro_batch else {})}
    tps, steps_tps, data_path, run = run_stack(study, tmp_path)
    assert tps > 0 and steps_tps > 0 and run.train.micro_batch == (micro_batch or 8)
    c = MlflowClient(default_tracking_uri(tmp_path / "steps-check"))
    exp = c.get_experiment_by_name("steps-check")
    (r,) = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    stack = [m.value for m in sorted(c.get_metric_history(r.info.run_id, "train/loss"), key=lambda m: m.step)]
    bare_tps, bare = run_bare(run, data_path)
    assert bare_tps > 0 and len(bare) == len(stack) == 20
    assert max(abs(a - b) for a, b in zip(stack, bare)) < 1e-4, list(zip(stack, bare))
    _, other = run_bare(run, data_path, seed=run.seed + 1)
    assert max(abs(a - b) for a, b in zip(stack, other)) > 1e-3
    # benchmarks.plain_loop (the whole-run benchmark's plain arm) plans the same run from its spec
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    capsys.readouterr()
    assert plain_loop.main([str(tmp_path / "study.yaml"), "--data", data_path]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["tokens"], out["steps"], out["threads"]) == (run.tokens, 20, 2) and 0 < out["step_s"] < out["process_s"]
