"""A real tiny `qkstudy run` sets each corpus's unigram perplexity on the study's MLflow
experiment, and a re-run of the finished study sets it again without starting Ray, from
the prepared data alone (also data prepared before the manifest cached it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from data_pipeline.loader import TokenLoader
from data_pipeline.unigram import unigram_perplexity

pytestmark = pytest.mark.slow

SPEC = """\
name: unigram-tag
corpus: {source: stdlib, max_documents: 60}
tokenizer: {vocab_size: 512}
scales: [cpu-xs]
variants: [standard]
budget: {mode: tokens, tokens: 2048}
train: {global_batch: 8, seq_len: 64}
eval: {num_evals: 1, max_windows: 4, final_max_windows: 4}
resources: {workers: 1, cpus_per_worker: 1}
"""
PPL_TAG, TOKENS_TAG = "qkstudy.unigram_ppl.stdlib", "qkstudy.unigram_val_tokens.stdlib"


def _qk(*args, cwd, env):
    exe = Path(sys.executable).with_name("qkstudy")
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _experiment(d: Path):
    client = MlflowClient(f"sqlite:///{d / 'runs/unigram-tag/mlflow.db'}")
    return client, client.get_experiment_by_name("unigram-tag")


def test_run_and_finished_rerun_set_the_unigram_tag(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"QKSTUDY_CACHE": str(tmp_path / "cache")}
    res = _qk("run", "s.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    (plan,) = json.loads(_qk("plan", "s.yaml", "--json", cwd=tmp_path, env=env).stdout)
    data = tmp_path / "cache" / plan["data_hash"]
    manifest = json.loads((data / "manifest.json").read_text())
    # the tag is the add-one unigram perplexity of the val split, recomputed here from the shards
    tokens = {s: np.concatenate(TokenLoader(str(data), s, 64, 1, seed=0)._parts) for s in ("train", "val")}
    expected = unigram_perplexity(tokens["train"], tokens["val"], 512)
    client, exp = _experiment(tmp_path)
    assert float(exp.tags[PPL_TAG]) == pytest.approx(expected, rel=1e-12) == manifest["unigram"]["val_ppl"]
    assert int(exp.tags[TOKENS_TAG]) == tokens["val"].size == manifest["splits"]["val"]["tokens"]
    assert f"unigram perplexity {expected:.2f}" in res.stderr

    # A store and data from before this feature: no tag, no manifest entry. The re-run of the
    # finished study skips Ray and still records it, counted from the shards.
    client.delete_experiment_tag(exp.experiment_id, PPL_TAG)
    client.delete_experiment_tag(exp.experiment_id, TOKENS_TAG)
    del manifest["unigram"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    res = _qk("run", "s.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 0 and "skipped (Ray not started)" in res.stderr, res.stderr[-3000:]
    _, exp = _experiment(tmp_path)
    assert float(exp.tags[PPL_TAG]) == pytest.approx(expected, rel=1e-12)
    assert int(exp.tags[TOKENS_TAG]) == tokens["val"].size

    # its data gone (cache cleared): the re-run says so and still succeeds
    client.delete_experiment_tag(exp.experiment_id, PPL_TAG)
    (data / "manifest.json").unlink()
    res = _qk("run", "s.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 0 and "unigram perplexity not recorded" in res.stderr, res.stderr[-3000:]
    assert PPL_TAG not in _experiment(tmp_path)[1].tags
