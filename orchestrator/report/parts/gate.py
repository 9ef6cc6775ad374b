"""The gated ladder's stopped arms in the report (``report.gate``: the decision and its
numbers, shared with the driver's gate)."""

from __future__ import annotations

import pandas as pd

from orchestrator.report import gate
from orchestrator.report.parts.base import PartInput, Section


class GatePart:
    """The arms the study's gate stopped (``gate.attach``), read after start-up."""

    name, after = gate.TABLE, "startup"

    def build(self, given: PartInput) -> None:
        """Mark the stopped arms of the report's corpus; nothing for a study without a gate."""
        gate.attach(given.summary, given.tables, given.data.experiment_tags, given.corpus)

    def section(self, summary: dict, tables: dict[str, pd.DataFrame]) -> Section | None:
        """ "Gated arms": the rule, the stopped arms (a table only when it stopped one), the saving."""
        if gate.TABLE not in tables:
            return None
        table = tables[gate.TABLE]
        return Section("Gated arms", gate.section_text(summary), gate.display(table) if len(table) else None)


PART = GatePart()
