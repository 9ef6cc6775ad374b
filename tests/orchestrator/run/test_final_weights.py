"""Final weights: logged to a real MLflow store (SQLite + file artifacts), loaded back in a fresh
process without DeepSpeed into identical logits, refused when the file was changed; evaluate
on a model with a known loss; sampling; and (slow) real DeepSpeed ZeRO-2 and ZeRO-3 engines."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.artifacts import download_artifacts
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file, save_file

from data_pipeline import CorpusConfig, TokenizerConfig, prepare
from model import GPT, ModelConfig
from orchestrator.run.final_weights import (
    ARTIFACT_DIR,
    CONFIG_FILE,
    DIGEST_TAG,
    LEGACY_WEIGHTS_FILE,
    META_FILE,
    MODEL_TAG,
    WEIGHTS_FILE,
    FinalWeightsError,
    evaluate,
    load_run,
    log_final_weights,
    sample,
    sha256_file,
)
from tests.helpers import REPO, free_port, mlflow_store

MQAR = {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4, "num_train_examples": 64, "num_val_examples": 40}
CFG: dict[str, Any] = {"vocab_size": 64, "seq_len": 32, "n_layer": 2, "d_model": 32, "n_head": 4, "variant": "coupled"}


@pytest.fixture(scope="module")
def mqar_data():
    return prepare(CorpusConfig(source="mqar", mqar=MQAR), TokenizerConfig(), progress=False)


def _store(tmp_path: Path, data_path: str) -> tuple[str, str]:
    """A SQLite MLflow store with file artifacts in tmp_path; returns (uri, run id)."""
    uri = mlflow_store(tmp_path)
    c = MlflowClient(uri)
    exp = c.create_experiment("fw", artifact_location=(tmp_path / "artifacts").as_uri())
    run = c.create_run(exp)
    c.log_param(run.info.run_id, "data_path", data_path)
    c.log_param(run.info.run_id, "seq_len", 32)
    return uri, run.info.run_id


def _uniform_model() -> GPT:
    """Zero LM head: every logit 0, so the loss of any target is ln(vocab) exactly."""
    m = GPT(ModelConfig(**CFG), seed=3)
    with torch.no_grad():
        m.lm_head.weight.zero_()
    return m


# Loads in a process that never imports DeepSpeed, writes its logits on the probe input.
LOADER = textwrap.dedent("""
    import sys, torch
    from orchestrator.run.final_weights import load_run
    run = load_run(sys.argv[1], sys.argv[2])
    x = torch.load(sys.argv[3], weights_only=True)
    assert "deepspeed" not in sys.modules
    torch.save(run.model(x)[0], sys.argv[4])
""")


def _load_elsewhere(uri: str, run_id: str, x: torch.Tensor, tmp_path: Path) -> torch.Tensor:
    torch.save(x, tmp_path / "x.pt")
    p = subprocess.run(
        [sys.executable, "-c", LOADER, uri, run_id, str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return torch.load(tmp_path / "y.pt", weights_only=True)


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_logged_weights_load_in_a_fresh_process_and_evaluate_to_the_known_loss(tmp_path, mqar_data):
    uri, run_id = _store(tmp_path, mqar_data.path)
    m = _uniform_model()
    with torch.no_grad():
        m.blocks[0].attn.out.weight.mul_(3.0)  # not the init: a load must carry it
    digest = log_final_weights(uri, run_id, m.state_dict(), CFG, {"step": 7})
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.tags[DIGEST_TAG] == digest
    model = MlflowClient(uri).get_logged_model(run.data.tags[MODEL_TAG])
    meta = json.loads(Path(download_artifacts(artifact_uri=f"{model.artifact_location}/{META_FILE}", dst_path=str(tmp_path))).read_text())
    assert meta["sha256"] == digest and meta["step"] == 7 and meta["dtype"] == "float32"

    x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    m.eval()
    assert torch.equal(_load_elsewhere(uri, run_id, x, tmp_path), m(x)[0])

    loaded = load_run(uri, run_id)
    assert loaded.digest == digest and loaded.seq_len == 32 and loaded.config == ModelConfig(**CFG)
    loss = evaluate(loaded)  # the run's own data_path
    assert abs(loss - math.log(64)) < 1e-5
    assert abs(evaluate(loaded, mqar_data.path, max_windows=5, batch_size=2) - math.log(64)) < 1e-5


def test_final_weights_are_a_logged_model_of_the_run_in_safetensors(tmp_path, mqar_data):
    uri, run_id = _store(tmp_path, mqar_data.path)
    m = GPT(ModelConfig(**CFG, tied_head=True), seed=4)  # a tied head: two names, one storage
    digest = log_final_weights(uri, run_id, m.state_dict(), {**CFG, "tied_head": True})
    client = MlflowClient(uri)
    model = client.get_logged_model(client.get_run(run_id).data.tags[MODEL_TAG])
    assert model.source_run_id == run_id and model.name == ARTIFACT_DIR and str(model.status) == "READY"
    assert model.tags[DIGEST_TAG] == digest and model.params["variant"] == "coupled"
    folder = Path(download_artifacts(artifact_uri=model.artifact_location, dst_path=str(tmp_path / "dl")))
    assert {WEIGHTS_FILE, CONFIG_FILE, META_FILE} <= {p.name for p in folder.iterdir()}
    assert sha256_file(folder / WEIGHTS_FILE) == digest
    tensors = load_file(folder / WEIGHTS_FILE)  # tensors only: no pickle, no code
    assert set(tensors) == set(m.state_dict()) and torch.equal(tensors["lm_head.weight"], tensors["tok_emb.weight"])
    assert client.list_artifacts(run_id) == []  # not logged twice, as run artifacts too
    x = torch.randint(0, 64, (1, 32), generator=torch.Generator().manual_seed(1))
    assert torch.equal(load_run(uri, run_id).model(x)[0], m.eval()(x)[0])


def test_a_run_logged_before_logged_models_still_loads(tmp_path, mqar_data):
    """The legacy layout: final_weights/model.pt among the run's artifacts (torch.save)."""
    uri, run_id = _store(tmp_path, mqar_data.path)
    m = _uniform_model()
    d = tmp_path / "legacy"
    d.mkdir()
    torch.save(m.state_dict(), d / LEGACY_WEIGHTS_FILE)
    digest = sha256_file(d / LEGACY_WEIGHTS_FILE)
    (d / CONFIG_FILE).write_text(json.dumps(CFG))
    (d / META_FILE).write_text(json.dumps({"sha256": digest}))
    client = MlflowClient(uri)
    client.log_artifacts(run_id, str(d), ARTIFACT_DIR)
    client.set_tag(run_id, DIGEST_TAG, digest)
    loaded = load_run(uri, run_id)
    assert loaded.digest == digest and abs(evaluate(loaded) - math.log(64)) < 1e-5


def test_changed_weights_are_refused(tmp_path, mqar_data):
    uri, run_id = _store(tmp_path, mqar_data.path)
    log_final_weights(uri, run_id, _uniform_model().state_dict(), CFG)
    (weights,) = (tmp_path / "artifacts").rglob(WEIGHTS_FILE)
    sd = load_file(weights)
    sd["ln_f.weight"] += 1.0  # someone with write access to the artifact store
    save_file(sd, weights)
    meta_file = weights.parent / META_FILE
    meta = json.loads(meta_file.read_text())
    meta["sha256"] = sha256_file(weights)  # and who also rewrote the digest beside it
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(FinalWeightsError, match="refusing to load a changed file"):
        load_run(uri, run_id)
    _, bare = _store(tmp_path / "b", mqar_data.path)
    with pytest.raises(FinalWeightsError, match="has no final weights"):
        load_run(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", bare)


def test_sample_is_the_models_own_greedy_choice_and_seeded(tmp_path, mqar_data):
    uri, run_id = _store(tmp_path, mqar_data.path)
    log_final_weights(uri, run_id, GPT(ModelConfig(**CFG), seed=5).state_dict(), CFG)
    run = load_run(uri, run_id)
    prompt = list(range(1, 30))
    out = sample(run, prompt, 6, temperature=0)
    assert len(out) == 35 and out[:29] == prompt
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):  # by hand: argmax of the last position over the last seq_len tokens
            ids.append(int(run.model(torch.tensor([ids[-32:]]))[0][0, -1].argmax()))
    assert out == ids
    a = sample(run, prompt, 20, temperature=1.0, top_k=5, seed=1)
    assert a == sample(run, prompt, 20, temperature=1.0, top_k=5, seed=1) and a != sample(run, prompt, 20, seed=2)
    for bad in ([], [64], [-1]):
        with pytest.raises(ValueError):
            sample(run, bad, 1)


# Trains a tiny model a few steps with a real DeepSpeed engine (gloo, world size 1, CPU), saves its
# final weights through the product path, and writes the engine's logits and val loss.
ENGINE = textwrap.dedent("""
    import json, os, sys, torch
    os.environ.update(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    import deepspeed, torch.distributed as dist
    from data_pipeline import TokenLoader
    from model import GPT, ModelConfig
    from orchestrator.run.final_weights import save_final_weights
    from orchestrator.run.worker.optim import batch_geometry, deepspeed_config
    a = json.loads(sys.argv[1])
    os.environ["MASTER_PORT"] = str(a["port"])
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = GPT(ModelConfig(**a["cfg"]), seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cfg = deepspeed_config(batch_geometry(8, 1, 4), a["stage"], 1.0, False)
    # ZeRO-3 keeps parameters under 1e5 elements whole on every rank; partition all of them
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg, dist_init_required=False)
    train = TokenLoader(a["data"], "train", 32, 8, 0)
    for step in range(4):
        x, y = train.xy(step)
        for i in range(2):
            _, loss = engine(x[4 * i:4 * i + 4], y[4 * i:4 * i + 4])
            engine.backward(loss)
            engine.step()
    engine.eval()
    with torch.no_grad():
        torch.save(engine(torch.load(a["x"], weights_only=True))[0], a["logits"])
        total = count = 0.0
        for x, y in TokenLoader(a["data"], "val", 32, 8, 0).eval_xy(None, 8):
            n = float((y != -100).sum())
            total += float(engine(x, y)[1]) * n
            count += n
    if a["stage"] == 3:  # after an eval ZeRO-3 may keep a small model gathered: partition it again
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            pass
        assert all(p.data.numel() == 0 for p in engine.module.parameters())
    save_final_weights(engine, a["cfg"], a["uri"], a["run_id"], zero_stage=a["stage"], rank=0, step=4, tokens=1024)
    print(json.dumps({"val_loss": total / count}))
""")


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_engine_weights_round_trip(tmp_path, mqar_data, stage):
    uri, run_id = _store(tmp_path, mqar_data.path)
    x = torch.randint(0, 64, (3, 32), generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "probe.pt")
    port = free_port()
    args = {
        "cfg": CFG,
        "stage": stage,
        "data": mqar_data.path,
        "uri": uri,
        "run_id": run_id,
        "port": port,
        "x": str(tmp_path / "probe.pt"),
        "logits": str(tmp_path / "engine_logits.pt"),
    }
    p = subprocess.run(
        [sys.executable, "-c", ENGINE, json.dumps(args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=800,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 0, p.stderr[-4000:]
    engine_val = json.loads(p.stdout.strip().splitlines()[-1])["val_loss"]
    engine_logits = torch.load(tmp_path / "engine_logits.pt", weights_only=True)
    fresh = _load_elsewhere(uri, run_id, x, tmp_path)
    assert torch.equal(fresh, engine_logits)
    init = GPT(ModelConfig(**CFG), seed=1).eval()
    assert not torch.allclose(init(x)[0], fresh)  # it trained: the weights are not the init's
    assert abs(evaluate(load_run(uri, run_id)) - engine_val) < 1e-5
