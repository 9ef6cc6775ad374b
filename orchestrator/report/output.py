"""The report folder: never destroy what is not a previous report, never show half of one.

A report is built in a temporary sibling folder and swapped in whole; the folder it
replaces must be absent, empty, or a previous qkstudy report (summary.json with
"generator": "qkstudy"). Files are world-readable (folders 0755, files 0644).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.report.errors import ReportError

GENERATOR = "qkstudy"  # summary.json["generator"]: marks a folder build_report may replace


def is_report_dir(path: Path) -> bool:
    """True when path holds a report qkstudy wrote (summary.json with "generator": "qkstudy")."""
    try:
        return json.loads((path / "summary.json").read_text()).get("generator") == GENERATOR
    except (OSError, ValueError, AttributeError):
        return False


def check_out_dir(out: Path) -> None:
    """ReportError unless out is absent, an empty folder or a previous qkstudy report.

    The report replaces out whole, so anything else there would be lost.
    """
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ReportError(f"report output {out} exists and is not a folder; refusing to replace it")
    if out.is_dir() and any(out.iterdir()) and not is_report_dir(out):
        raise ReportError(
            f"report output {out} is a non-empty folder that is not a qkstudy report (no summary.json with "
            f'"generator": "{GENERATOR}"); refusing to replace it: pick another folder or remove it yourself'
        )


def swap_in(tmp: Path, out: Path) -> None:
    """Replace out with tmp: rename the old folder aside first (rename cannot replace a full dir).

    Modes are set explicitly (folders 0755, files 0644): mkdtemp makes 0700 and the
    umask is the caller's, but a report is meant to be read by others.
    """
    for root, dirs, files in os.walk(tmp):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    os.chmod(tmp, 0o755)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_file(path: Path, text: str) -> None:
    """Write one file atomically (temp file in the same folder, then rename), mode 0644."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def jsonable(obj):
    """Plain JSON types; NaN/inf become None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if obj is pd.NA or obj is pd.NaT:
        return None
    return obj
