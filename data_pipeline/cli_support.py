"""Glue for `qkstudy data prepare`: flat CLI options -> CorpusConfig + TokenizerConfig -> prepare()."""

from __future__ import annotations

from pydantic import ValidationError

from .build import PreparedData, prepare
from .check import corpus_problems
from .config import CorpusConfig, MQARConfig, TokenizerConfig
from .errors import DataError

_PREPARE_KWARGS = {"num_proc", "progress"}
# CLI names that differ from the config field names.
_TOKENIZER_ALIASES = {"tokenizer": "kind", "tokenizer_kind": "kind"}
_MQAR_ALIASES = {
    "preset": "preset",
    "mqar_preset": "preset",
    "mqar_vocab_size": "vocab_size",
    "mqar_seq_len": "seq_len",
    "num_kv_pairs": "num_kv_pairs",
    "power_a": "power_a",
    "num_train_examples": "num_train_examples",
    "num_val_examples": "num_val_examples",
}


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v for v in value.split(",") if v]
    return [str(v) for v in value]


# The spec fields corpus_problems names, as this command's options.
_OPTION_OF = {"corpus.paths": "--path", "corpus.val_paths": "val_paths", "tokenizer.vocab_size": "--vocab-size"}


def prepare_from_args(source: str, path: str | None, out: str | None, **options) -> PreparedData:
    """Build configs from flat CLI options and prepare into `out` (the cache root: the data lands in
    ``<out>/<content_hash>``).

    `path` (comma-separated for several) fills `paths`, or `hf_path` for source "hf". Options:
    tokenizer fields (vocab_size, byte_fallback, kind or tokenizer_kind, max_sentences, ...), corpus fields
    (text_column, val_fraction, val_paths, max_documents, max_bytes, document_boundary, exclude, seed),
    mqar fields (preset, num_kv_pairs, mqar_vocab_size, mqar_seq_len, power_a, ...), and num_proc /
    progress. None values are ignored. Raises DataError for unknown options or invalid values,
    and for files that cannot train (``data_pipeline.check``: what `qkstudy validate` refuses).
    """
    options = {k: v for k, v in options.items() if v is not None}
    corpus_kw: dict = {"source": source}
    tok_kw: dict = {}
    mqar_kw: dict = {}
    run_kw = {k: options.pop(k) for k in list(options) if k in _PREPARE_KWARGS}
    if path:
        corpus_kw["hf_path" if source == "hf" else "paths"] = path if source == "hf" else _as_list(path)
    for key, value in options.items():
        if key in _TOKENIZER_ALIASES or key in TokenizerConfig.model_fields:
            tok_kw[_TOKENIZER_ALIASES.get(key, key)] = value
        elif key in _MQAR_ALIASES:
            mqar_kw[_MQAR_ALIASES[key]] = value
        elif key in CorpusConfig.model_fields and key not in ("source", "components", "mqar"):
            corpus_kw[key] = _as_list(value) if key in ("paths", "val_paths", "exclude") else value
        else:
            raise DataError(f"source '{source}': unknown option '{key}'")
    try:
        if mqar_kw:
            corpus_kw["mqar"] = MQARConfig(**mqar_kw)
        corpus = CorpusConfig(**corpus_kw)
        tokenizer = TokenizerConfig(**tok_kw)
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors())
        raise DataError(f"source '{source}': invalid option ({fields})") from None
    problems = corpus_problems(corpus, tokenizer)  # what validate refuses, refused here too, by option
    if problems:
        raise DataError("; ".join(f"{_OPTION_OF.get(where, where)}: {message}" for where, message in problems))
    return prepare(corpus, tokenizer, out, **run_kw)
