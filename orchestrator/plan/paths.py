"""Before a study trains, where its data stands: every local corpus path matches a file, and the
files can train (text, not binary; enough of it for the vocabulary: ``data_pipeline.check``).

Not part of loading a spec (``orchestrator.plan.spec.load_spec``): a cluster spec may name
paths that exist only on the cluster. ``qkstudy run`` checks them here before Ray starts (on a
cluster: the submitted job's `run`, where the files are), and so does ``qkstudy validate``
unless told the data is elsewhere (``--data-elsewhere``); ``plan`` and ``status`` only look.
URIs such as ``s3://`` are checked when the corpus is prepared.
"""

from __future__ import annotations

import os
from pathlib import Path

from data_pipeline import CorpusConfig
from orchestrator.plan.spec import Study
from orchestrator.plan.specfile import SpecError


def check_local_corpus_paths(study: Study, path: str | Path = "<spec>") -> None:
    """Before a local run: ``data_problems`` must find none.

    Raises:
        SpecError: naming each corpus field whose data cannot train here.
    """
    problems = data_problems(study)
    if problems:
        raise SpecError(path, problems)


def data_problems(study: Study) -> list[tuple[str, str]]:
    """(spec field, message) for each local corpus path that matches nothing, and for each
    corpus whose paths all match but whose files cannot train (``data_pipeline.check``: empty,
    binary, a vocabulary its text cannot fill); [] when the data can train here."""
    from data_pipeline import TokenizerConfig
    from data_pipeline.check import corpus_problems

    problems = _check_corpus_paths(study)
    tokenizer = TokenizerConfig.model_validate(study.tokenizer.model_dump(mode="json"))
    for name, corpus in study.corpus_map.items():
        field = f"corpora.{name}" if study.corpora else "corpus"
        if not any(f.startswith(field + ".") for f, _ in problems):  # its paths all match: read them
            problems += corpus_problems(corpus, tokenizer, field)
    return problems


def _check_corpus_paths(study: Study) -> list[tuple[str, str]]:
    import glob

    problems = []

    def check(corpus: CorpusConfig, where: str) -> None:
        for field in ("paths", "val_paths"):
            for i, p in enumerate(getattr(corpus, field)):
                if "://" in p:
                    continue
                local = corpus.local_path(p)
                if not os.path.exists(local) and not glob.glob(local, recursive=True):  # "[draft].txt" names itself
                    base = f" (relative to {corpus.root or Path.cwd()})" if not Path(p).expanduser().is_absolute() else ""
                    problems.append((f"{where}.{field}[{i}]", f"no file or folder matches {p!r}{base}"))
        for j, c in enumerate(corpus.components):
            check(c.corpus, f"{where}.components[{j}].corpus")

    if study.corpora:
        for name, c in study.corpora.items():
            check(c, f"corpora.{name}")
    elif study.corpus is not None:
        check(study.corpus, "corpus")
    return problems
