"""A finished run's final weights: consolidated, logged as an MLflow logged model of the run,
loadable without DeepSpeed, and used to evaluate a corpus or sample text later.

What is saved: the weights the engine computes with at the last step, as one plain
``{name: tensor}`` state dict of ``model.GPT`` in float32, in safetensors (tensors and their
names only: loading runs no code, unlike a pickle). ZeRO-0/1/2 keep full parameters on every
rank, so rank 0 copies ``engine.module``'s; ZeRO-3 partitions them, so every rank gathers one
parameter at a time (``deepspeed.zero.GatheredParameters``, public API; memory: one parameter
more per rank, never the whole model) and rank 0 copies it. Why not ``zero_to_fp32``: it needs
a full DeepSpeed checkpoint on disk first and yields the fp32 optimizer masters; on CPU (fp32)
they equal the module's weights, and on GPU (bf16) the module's are the ones the final
evaluation used, so ``evaluate`` reproduces ``final/val_loss``.

Where: an MLflow 3 logged model named ``final_weights`` whose source run is the training run
(the Models tab lists it, ``models:/<model_id>`` downloads it), holding ``model.safetensors``,
``model_config.json`` and ``weights.json`` (the digest and step); its id is the run's tag
``qkstudy.final_model_id``. The SHA-256 of ``model.safetensors`` is then set as the run's tag
``final_weights.sha256``: the tag lives in the tracking store, apart from the artifact store
(shared storage is not trusted, DESIGN.md), and it is the commit marker: a run with the tag has
complete weights. ``load_run`` downloads, checks the file against the tag (and
``weights.json``), refuses a mismatch, and reads the tensors. Runs logged before logged models
(``final_weights/model.pt`` among the run's artifacts, ``torch.save``) still load, with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mlflow.artifacts import download_artifacts
from mlflow.exceptions import MlflowException
from safetensors.torch import load_file, save_file

from model import GPT, ModelConfig
from orchestrator.run.evaluate import eval_sums
from orchestrator.track.publish import is_published
from orchestrator.track.tracking import client_for

ARTIFACT_DIR = "final_weights"  # the logged model's name; the run artifact folder of the legacy layout
WEIGHTS_FILE, CONFIG_FILE, META_FILE = "model.safetensors", "model_config.json", "weights.json"
LEGACY_WEIGHTS_FILE = "model.pt"  # torch.save, before logged models
DIGEST_TAG = "final_weights.sha256"
MODEL_TAG = "qkstudy.final_model_id"
FORMAT = "qkstudy.final_weights/2"  # 2: safetensors in a logged model; 1: model.pt in the run's artifacts


class FinalWeightsError(RuntimeError):
    """A run's final weights are missing, do not match their digest, or do not fit the model."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cpu32(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu")
    return (t.float() if t.is_floating_point() else t).clone()


def consolidated_state_dict(engine: Any, zero_stage: int, rank: int) -> dict[str, torch.Tensor]:
    """The engine's model weights as a full float32 CPU state dict on rank 0 ({} elsewhere).

    Collective under ZeRO-3: every rank must call it (one gather per parameter)."""
    module = engine.module
    if zero_stage < 3:
        return {k: _cpu32(v) for k, v in module.state_dict().items()} if rank == 0 else {}
    import deepspeed

    params = dict(module.named_parameters())
    out: dict[str, torch.Tensor] = {}
    for name, value in module.state_dict().items():
        p = params.get(name)
        if p is None:  # a buffer: never partitioned
            if rank == 0:
                out[name] = _cpu32(value)
            continue
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            if rank == 0:
                out[name] = _cpu32(p.data)
    return out


def write_weights(
    folder: Path, state_dict: dict[str, torch.Tensor], model_config: dict[str, Any], meta: dict[str, Any] | None = None
) -> str:
    """Write ``model.safetensors`` (temp name, then rename), ``model_config.json`` and
    ``weights.json`` into ``folder``; returns the SHA-256 of ``model.safetensors``.
    ``model_config``: ModelConfig fields. Tensors that share storage (a tied head) are written
    once each under their own names (safetensors refuses aliases)."""
    ModelConfig(**model_config)  # refuse a config the loader could not build
    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        t = t.detach().to("cpu").contiguous()
        if t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": FORMAT})
    digest = sha256_file(tmp)
    tmp.rename(folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(model_config, indent=2, sort_keys=True))
    info = {
        "format": FORMAT,
        "sha256": digest,
        "bytes": (folder / WEIGHTS_FILE).stat().st_size,
        "dtype": "float32",
        "tensors": len(state_dict),
        **(meta or {}),
    }
    (folder / META_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))
    return digest


def log_final_weights(
    tracking_uri: str,
    mlflow_run_id: str,
    state_dict: dict[str, torch.Tensor],
    model_config: dict[str, Any],
    meta: dict[str, Any] | None = None,
) -> str:
    """Log a state dict as the run's final weights, a logged model of the run (see the module
    doc); returns its digest. A failed upload leaves the logged model FAILED and the run
    without the digest tag (so without final weights)."""
    client = client_for(tracking_uri)
    run = client.get_run(mlflow_run_id)
    with tempfile.TemporaryDirectory(prefix="qkstudy-final-") as d:
        digest = write_weights(Path(d), state_dict, model_config, meta)
        model = client.create_logged_model(
            run.info.experiment_id,
            name=ARTIFACT_DIR,
            source_run_id=mlflow_run_id,
            tags={DIGEST_TAG: digest, "qkstudy.format": FORMAT},
            params={k: str(v) for k, v in sorted(model_config.items())},
        )
        try:
            client.log_model_artifacts(model.model_id, d)
        except BaseException:
            client.finalize_logged_model(model.model_id, "FAILED")
            raise
    client.finalize_logged_model(model.model_id, "READY")
    client.set_tag(mlflow_run_id, MODEL_TAG, model.model_id)
    client.set_tag(mlflow_run_id, DIGEST_TAG, digest)  # last: the commit marker
    return digest


def save_final_weights(
    engine: Any, model_config: dict[str, Any], tracking_uri: str, mlflow_run_id: str, *, zero_stage: int, rank: int, step: int, tokens: int
) -> str | None:
    """Consolidate the engine's weights and log them on rank 0 (every rank calls this: ZeRO-3
    gathers are collective). Returns the digest on rank 0, None elsewhere."""
    sd = consolidated_state_dict(engine, zero_stage, rank)
    if rank != 0:
        return None
    return log_final_weights(tracking_uri, mlflow_run_id, sd, model_config, {"step": step, "tokens": tokens, "zero_stage": zero_stage})


@dataclass
class LoadedRun:
    """A finished run's model (eval mode), its config and where its data was prepared."""

    model: GPT
    config: ModelConfig
    mlflow_run_id: str
    digest: str
    data_path: str | None
    seq_len: int


def load_run(tracking_uri: str, mlflow_run_id: str, device: str | torch.device = "cpu") -> LoadedRun:
    """Download a run's final weights, verify them, and build its ``model.GPT``.

    Raises:
        FinalWeightsError: the run has no final weights, the file does not match the digest in
            the tracking store or in ``weights.json``, the tensors do not fit the config, or the
            weights cannot be read from the run's artifact location (a store copied from
            another machine keeps that machine's paths).
    """
    client = client_for(tracking_uri)
    run = client.get_run(mlflow_run_id)
    want = run.data.tags.get(DIGEST_TAG)
    if not want:
        raise FinalWeightsError(
            f"MLflow run {mlflow_run_id} has no final weights (tag {DIGEST_TAG} is missing): "
            "it did not finish, or finished before final weights were kept"
        )
    if is_published(run.info.artifact_uri):
        raise FinalWeightsError(
            f"MLflow run {mlflow_run_id}: this store was published without its artifacts ({run.info.artifact_uri}): "
            "final weights are read from the store the study trained into"
        )
    model_id = run.data.tags.get(MODEL_TAG)
    with tempfile.TemporaryDirectory(prefix="qkstudy-load-") as d:
        where = f"models:/{model_id}" if model_id else f"{run.info.artifact_uri}/{ARTIFACT_DIR}"
        try:
            if model_id:  # through the model's own artifact location: models:/ resolves against the global tracking URI
                location = client.get_logged_model(model_id).artifact_location
                folder = Path(download_artifacts(artifact_uri=location, dst_path=d))
            else:
                folder = Path(client.download_artifacts(mlflow_run_id, ARTIFACT_DIR, d))
        except (MlflowException, OSError) as e:  # a store copied from another machine keeps that machine's artifact paths
            raise FinalWeightsError(
                f"MLflow run {mlflow_run_id}: its final weights cannot be read from {where} ({type(e).__name__}): the "
                "store's artifacts are elsewhere (another machine, or moved); copy them there or open the store where they are"
            ) from None
        file = folder / (WEIGHTS_FILE if model_id else LEGACY_WEIGHTS_FILE)
        got = sha256_file(file)
        meta = json.loads((folder / META_FILE).read_text())
        if got != want or meta.get("sha256") != want:
            raise FinalWeightsError(
                f"MLflow run {mlflow_run_id}: {file.name} of {where} has SHA-256 {got}, the run recorded {want}: "
                "refusing to load a changed file"
            )
        cfg = ModelConfig(**json.loads((folder / CONFIG_FILE).read_text()))
        state = load_file(file) if model_id else torch.load(file, map_location="cpu", weights_only=True)
    model = GPT(cfg, seed=0)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise FinalWeightsError(f"MLflow run {mlflow_run_id}: weights do not fit {cfg.variant} config: {e}") from None
    model.to(device).eval()
    seq_len = int(run.data.params.get("seq_len", cfg.seq_len))
    return LoadedRun(model, cfg, mlflow_run_id, want, run.data.params.get("data_path"), seq_len)


def evaluate(run: LoadedRun, data_path: str | None = None, max_windows: int | None = None, batch_size: int = 16) -> float:
    """Mean loss [nats per scored token] of ``run`` over a prepared corpus's val split (default:
    the run's own ``data_path``): the loader's fixed eval windows (``eval_windows(max_windows)``,
    all when None), weighted as the worker weights them (``evaluate.eval_sums``). NaN when no
    position is scored.

    Raises:
        FinalWeightsError: no ``data_path`` given and none recorded on the run.
        data_pipeline.DataError: the folder is not prepared data (or too small for a window).
    """
    from data_pipeline import TokenLoader

    path = data_path or run.data_path
    if not path:
        raise FinalWeightsError(f"MLflow run {run.mlflow_run_id} records no data_path: pass the prepared corpus")
    loader = TokenLoader(path, "val", run.seq_len, 1, 0)
    device = next(run.model.parameters()).device
    total, count, _ = eval_sums(run.model, loader.eval_xy(max_windows, batch_size), device)
    return total / count if count else math.nan


@torch.no_grad()
def sample(
    run: LoadedRun,
    prompt_tokens: Sequence[int] | torch.Tensor,
    n: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> list[int]:
    """Extend ``prompt_tokens`` (token ids, >= 1) by ``n`` tokens; returns prompt + new ids.

    ``temperature`` 0 is greedy (argmax); otherwise softmax(logits / temperature) over the
    ``top_k`` most likely tokens (all when None), drawn from a generator seeded by ``seed``.
    The context is the last ``config.seq_len`` tokens. Raises ValueError for an empty prompt,
    n < 0, temperature < 0 or a token id outside the vocabulary."""
    ids = [int(t) for t in (prompt_tokens.tolist() if isinstance(prompt_tokens, torch.Tensor) else prompt_tokens)]
    vocab = run.config.vocab_size
    if not ids or n < 0 or temperature < 0 or any(not 0 <= t < vocab for t in ids):
        raise ValueError(f"sample: need a non-empty prompt of ids in [0, {vocab}), n >= 0, temperature >= 0")
    device = next(run.model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(n):
        ctx = torch.tensor([ids[-run.config.seq_len :]], device=device)
        logits = run.model(ctx)[0][0, -1].float().cpu()
        if temperature == 0:
            ids.append(int(logits.argmax()))
            continue
        if top_k is not None:
            cut = torch.topk(logits, min(top_k, vocab)).values[-1]
            logits = logits.masked_fill(logits < cut, float("-inf"))
        probs = torch.softmax(logits / temperature, dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=gen)))
    return ids


def sample_text(run: LoadedRun, prompt: str, n: int, data_path: str | None = None, **kw: Any) -> str:
    """``sample`` on text: encode ``prompt`` with the corpus's sentencepiece tokenizer (default
    the run's ``data_path``), decode prompt + ``n`` new tokens. ``kw`` goes to ``sample``.
    Raises FinalWeightsError when the corpus has no tokenizer (mqar) or no path is known."""
    from data_pipeline import PreparedData
    from data_pipeline.storage import read_manifest
    from data_pipeline.tokenizer import load_tokenizer

    path = data_path or run.data_path
    manifest = read_manifest(path) if path else None
    prep = PreparedData.from_manifest(path, manifest) if path and manifest else None
    if prep is None or not prep.tokenizer_path:
        raise FinalWeightsError(f"MLflow run {run.mlflow_run_id}: no tokenizer at {path!r} to encode a text prompt")
    sp = load_tokenizer(prep.tokenizer_path)
    return sp.decode(sample(run, sp.encode(prompt) or [prep.eod_id], n, **kw))
