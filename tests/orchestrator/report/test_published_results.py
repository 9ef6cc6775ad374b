"""The published CPU study (results/cpu-study, its RESULTS.md) is regenerated from its MLflow
store by the command its RESULTS.md gives, and every number its RESULTS.md quotes is the
regenerated report's (store -> report -> RESULTS.md, checked in one place)."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.report import build_report
from tests import published
from tests.helpers import REPO
from tests.published import Quote, assert_shared_tables_equal, unzip_store

STORE = REPO / "results" / "cpu-study-mlflow.db.gz"
PUBLISHED = REPO / "results" / "cpu-study"
TEXT = (PUBLISHED / "RESULTS.md").read_text() if (PUBLISHED / "RESULTS.md").exists() else ""
CORPORA = ("mixed", "stdlib")
TABLES = ["final_ppl", "paired", "token_ratio", "seed_std", "cost", "attention"]

pytestmark = pytest.mark.skipif(not STORE.exists(), reason="no published cpu-study store")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """The report built once from the published store: (summary, report folder)."""
    tmp = tmp_path_factory.mktemp("cpu-study")
    summary = build_report("cpu-study", unzip_store(STORE, tmp), tmp / "report", log_to_mlflow=False)
    return summary, tmp / "report"


def _minus(x: float, fmt: str) -> str:
    """A signed number as the prose of RESULTS.md prints it (a typographic minus)."""
    return format(x, fmt).replace("-", "−")


def quoted_numbers(report: Path) -> list[Quote]:
    """What this RESULTS.md must quote, formatted from the report's tables under ``report`` as
    the page prints them: (section heading or None for anywhere, the exact text)."""
    out: list[Quote] = []
    read = {c: (lambda name, c=c: pd.read_csv(report / c / f"{name}.csv")) for c in CORPORA}
    for corpus in CORPORA:
        sec = f"### {corpus}"
        tr = read[corpus]("token_ratio").set_index(["scale", "variant"])
        cost = read[corpus]("cost").set_index(["scale", "variant"])
        att = read[corpus]("attention").set_index(["scale", "variant"])
        for r in read[corpus]("final_ppl").itertuples():
            key = (r.scale, r.variant)
            out.append((None, f"{r.mean_ppl:.2f} ± {r.std:.2f}"))
            ratio = "—" if key not in tr.index else f"{tr.loc[key, 'token_ratio']} {tr.loc[key, 'interval_95']}"
            c, a = cost.loc[key], att.loc[key]
            out.append(
                (
                    sec,
                    f"| {r.scale} | {r.variant} | {r.mean_ppl:.2f} ± {r.std:.2f} ({r.n_seeds}) | "
                    f"{r.change_vs_reference_pct:+.1f}% | {ratio} | "
                    f"{c.time_per_token_ratio:.3f} ± {c.time_per_token_ratio_std:.3f} | "
                    f"{c.wall_ratio:.3f} ± {c.wall_ratio_std:.3f} | "
                    f"{a.effective_rank:.2f} ± {a.effective_rank_std:.2f} |",
                )
            )
    paired = {c: read[c]("paired").set_index(["scale", "variant"]) for c in CORPORA}
    # Findings 1: the range of coupled's paired p-values over the six cells.
    ps = pd.concat([paired[c].xs("coupled", level="variant")["p_value"] for c in CORPORA])
    out.append(("## Findings", f"(p {ps.min():.2f} to {ps.max():.2f})"))

    def dloss(p):
        return f"{_minus(p.paired_dloss, '+.3f')} [{_minus(p.paired_low, '+.3f')}, {_minus(p.paired_high, '+.3f')}]"

    # Findings 2: the one detectable difference, uncoupled MLP at stdlib cpu-m.
    u = paired["stdlib"].loc[("cpu-m", "uncoupled_mlp")]
    out.append(
        (
            "## Findings",
            f"paired Δ loss {_minus(u.paired_dloss, '+.3f')} nats [{_minus(u.paired_low, '+.3f')}, "
            f"{_minus(u.paired_high, '+.3f')}], p = {u.p_value:.3f}",
        )
    )
    # Findings 5: coupled at cpu-m on both corpora.
    out.append(
        (
            "## Findings",
            f"paired Δ loss {dloss(paired['stdlib'].loc[('cpu-m', 'coupled')])} nats on stdlib, "
            f"{dloss(paired['mixed'].loc[('cpu-m', 'coupled')])} on the mixture",
        )
    )
    # Findings 8: standard's finals rise with scale on stdlib.
    fp = read["stdlib"]("final_ppl")
    std = fp[fp["variant"] == "standard"].set_index("scale").loc[["cpu-xs", "cpu-s", "cpu-m"], "mean_ppl"]
    out.append(("## Findings", "stdlib standard " + ", ".join(f"{x:.2f}" for x in std)))
    return out


def missing_quotes(text: str, report: Path) -> list[Quote]:
    """The numbers ``quoted_numbers(report)`` asks for that ``text`` does not print where it should."""
    return published.missing_quotes(text, quoted_numbers(report))


@pytest.mark.slow
def test_report_regenerates_from_the_published_store(regenerated):
    """Every table present both in the published folder and in the regenerated report agrees
    (a table the report gained since publication does not force regeneration)."""
    summary, out = regenerated
    _no_unsupported_scaling_claims(summary, out)
    corpora = sorted(p.name for p in PUBLISHED.iterdir() if p.is_dir())
    assert corpora == ["mixed", "stdlib"]
    for corpus in corpora:
        assert_shared_tables_equal(PUBLISHED / corpus, out / corpus, {f"{t}.csv" for t in TABLES}, corpus)
        assert any((PUBLISHED / corpus).glob("*.png")) and any((out / corpus).glob("*.png")), corpus


@pytest.mark.slow
def test_results_md_quotes_the_regenerated_report(regenerated):
    """Every seed-mean final perplexity, the per-corpus table rows (change, token ratio and its
    interval, wall-clock ratios, effective rank) and the paired differences the findings quote
    are the regenerated report's, as RESULTS.md prints them."""
    assert TEXT, "results/cpu-study/RESULTS.md is missing"
    assert missing_quotes(TEXT, regenerated[1]) == []


def test_the_quote_check_fails_on_a_misquote(tmp_path):
    """Negative control: the published tables (the report's layout) pass the check; one final
    perplexity moved by 0.01 is reported missing, and so is one number typed wrong into the page."""
    for corpus in CORPORA:
        shutil.copytree(PUBLISHED / corpus, tmp_path / corpus, ignore=shutil.ignore_patterns("*.png", "*.html"))
    assert missing_quotes(TEXT, tmp_path) == []
    fp = pd.read_csv(tmp_path / "stdlib" / "final_ppl.csv")
    fp.loc[0, "mean_ppl"] += 0.01
    fp.to_csv(tmp_path / "stdlib" / "final_ppl.csv", index=False)
    r = fp.iloc[0]
    missing = missing_quotes(TEXT, tmp_path)
    assert (None, f"{r.mean_ppl:.2f} ± {r['std']:.2f}") in missing
    assert any(sec == "### stdlib" and f"| {r.scale} | {r.variant} | {r.mean_ppl:.2f}" in s for sec, s in missing)
    shutil.copy(PUBLISHED / "stdlib" / "final_ppl.csv", tmp_path / "stdlib" / "final_ppl.csv")
    typo = missing_quotes(TEXT.replace("1.33x [<1.02, 1.82]", "1.33x [<1.02, 1.83]"), tmp_path)
    assert len(typo) == 1 and typo[0][0] == "### mixed" and "1.33x [<1.02, 1.82]" in typo[0][1], typo


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
            assert "needs at least 5 distinct scales" in fits[axis]["reason"] and "loss does not fall with" in fits[axis]["reason"]
    assert all(c["n"] is None and c["note"].startswith("no advantage at the smallest measured scale") for c in parts["crossover"].values())
