"""Each test tier's count and wall-clock, from the JUnit XML files `make test` writes.

``python -m tests.tier_summary build/test`` prints one row per tier (unit, slow, stack) and
writes the same table to ``build/test/summary.md``; a tier whose XML is missing is said so.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TIERS = ("unit", "slow", "stack")


def tier_row(xml: Path) -> dict[str, float]:
    """tests, failures, errors, skipped and seconds of one JUnit XML (pytest's ``testsuite``)."""
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    return {k: float(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped", "time")}


def summary(folder: Path) -> str:
    """The tiers' table (markdown) for the XML files in ``folder``."""
    lines = ["| tier | tests | failed | errors | skipped | wall-clock s |", "|---|---:|---:|---:|---:|---:|"]
    for tier in TIERS:
        xml = folder / f"{tier}.xml"
        if not xml.exists():
            lines.append(f"| {tier} | not run | | | | |")
            continue
        r = tier_row(xml)
        lines.append(f"| {tier} | {r['tests']:.0f} | {r['failures']:.0f} | {r['errors']:.0f} | {r['skipped']:.0f} | {r['time']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "build/test")
    text = summary(folder)
    (folder / "summary.md").write_text(text)
    print(text, end="")
