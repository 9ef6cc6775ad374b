"""Data preparation for a study: each corpus tokenized once, as a Ray task, then checked.

One Ray task per corpus, all started at once; ``data_pipeline.prepare`` is content-addressed
and cached, so a task for a corpus already prepared returns at once. ``check_data_fits``
runs before MLflow is touched: a corpus too small for one window, with token ids beyond the
model's vocabulary, or whose files changed after the study was planned (its content hash is
no longer the one in the runs' identity), leaves no record.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from orchestrator.plan.inputs import CorpusError
from orchestrator.plan.planner import RunSpec

__all__ = ["CorpusError", "check_data_fits", "prepare_data"]


@ray.remote(num_cpus=1)
def _prepare_task(corpus: dict, tokenizer: dict, cache_root: str | None) -> dict[str, Any]:
    from data_pipeline import CorpusConfig, TokenizerConfig, prepare

    p = prepare(CorpusConfig.model_validate(corpus), TokenizerConfig.model_validate(tokenizer), cache_root, progress=False)
    tokens = {split: info["tokens"] for split, info in p.manifest.get("splits", {}).items()}
    return {"path": p.path, "content_hash": p.content_hash, "tokenizer_hash": p.tokenizer_hash,
            "vocab_size": p.vocab_size, "tokens": tokens}


def prepare_data(runs: list[RunSpec]) -> dict[str, dict[str, Any]]:
    """Prepare (or find cached) each corpus the runs need, one Ray task per corpus, all at
    once; returns corpus name -> {path, content_hash, tokenizer_hash (sha256 of the
    tokenizer model; empty for mqar), vocab_size, tokens (per split)}.

    Raises:
        CorpusError: a corpus cannot be prepared (the task's DataError, re-raised here).
    """
    from data_pipeline import DataError

    wanted = {r.corpus_name: (r.corpus, r.tokenizer) for r in runs}
    cache = os.environ.get("QKSTUDY_CACHE")
    refs = {name: _prepare_task.remote(c, t, cache) for name, (c, t) in wanted.items()}
    out = {}
    for name, ref in refs.items():
        try:
            out[name] = ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, DataError):  # the original error, without Ray's traceback
                raise CorpusError(name, str(e.cause)) from None
            raise
    return out


def check_data_fits(runs: list[RunSpec], datasets: dict[str, dict[str, Any]]) -> None:
    """Every run's corpus is the data it was planned with (same content hash), holds at least
    one training window and one validation window, and its token ids fit the model's vocabulary.

    Raises:
        CorpusError: naming the corpus, the split and the setting (train.seq_len, vocab).
    """
    for r in runs:
        d = datasets[r.corpus_name]
        if r.data_hash is not None and r.data_hash != d["content_hash"]:
            raise CorpusError(r.corpus_name, f"its files changed after the study was planned (content hash "
                                             f"{r.data_hash} planned, {d['content_hash']} prepared): run it again")
        need = r.train.seq_len + 1
        for split, n in d.get("tokens", {}).items():
            if n < need:
                raise CorpusError(r.corpus_name, f"the {split} split has {n} tokens, fewer than one window of "
                                                 f"train.seq_len + 1 = {need} tokens (add documents or lower train.seq_len)")
        if d["vocab_size"] > r.model["vocab_size"]:
            raise CorpusError(r.corpus_name, f"token ids go up to {d['vocab_size'] - 1}, beyond the model's vocabulary "
                                             f"of {r.model['vocab_size']} (tokenizer.vocab_size)")
