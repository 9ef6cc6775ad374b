"""Benchmark: report a 1,000-run study with 200 eval points per run from a SQLite MLflow store.

    python -m benchmarks.report [--cache DIR] [--no-append]

The synthetic store (``tests.synthetic_study``, the tests' studies with a known answer; runs
created through the MLflow client, metric rows bulk-inserted into MLflow's tables) takes
minutes to build, so it is cached under DIR (default $XDG_CACHE_HOME/qkstudy/report-bench
or ~/.cache/...), keyed by the study's definition. Times: query_study (bulk SQL read), build_report end to end (including
figures, HTML and logging the artifacts to MLflow), export_study (Parquet). The target is
< 60 s for build_report; results are appended to BENCHMARKS.md with machine and date.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.report.build import build_report
from orchestrator.report.query import export_study, query_study
from orchestrator.track.tracking import sqlite_path, sqlite_uri
from tests.synthetic_study import SyntheticStudy, write_synthetic_study

SECTION = "## Report from MLflow (`python -m benchmarks.report`)"
# 5 scales x 20 seeds x (4 variants + standard at x1 and 5 extend levels) = 1,000 runs.
BENCH = SyntheticStudy(
    study="bench-1000",
    variants={"standard": 1.0, "coupled": 2.4, "uncoupled_mlp": 1.6, "differential": 2.0, "coupled_differential": 2.6},
    scales={"cpu-xs": 6e5, "cpu-s": 2.2e6, "cpu-m": 6.3e6, "60m": 2.5e7, "150m": 8.5e7},
    seeds=tuple(range(20)),
    extend=(1.5, 2.0, 2.4, 3.0, 4.0),
    n_eval=200,
    seed_noise={"uncoupled_mlp": 0.014},
)


def _cache_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "qkstudy" / "report-bench"


def bench_store(cache: Path, study: SyntheticStudy = BENCH) -> tuple[str, float | None]:
    """The cached store's tracking URI, built if absent; returns (uri, build seconds or None)."""
    key = hashlib.sha256(repr(asdict(study)).encode()).hexdigest()[:12]
    db = cache / f"{study.study}-{key}.db"
    if db.exists():
        return sqlite_uri(db), None
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".db.tmp", dir=cache)
    os.close(fd)
    os.unlink(tmp)  # MLflow creates the schema itself
    t0 = time.perf_counter()
    try:
        write_synthetic_study(study, sqlite_uri(tmp), bulk_sql=True)
        os.replace(tmp, db)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return sqlite_uri(db), time.perf_counter() - t0


def _machine() -> str:
    from benchmarks.record import machine_description

    return machine_description()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", help="folder for the cached synthetic MLflow store")
    ap.add_argument("--no-append", action="store_true", help="do not append to BENCHMARKS.md")
    args = ap.parse_args(argv)
    machine = _machine()
    uri, built = bench_store(_cache_dir(args.cache))
    # Reports log a run into the store; work on a copy so the cached store stays pristine.
    work = Path(tempfile.mkdtemp(prefix="qkstudy-report-bench-"))
    try:
        db = work / "mlflow.db"
        shutil.copy(str(sqlite_path(uri)), db)  # bench_store's URI is a sqlite file
        uri = sqlite_uri(db)
        t0 = time.perf_counter()
        data = query_study(BENCH.study, uri)
        t_query = time.perf_counter() - t0
        n_runs, n_points = len(data.runs), len(data.metrics)
        del data
        t0 = time.perf_counter()
        summary = build_report(BENCH.study, uri, work / "report")
        t_report = time.perf_counter() - t0
        t0 = time.perf_counter()
        export_study(BENCH.study, uri, work / "study.parquet")
        t_export = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {
        "runs": n_runs,
        "metric_points": n_points,
        "store_build_s": built,
        "query_s": t_query,
        "build_report_s": t_report,
        "export_s": t_export,
        "headline": {s["scale"]: s["token_ratio_display"] for s in summary["scales"]},
    }
    line = (
        f"| {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC | {machine} | {n_runs} runs x {BENCH.n_eval} eval points "
        f"({n_points:,} metric rows), SQLite | {t_query:.1f} s | {t_report:.1f} s | {t_export:.1f} s | "
        f"{'cached' if built is None else f'{built:.0f} s'} |"
    )
    print(line)
    print(f"token ratio coupled vs standard (truth 2.40x): {res['headline']}")
    if not args.no_append:
        _append(line)
    return res


def _append(line: str) -> None:
    """Append a row; the table header too unless this file's last section is already ours.

    Others append to the same file, so it is only ever appended to, never rewritten.
    """
    path = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else ""
    sections = [ln for ln in text.splitlines() if ln.startswith("## ")]
    if sections and sections[-1].startswith(SECTION):
        with open(path, "a") as f:
            f.write(line + "\n")
        return
    block = (
        f"\n{SECTION}\n\n"
        "Target: build_report of a 1,000-run study (200 eval points each) under 60 s. Columns: bulk query "
        "(all runs and metric histories), build_report end to end (query, statistics, 7 figures, HTML, "
        "artifacts logged to MLflow), Parquet export, synthetic store build.\n\n"
        "| date | machine | study | query | build_report | export | store build |\n|---|---|---|---|---|---|---|\n" + line + "\n"
    )
    with open(path, "a") as f:
        f.write(block)


if __name__ == "__main__":
    main()
