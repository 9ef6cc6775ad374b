"""The code the study's runs came from, in the summary (``report.provenance``; the report
names it in its introduction (``sections.intro``), so the part has no section of its own)."""

from __future__ import annotations

import pandas as pd

from orchestrator.report import provenance
from orchestrator.report.parts.base import PartInput, Section


class CodePart:
    """``summary["code"]``: the commit(s) the runs came from, dirty flags and run counts."""

    name, after = "code", "intro"

    def build(self, given: PartInput) -> None:
        """Add ``summary["code"]`` (``provenance.code_summary``)."""
        given.summary["code"] = provenance.code_summary(given.data.runs)

    def section(self, summary: dict, tables: dict[str, pd.DataFrame]) -> Section | None:
        """None: the introduction names the code."""
        return None


PART = CodePart()
