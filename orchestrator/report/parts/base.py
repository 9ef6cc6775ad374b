"""What every optional part of a report keeps to: the ``Part`` protocol, its input, and the
``Section`` a part (or a core section of ``report.sections``) is drawn as.

Why a protocol: the parts (LR tuning, the unigram bar, the gate's stopped arms, the time
split, start-up, the code the runs came from) read different things (experiment tags,
tuning runs, metric histories), so each used to be attached with its own signature and some
read MLflow again. Now ``report.query`` reads everything once into ``StudyData``; a part
takes one ``PartInput`` and adds its summary entries and tables, and draws its own section
from the summary and tables alone (so ``summary.json`` and the tables re-render the report).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import pandas as pd

from orchestrator.report.query import StudyData


@dataclass
class Section:
    """One section of the report as render.py draws it: title, paragraphs, a table, figures."""

    title: str
    text: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None
    figures: list[str] = field(default_factory=list)


@dataclass
class PartInput:
    """What a part reads: the study as queried (of one corpus in a per-corpus report; its
    experiment tags and tuning runs are the whole study's), the report's summary and tables
    so far (a part adds to both), and the corpus of the report (None: the study's only one,
    or several) and the corpus whose unigram bar applies (None: not known)."""

    data: StudyData
    summary: dict
    tables: dict[str, pd.DataFrame]
    corpus: str | None
    unigram_corpus: str | None


class Part(Protocol):
    """An optional part of the report: one module of ``report.parts``, one entry of ``PARTS``.

    name: the part's name (its table's, where it has one).
    after: the section it is read after: a core section of ``report.sections.CORE`` or
        another part's name (a part without a section is never placed).
    """

    name: str
    after: str

    def build(self, given: PartInput) -> None:
        """Add the part's entries to ``given.summary`` and its tables to ``given.tables``;
        nothing when the study has none of what the part reports."""
        ...

    def section(self, summary: dict, tables: dict[str, pd.DataFrame]) -> Section | None:
        """The part's section from the summary and tables alone; None when it has none."""
        ...
