"""What the publication tests share: a published store unzipped, a RESULTS.md section, the
quoted numbers a page lacks, and the tables a published folder and a regenerated report share.

A publication test regenerates a report from its gzipped MLflow store and checks the chain
store -> report -> RESULTS.md on the numbers the page quotes; tables are compared only where
both sides have them, so a table the report gained since publication forces no regeneration.
"""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import pandas as pd

Quote = tuple[str | None, str]  # (section heading, or None for anywhere; the exact text)


def unzip_store(gz: Path, folder: Path) -> str:
    """``gz`` (a gzipped MLflow SQLite file) unzipped to ``folder/mlflow.db``; its tracking URI."""
    db = folder / "mlflow.db"
    with gzip.open(gz, "rb") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return f"sqlite:///{db}"


def section(text: str, heading: str) -> str:
    """The text from the line that starts with ``heading`` (a Markdown heading) to the next heading
    of the same or a higher level; empty when there is no such line (everything quoted in it is then missing)."""
    level = len(heading.split(" ", 1)[0])
    start = re.search(rf"^{re.escape(heading)}", text, re.M)
    if start is None:
        return ""
    end = re.search(rf"^#{{1,{level}}} ", text[start.end() :], re.M)
    return text[start.start() : start.end() + end.start()] if end else text[start.start() :]


def missing_quotes(text: str, quotes: list[Quote]) -> list[Quote]:
    """The ``quotes`` that ``text`` does not print where it should (line breaks count as spaces)."""

    def flat(t: str) -> str:
        return " ".join(t.split())

    return [(sec, s) for sec, s in quotes if flat(s) not in flat(section(text, sec) if sec else text)]


def assert_shared_tables_equal(published: Path, regenerated: Path, required: set[str], label: str = "") -> None:
    """Every CSV in both folders holds the same numbers (relative 1e-9); ``required`` (file names)
    must be among them. Raises AssertionError naming the table."""
    shared = {p.name for p in published.glob("*.csv")} & {p.name for p in regenerated.glob("*.csv")}
    assert required <= shared, (label, sorted(required - shared))
    for name in sorted(shared):
        pd.testing.assert_frame_equal(
            pd.read_csv(regenerated / name), pd.read_csv(published / name), check_exact=False, rtol=1e-9, obj=f"{label}/{name}"
        )
