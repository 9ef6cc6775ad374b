"""How often a run repeats its data: epochs = the run's tokens / its corpus's unique train tokens.

A scaling study assumes each token is seen about once; a run over many epochs measures
memorisation instead (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models":
repeated tokens are worth less than fresh ones after about 4 epochs, hence the default
``budget.max_epochs`` of 4). The unique train tokens of a corpus come from, in this order:

- ``generated``: an ``mqar`` corpus is ``num_train_examples`` examples made once at prepare
  and reused, so an epoch is ``num_train_examples x seq_len`` training tokens (exact);
- ``manifest``: a prepared corpus (its content hash found under the data cache root) says
  its train split's tokens (exact);
- ``estimate``: otherwise the train input files' bytes on disk (``max_bytes`` applied, the
  ``val_fraction`` held out, a mixture as its sampler draws it; under ``max_documents`` the
  kept documents' own bytes, read) / ``BYTES_PER_TOKEN``;
  compressed Parquet holds more text than its bytes, so its estimate errs low (more epochs);
- ``unknown``: a corpus whose files cannot be read here, or a Hugging Face dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from data_pipeline import CorpusConfig, DataError, storage
from data_pipeline.sources import input_file_sizes, iter_documents
from orchestrator.plan.contract import RunSpec
from orchestrator.plan.spec import Study

# UTF-8 bytes per token: 2.83 measured on the CPython stdlib with a 2,048-piece tokenizer
# (11,354,162 bytes, 4,012,996 tokens; BENCHMARKS.md); larger vocabularies pack more bytes
# into a token, so rounding down errs toward more tokens and fewer epochs.
BYTES_PER_TOKEN = 2.8

Source = Literal["generated", "manifest", "estimate", "unknown"]


@dataclass(frozen=True)
class CorpusSize:
    """Unique train tokens of one corpus (``None``: unknown) and where the figure came from."""

    train_tokens: float | None
    source: Source


def _estimate(corpus: CorpusConfig) -> float | None:
    """Train tokens estimated from input bytes (module docstring); None for ``hf``."""
    if corpus.source == "hf":
        return None
    if corpus.max_documents is not None:
        # A document cap: the bytes of the documents it keeps (at most max_documents read), not
        # of every input file (60 of the stdlib's files are not its 11 MB).
        docs = [(len(d.text.encode("utf-8")), d.split) for d in iter_documents(corpus)]
        train = sum(n for n, split in docs if split is None)
        return train * (1 if any(split for _, split in docs) else 1 - corpus.val_fraction) / BYTES_PER_TOKEN
    if corpus.source == "mixture":
        # The sampler draws w_i x M of each component, M the largest total none runs out at;
        # in bytes in place of documents.
        parts = [(c.weight, _estimate(c.corpus)) for c in corpus.components]
        if any(t is None for _, t in parts):
            return None
        total_w = sum(w for w, _ in parts)
        return min(t / (w / total_w) for w, t in parts if t is not None)
    sizes = input_file_sizes(corpus)
    train = sum(n for n, split in sizes if split is None)
    if corpus.max_bytes is not None:
        train = min(train, corpus.max_bytes)
    if not any(split for _, split in sizes):  # val is held out of the same documents
        train *= 1 - corpus.val_fraction
    return train / BYTES_PER_TOKEN


def corpus_size(corpus: CorpusConfig, data_hash: str | None, cache_root: str | None = None) -> CorpusSize:
    """The unique train tokens of ``corpus`` (module docstring for the sources, in order).

    ``data_hash``: its content hash (``plan.inputs.corpus_hashes``), None when its files could
    not be read here; ``cache_root``: where prepared corpora live (default: data_pipeline's,
    ``$QKSTUDY_CACHE`` or ``~/.cache/qkstudy/data``)."""
    if corpus.source == "mqar":
        p = corpus.resolved_mqar().resolved()
        return CorpusSize(float(p["num_train_examples"]) * float(p["seq_len"]), "generated")
    if data_hash is not None:
        manifest = storage.read_manifest(storage.join(cache_root or storage.default_cache_root(), data_hash))
        if manifest is not None:
            return CorpusSize(float(manifest["splits"]["train"]["tokens"]), "manifest")
    try:
        tokens = _estimate(corpus)
    except (DataError, OSError):
        tokens = None
    return CorpusSize(tokens, "estimate" if tokens is not None else "unknown")


def corpus_sizes(study: Study, data: dict[str, str | None], cache_root: str | None = None) -> dict[str, CorpusSize]:
    """``corpus_size`` of every corpus of the study, by name; ``data``: name -> content hash."""
    return {name: corpus_size(c, data.get(name), cache_root) for name, c in study.corpus_map.items()}


def epochs(run: RunSpec, sizes: dict[str, CorpusSize]) -> float | None:
    """Epochs of ``run``: its training tokens / its corpus's unique train tokens; None when
    the corpus's size is unknown."""
    size = sizes[run.corpus_name]
    return run.tokens / size.train_tokens if size.train_tokens else None


def epoch_problems(study: Study, runs: list[RunSpec], sizes: dict[str, CorpusSize], shown: int = 5) -> list[str]:
    """One line per run over ``budget.max_epochs`` (the first ``shown``, then a count), each
    naming the run, its epochs and its corpus's size with the size's source; [] when none."""
    limit = study.budget.max_epochs
    over = [(r, e) for r in runs if (e := epochs(r, sizes)) is not None and e > limit]
    lines = []
    for r, e in over[:shown]:
        size = sizes[r.corpus_name]
        approx = "~" if size.source == "estimate" else ""
        lines.append(
            f"run {r.run_name} ({r.run_id}) trains {r.tokens:,} tokens = {approx}{e:.3g} epochs of corpus "
            f"{r.corpus_name!r} ({approx}{size.train_tokens:,.0f} unique train tokens, {size.source}) > budget.max_epochs {limit:g}"
        )
    if len(over) > shown:
        lines.append(f"... and {len(over) - shown} more run(s) over budget.max_epochs {limit:g}")
    return lines
