"""Pydantic configs for corpora and tokenizers (embedded in the study spec as `corpus:` and `tokenizer:`).

Both are cheap to build (no I/O) and JSON-serialisable: the content hash of a prepared dataset and
the orchestrator's run identity are computed from ``model_dump(mode="json")``. Validation errors
name the offending field.
"""

from __future__ import annotations

import math
import os
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from . import mqar

SourceName = Literal["stdlib", "text", "jsonl", "parquet", "hf", "mixture", "mqar"]

# Default stdlib exclusions: the regression-test suites and the IDLE GUI are not representative
# library code and triple the corpus (1790 files / 31 MB -> 674 files / 11 MB on CPython 3.11),
# which keeps the default prepare well inside the `make demo` budget.
STDLIB_DEFAULT_EXCLUDE = ["test/**", "**/test/**", "**/tests/**", "**/idle_test/**", "idlelib/**"]

# MQAR presets (Zoology-style multi-query associative recall, Arora et al. 2023). "easy" and
# "medium" are the settings the paper reports perfect accuracy on; "hard" is Zoology's largest
# vocabulary with many pairs. Values: vocab_size, seq_len (model input length), num_kv_pairs.
MQAR_PRESETS: dict[str, dict[str, int]] = {
    "easy": {"vocab_size": 256, "seq_len": 64, "num_kv_pairs": 4},
    "medium": {"vocab_size": 1024, "seq_len": 128, "num_kv_pairs": 16},
    "hard": {"vocab_size": 8192, "seq_len": 256, "num_kv_pairs": 64},
}


def numbers_in(annotation: Any, value: Any, kind: type) -> list[Any]:
    """The parts of ``value`` that ``annotation`` means as numbers of ``kind`` (int or float):
    the value itself for ``kind`` (alone or with None), the items of a ``list[kind]``, the
    values of a ``dict[..., kind]`` (also inside a union with other shapes); [] when it means
    none, or when the union also welcomes another kind of scalar."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is kind:
        return [value]
    if origin in (Union, UnionType):
        if any(a in ({int, float, str, bool} - {kind}) for a in args):
            return []
        return [x for a in args if a is not type(None) for x in numbers_in(a, value, kind)]
    if origin is list and args == (kind,) and isinstance(value, list):
        return list(value)
    if origin is dict and len(args) == 2 and args[1] is kind and isinstance(value, dict):
        return list(value.values())
    return []


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return True  # not a number at all: pydantic's own check says so


class NumbersStrict(BaseModel):
    """A model whose number fields read only numbers. An integer field refuses ``true``, ``"3"``
    and ``2.0`` by value, where YAML and pydantic's lax mode would read them as 1, 3 and 2
    (typos, not numbers); a float field refuses ``true`` and a non-finite value (``.inf``,
    ``.nan``, ``"inf"``), and still takes text that is a number, because YAML 1.1 reads ``3e-3``
    as text. Every spec model derives from it (``orchestrator.plan``), so a spec and an
    override are read the same way."""

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return v
        for x in numbers_in(field.annotation, v, int):
            if isinstance(x, bool | str | float):
                raise ValueError(f"must be an integer, not {x!r}")
        for x in numbers_in(field.annotation, v, float):
            if isinstance(x, bool) or not _finite(x):
                raise ValueError(f"must be a {'' if isinstance(x, bool) else 'finite '}number, not {x!r}")
        return v


class _Strict(NumbersStrict):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MQARConfig(_Strict):
    """Synthetic multi-query associative recall (Zoology `multiquery_ar`, layout in data_pipeline.mqar).

    Each example is ``seq_len + 1`` tokens: ``num_kv_pairs`` (key, value) pairs, then a query
    region where every key reappears once at a power-law distributed distance (p(slot s) ~
    (s+1)^(power_a-1), Zoology's default power_a = 0.01); its value is the label of that position,
    the input after it is filler, as are all other positions (uniform over the vocabulary). Keys
    are distinct ids from [1, vocab/2), values distinct ids from [vocab/2, vocab). Only the query
    keys carry labels. Needs seq_len >= 4 * num_kv_pairs and vocab_size >= 2 * num_kv_pairs + 2.
    """

    preset: Literal["easy", "medium", "hard"] = "easy"
    vocab_size: int | None = Field(default=None, ge=8, le=65536)
    seq_len: int | None = Field(default=None, ge=8)
    num_kv_pairs: int | None = Field(default=None, ge=1)
    power_a: float = Field(default=0.01, gt=0.0, le=1.0)
    num_train_examples: int = Field(default=20_000, ge=1)
    num_val_examples: int = Field(default=1_000, ge=1)

    def resolved(self) -> dict[str, int | float]:
        """Preset values overridden by any explicitly set field."""
        out: dict[str, int | float] = dict(MQAR_PRESETS[self.preset])
        for name in ("vocab_size", "seq_len", "num_kv_pairs"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update(power_a=self.power_a, num_train_examples=self.num_train_examples, num_val_examples=self.num_val_examples)
        return out

    @model_validator(mode="after")
    def _check_fits(self) -> MQARConfig:
        r = self.resolved()
        mqar.check_params(int(r["vocab_size"]), int(r["seq_len"]), int(r["num_kv_pairs"]), float(r["power_a"]))
        return self


class MixtureComponent(_Strict):
    """One weighted component of a `mixture` corpus (documents are sampled in proportion to weight)."""

    corpus: CorpusConfig
    weight: float = Field(gt=0.0)


class CorpusConfig(_Strict):
    """Where documents come from and how they split into train/val.

    Fields by source:
      stdlib   `exclude` (fnmatch patterns on the path relative to the stdlib; default excludes tests and idlelib)
      text     `paths` (files, directories or globs; local or pyarrow URIs), `document_boundary` file|blank_lines
      jsonl    `paths`, `text_column`, `document_boundary` row|wikitext_heading
      parquet  `paths`, `text_column`, `document_boundary` row|wikitext_heading (WikiText-103 HF exports
               store one line per row; wikitext_heading groups rows into articles at " = Title = " rows)
      hf       `hf_path`, `hf_name`, `hf_split`, `hf_val_split`, `text_column` (needs the `hf` extra and the hub)
      mixture  `components` (each a CorpusConfig and a weight), `seed`
      mqar     `mqar` (preset easy/medium/hard plus overrides), `seed`
    `exclude` (fnmatch patterns on a file's relative path) filters files of every file source;
    None means the source's default (stdlib: tests and idlelib; others: nothing).
    Relative local `paths` and `val_paths` resolve against `root` (a study spec's folder, set by
    the spec's loader; None: the current directory). `root` is where the files are, not what
    they hold: it is never dumped, so neither the content hash nor a run's identity sees it, and
    a spec planned from any folder plans the same ids (``local_path``; a mixture's components
    take their mixture's root).
    Split: documents go to val when a hash of their id falls below `val_fraction`, unless `val_paths`
    (or `hf_val_split`) names the val documents explicitly. Caps `max_documents` and `max_bytes`
    (UTF-8 bytes of text) keep the first documents in the source's deterministic order.
    """

    source: SourceName = "stdlib"
    paths: list[str] = Field(default_factory=list)
    val_paths: list[str] = Field(default_factory=list)
    exclude: list[str] | None = None
    text_column: str = "text"
    document_boundary: Literal["auto", "file", "blank_lines", "row", "wikitext_heading"] = "auto"
    val_fraction: float = Field(default=0.02, gt=0.0, lt=1.0)
    max_documents: int | None = Field(default=None, ge=1)
    max_bytes: int | None = Field(default=None, ge=1)
    hf_path: str | None = None
    hf_name: str | None = None
    hf_split: str = "train"
    hf_val_split: str | None = None
    components: list[MixtureComponent] = Field(default_factory=list)
    mqar: MQARConfig | None = None
    seed: int = 0
    root: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _check_source_fields(self) -> CorpusConfig:
        s = self.source
        if s in ("text", "jsonl", "parquet") and not self.paths:
            raise ValueError(f"paths: required for source '{s}'")
        if s not in ("text", "jsonl", "parquet") and (self.paths or self.val_paths):
            raise ValueError(f"paths/val_paths: not used by source '{s}'")
        if s == "hf" and not self.hf_path:
            raise ValueError("hf_path: required for source 'hf'")
        if s == "mixture":
            if len(self.components) < 1:
                raise ValueError("components: source 'mixture' needs at least one component")
            if any(c.corpus.source in ("mixture", "mqar") for c in self.components):
                raise ValueError("components: a mixture component cannot be 'mixture' or 'mqar'")
        elif self.components:
            raise ValueError(f"components: only used by source 'mixture', not '{s}'")
        if self.mqar is not None and s != "mqar":
            raise ValueError(f"mqar: only used by source 'mqar', not '{s}'")
        allowed = {
            "text": {"auto", "file", "blank_lines"},
            "jsonl": {"auto", "row", "wikitext_heading"},
            "parquet": {"auto", "row", "wikitext_heading"},
            "hf": {"auto", "row", "wikitext_heading"},
        }.get(s, {"auto"})
        if self.document_boundary not in allowed:
            raise ValueError(f"document_boundary: '{self.document_boundary}' not valid for source '{s}' (choose from {sorted(allowed)})")
        return self

    def with_root(self, root: str | None) -> CorpusConfig:
        """A copy whose relative local paths resolve against ``root`` (made absolute), its
        mixture components' too; None: this config."""
        if root is None:
            return self
        root = os.path.abspath(os.path.expanduser(root))
        parts = [c.model_copy(update={"corpus": c.corpus.with_root(root)}) for c in self.components]
        return self.model_copy(update={"root": root, "components": parts})

    def local_path(self, path: str) -> str:
        """A local ``paths``/``val_paths`` entry as a path to read (``~`` expanded; a relative one
        joined to ``root`` when set, else left relative to the current directory)."""
        p = os.path.expanduser(path)
        return os.path.join(self.root, p) if self.root and not os.path.isabs(p) else p

    def resolved_mqar(self) -> MQARConfig:
        """The MQAR config of an `mqar` corpus (preset "easy" when none is given)."""
        return self.mqar or MQARConfig()

    def label(self) -> str:
        """Short human name used in error messages: ``source 'text' (docs/)``."""
        where = ", ".join(self.paths) or self.hf_path or ""
        return f"source '{self.source}'" + (f" ({where})" if where else "")


class TokenizerConfig(_Strict):
    """SentencePiece tokenizer trained on (a sample of) the train split.

    `max_sentences` caps the number of lines sampled for training (a deterministic sample), which
    bounds training time on large corpora; `max_sentence_length` (bytes) drops longer lines, as
    SentencePiece does. Normalisation is the identity (no NFKC, whitespace kept) so code and text
    round-trip exactly; newline is a user-defined piece. The end-of-document id is SentencePiece's
    ``</s>`` (id 2); ids 0 and 1 are ``<unk>`` and ``<s>``.
    """

    kind: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = Field(default=4096, ge=16, le=1 << 20)
    byte_fallback: bool = True
    character_coverage: float = Field(default=1.0, gt=0.0, le=1.0)
    max_sentences: int = Field(default=100_000, ge=1)
    max_sentence_length: int = Field(default=4096, ge=16)


MixtureComponent.model_rebuild()
