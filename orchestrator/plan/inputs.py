"""What the pure planner needs from outside: the corpora's content hashes and the throughput table.

``plan(study, throughput, data)`` reads no file and measures nothing; its callers (``qkstudy
plan``/``run``/``status``, the runner) load its two inputs here, so every caller plans the
same runs with the same ids:

- ``corpus_hashes``: per corpus, data_pipeline's content hash, the key of the prepared
  directory (``data_pipeline.build.content_hash``: sha256 over the format version, the
  corpus and tokenizer configs and a fingerprint holding the sha256 of every input file).
  It is computed from the files before anything is prepared (reading them once; the
  CPython stdlib corpus takes about 0.6 s cold), and the tokenizer model is trained from
  exactly those inputs, so the key fixes the tokenizer too. It enters each run's identity:
  editing one corpus file gives every run of that corpus a new ``run_id``.
- ``throughput_table`` (``orchestrator.plan.throughput``): tokens/s per variant, for
  ``wallclock`` budgets.

A plan the data or the devices cannot support is refused here (``fit_problems``): a run over
``budget.max_epochs`` of its corpus (``orchestrator.plan.epochs``) or over
``resources.device_memory_gb`` (``orchestrator.plan.memory``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchestrator.plan.contract import PlanError, RunSpec
from orchestrator.plan.epochs import corpus_sizes, epoch_problems
from orchestrator.plan.memory import memory_problems
from orchestrator.plan.overrides import spec_error
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import Study
from orchestrator.plan.throughput import throughput_table


class CorpusError(ValueError):
    """A corpus that cannot feed the study's runs (unreadable, too small, token ids beyond
    the vocabulary); ``corpus_name`` says which."""

    def __init__(self, corpus_name: str, message: str):
        self.corpus_name = corpus_name
        super().__init__(f"corpus {corpus_name!r}: {message}")


class FitError(PlanError):
    """Planned runs the data or the devices cannot support; ``problems``: (spec field, message)
    pairs, one per run over ``budget.max_epochs`` or ``resources.device_memory_gb``."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("\n".join(f"{loc}: {msg}" for loc, msg in problems))


def fit_problems(study: Study, runs: list[RunSpec]) -> list[tuple[str, str]]:
    """(spec field, message) for every run over ``budget.max_epochs`` of its corpus (sizes from
    the runs' own content hashes, ``plan.epochs.corpus_sizes``) or over the declared device
    memory (``plan.memory``); [] when the plan fits."""
    sizes = corpus_sizes(study, {r.corpus_name: r.data_hash for r in runs})
    return [("budget.max_epochs", m) for m in epoch_problems(study, runs, sizes)] + [
        ("resources.device_memory_gb", m) for m in memory_problems(runs, study.resources.device_memory_gb)
    ]


def corpus_hashes(study: Study, strict: bool = True) -> dict[str, str | None]:
    """Corpus name -> the content hash ``data_pipeline.prepare`` will give its prepared data.

    ``strict=False`` (``qkstudy plan``/``validate``/``status`` on a machine that may not see a
    cluster's corpus files) gives None for a corpus whose files cannot be read here: its runs
    are then planned with ids that leave the data out, and the caller says so.

    Raises:
        CorpusError: (``strict`` only) a corpus's input files cannot be read (missing path,
            no files matched).
    """
    from data_pipeline import CorpusConfig, DataError, TokenizerConfig
    from data_pipeline.build import content_hash
    from data_pipeline.sources import fingerprint

    # The same configs, built the same way, as the preparation task gets (run.driver.prepare_tasks).
    tokenizer = TokenizerConfig.model_validate(study.tokenizer.model_dump(mode="json"))
    out: dict[str, str | None] = {}
    for name, corpus in study.corpus_map.items():
        cfg = CorpusConfig.model_validate(corpus.model_dump(mode="json")).with_root(corpus.root)
        try:
            out[name] = content_hash(cfg, tokenizer, fingerprint(cfg))
        except (DataError, OSError) as e:
            if strict:
                raise CorpusError(name, str(e)) from None
            out[name] = None
    return out


def plan_study(study: Study, strict: bool = True) -> list[RunSpec]:
    """The study's runs as every product caller plans them: with its throughput table
    (declared or calibrated) and its corpora's content hashes (``corpus_hashes``; the driver
    plans ``strict``, so its run ids always cover the data).

    Raises:
        CorpusError: see ``corpus_hashes``; PlanError: see ``plan``; FitError: a run over
            ``budget.max_epochs`` or the declared device memory (``fit_problems``).
    """
    runs = plan(study, throughput_table(study), corpus_hashes(study, strict))
    problems = fit_problems(study, runs)
    if problems:
        raise FitError(problems)
    return runs


def plan_here(study: Study, warn: Callable[[str], None], path: str | Path = "<spec>") -> list[RunSpec]:
    """``plan_study`` for commands that only look (``qkstudy plan``, ``validate``): a corpus
    whose files cannot be read on this machine (a cluster's) is planned without its hash,
    and ``warn`` is called with one line saying so.

    Raises:
        SpecError: the plan is refused for one field (``PlanError.field``), named with the
            file ``path`` or the override that set it.
        PlanError: refused for no one field.
    """
    data = corpus_hashes(study, strict=False)
    for name in [n for n, h in data.items() if h is None]:
        warn(
            f"corpus {name!r}: its files cannot be read here, so its runs' ids leave out its content hash "
            "(the driver that runs the study computes it)"
        )
    try:
        return plan(study, throughput_table(study), data)
    except PlanError as e:
        if e.field is None:
            raise
        raise spec_error(str(path), [(e.field, str(e))], study.overrides) from None
