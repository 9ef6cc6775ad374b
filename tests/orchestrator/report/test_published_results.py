"""The published CPU study (results/cpu-study, its RESULTS.md) is regenerated from its MLflow
store by the command its RESULTS.md gives, number for number."""

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.report import build_report

ROOT = Path(__file__).resolve().parents[3]
STORE = ROOT / "results" / "cpu-study-mlflow.db.gz"
PUBLISHED = ROOT / "results" / "cpu-study"
TABLES = ["final_ppl", "paired", "token_ratio", "seed_std", "cost", "attention"]

pytestmark = pytest.mark.skipif(not STORE.exists(), reason="no published cpu-study store")


def test_report_regenerates_from_the_published_store(tmp_path):
    db = tmp_path / "mlflow.db"
    with gzip.open(STORE, "rb") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    summary = build_report("cpu-study", f"sqlite:///{db}", tmp_path / "report", log_to_mlflow=False)
    _no_unsupported_scaling_claims(summary, tmp_path / "report")
    corpora = sorted(p.name for p in PUBLISHED.iterdir() if p.is_dir())
    assert corpora == ["mixed", "stdlib"]
    for corpus in corpora:
        for name in TABLES:
            published = pd.read_csv(PUBLISHED / corpus / f"{name}.csv")
            regenerated = pd.read_csv(tmp_path / "report" / corpus / f"{name}.csv")
            pd.testing.assert_frame_equal(regenerated, published, check_exact=False, rtol=1e-9)
        figures = sorted(p.name for p in (PUBLISHED / corpus).glob("*.png"))
        assert figures and figures == sorted(p.name for p in (tmp_path / "report" / corpus).glob("*.png"))


def test_results_md_quotes_the_published_report():
    """Every seed-mean final perplexity in the report's tables appears in its RESULTS.md."""
    text = (PUBLISHED / "RESULTS.md").read_text()
    for corpus in ("stdlib", "mixed"):
        fp = pd.read_csv(PUBLISHED / corpus / "final_ppl.csv")
        for r in fp.itertuples():
            assert f"{r.mean_ppl:.2f} ± {r.std:.2f}" in text, (corpus, r.scale, r.variant)


def _no_unsupported_scaling_claims(summary, out):
    """3 scales whose loss rises with N support no scaling law and no crossover: every fit is
    refused with both reasons, none is drawn, and no extrapolation is printed."""
    for corpus in ("stdlib", "mixed"):
        md = (out / corpus / "report.md").read_text()
        assert "advantage stays" not in md and "falls below 1%" not in md and "overstates" not in md
        assert "fit a=" not in md
    parts = json.loads((out / "stdlib" / "summary.json").read_text())["scaling"]
    for variant, fits in parts["fits"].items():
        for axis in ("N", "flops"):
            assert fits[axis]["fit"] is None, (variant, axis)
            assert "needs at least 4 distinct scales" in fits[axis]["reason"] and "loss does not fall with" in fits[axis]["reason"]
    assert all(c["n"] is None and c["note"].startswith("no advantage at the smallest measured scale")
               for c in parts["crossover"].values())
