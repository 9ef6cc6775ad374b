"""The report's optional parts, each one module with one ``Part`` (``parts.base``).

``PARTS`` is the order they are built in (their summary entries and tables follow it);
``Part.after`` places each part's section in the reading order (``report.sections``).
A new part is one module here and one entry below.
"""

from __future__ import annotations

from orchestrator.report.parts import gate, provenance, startup, time_split, tuning, unigram
from orchestrator.report.parts.base import Part, PartInput, Section

PARTS: list[Part] = [tuning.PART, unigram.PART, gate.PART, time_split.PART, startup.PART, provenance.PART]


def build_parts(given: PartInput) -> None:
    """Build every part of ``PARTS`` in order into ``given``'s summary and tables."""
    for part in PARTS:
        part.build(given)


__all__ = ["PARTS", "Part", "PartInput", "Section", "build_parts"]
