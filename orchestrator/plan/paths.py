"""Before a local run: every local corpus path of a study must match a file.

Not part of spec validation (``orchestrator.plan.spec.load_spec``): a cluster spec may name
paths that exist only on the cluster, so ``qkstudy validate`` and ``plan`` accept them and
``qkstudy run`` checks them here, before Ray starts. URIs such as ``s3://`` are checked when
the corpus is prepared.
"""

from __future__ import annotations

from pathlib import Path

from data_pipeline import CorpusConfig
from orchestrator.plan.spec import Study
from orchestrator.plan.specfile import SpecError


def check_local_corpus_paths(study: Study, path: str | Path = "<spec>") -> None:
    """Before a local run: every local corpus path must match a file (URIs such as s3://
    are checked when prepared). Not part of ``load_spec``: a cluster spec may name paths
    that exist only on the cluster.

    Raises:
        SpecError: naming each corpus path that matches nothing.
    """
    problems = _check_corpus_paths(study)
    if problems:
        raise SpecError(path, problems)


def _check_corpus_paths(study: Study) -> list[tuple[str, str]]:
    import glob

    problems = []

    def check(corpus: CorpusConfig, where: str) -> None:
        for field in ("paths", "val_paths"):
            for i, p in enumerate(getattr(corpus, field)):
                if "://" in p:
                    continue
                if not glob.glob(str(Path(p).expanduser()), recursive=True):
                    problems.append((f"{where}.{field}[{i}]", f"no file or folder matches {p!r} (relative to {Path.cwd()})"))
        for j, c in enumerate(corpus.components):
            check(c.corpus, f"{where}.components[{j}].corpus")

    if study.corpora:
        for name, c in study.corpora.items():
            check(c, f"corpora.{name}")
    elif study.corpus is not None:
        check(study.corpus, "corpus")
    return problems
