"""The published ladder study (jobs/cpu-ladder.yaml, results/cpu-ladder*): three custom scales
with a tokens-per-parameter budget and an LR tuned per arm. Its report regenerates from its
store (every table the published folder and the regenerated report share agrees), and every
number RESULTS.md's ladder section quotes is the regenerated report's; in the data, every seed's final perplexity falls with N in both arms,
each main run trained at its (variant, scale)'s tuned LR (the ``lr`` param, and the logged
``lr`` peaks there), and the report refuses the 3-parameter scaling fit on 3 scales instead of forcing it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from orchestrator.report import build_report
from orchestrator.track.tracking import run_tag
from tests import published
from tests.helpers import REPO
from tests.published import Quote, assert_shared_tables_equal, unzip_store

RESULTS = REPO / "results"
STUDY = "cpu-ladder"
STORE = RESULTS / f"{STUDY}-mlflow.db.gz"
RUNGS = ["n400k", "n800k", "n1.6M"]

pytestmark = pytest.mark.skipif(not STORE.exists(), reason="no published cpu-ladder store")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return unzip_store(STORE, tmp_path_factory.mktemp("ladder"))


@pytest.fixture(scope="module")
def regenerated(store, tmp_path_factory) -> Path:
    """The report built once from the published store."""
    out = tmp_path_factory.mktemp("ladder-report") / "report"
    build_report(STUDY, store, out, log_to_mlflow=False)
    return out


SECTION = "## A scale ladder"
EDGE = {"highest": " (grid's top)", "lowest": " (grid's bottom)"}


def quoted_numbers(report: Path) -> list[Quote]:
    """What RESULTS.md must quote about the ladder, formatted from the report's tables under
    ``report`` as the page prints them: (section heading or None for anywhere, the exact text)."""
    out: list[Quote] = []
    fp = pd.read_csv(report / "final_ppl.csv")
    for r in fp.itertuples():
        out.append((None, f"{r.mean_ppl:.2f} ± {r.std:.2f}"))
        out.append((None, f"{int(r.tokens):,}"))
    by = fp.set_index(["scale", "variant"])
    tuning = pd.read_csv(report / "tuning.csv").fillna({"edge": ""}).set_index(["variant", "scale"])
    for rung in RUNGS:
        s, d = by.loc[(rung, "standard")], by.loc[(rung, "differential")]
        ts, td = tuning.loc[("standard", rung)], tuning.loc[("differential", rung)]
        edge = EDGE.get(ts["edge"], "") if ts["edge"] == td["edge"] else "?"
        out.append(
            (
                SECTION,
                f"| {rung} | {int(s.n_params):,} | {int(s.tokens):,} | {s.mean_ppl:.2f} ± {s['std']:.2f} | "
                f"{d.mean_ppl:.2f} ± {d['std']:.2f} | {ts.chosen_lr:g} / {td.chosen_lr:g}{edge} |",
            )
        )
    paired = pd.read_csv(report / "paired.csv").set_index("scale").loc[RUNGS]
    out.append((SECTION, "(" + ", ".join(f"{p:+.0f}%" for p in paired["paired_ppl_pct"]) + ", seed-paired)"))
    uni = pd.read_csv(report / "unigram.csv")
    out.append((SECTION, f"(unigram perplexity {uni['unigram_ppl'].iloc[0]:.1f})"))
    for r in uni[uni["ppl_over_unigram"] > 1].itertuples():
        out.append((SECTION, f"At {r.scale} it is above the unigram baseline ({r.ppl_over_unigram:.2f}x)"))
    return out


def missing_quotes(text: str, report: Path) -> list[Quote]:
    """The numbers ``quoted_numbers(report)`` asks for that ``text`` does not print where it should."""
    return published.missing_quotes(text, quoted_numbers(report))


@pytest.mark.slow
def test_report_regenerates_from_the_published_store(regenerated):
    """Every table present both in the published folder and in the regenerated report agrees
    (a table the report gained since publication does not force regeneration)."""
    csvs = {p.name for p in (RESULTS / STUDY).glob("*.csv")}
    assert {"final_ppl.csv", "tuning.csv", "runs.csv"} <= csvs
    assert_shared_tables_equal(RESULTS / STUDY, regenerated, {"final_ppl.csv", "tuning.csv", "runs.csv"}, STUDY)


def test_every_seeds_final_perplexity_falls_with_n():
    runs = pd.read_csv(RESULTS / STUDY / "runs.csv")
    assert (runs["status"] == "finished").all() and len(runs) == 12
    for (variant, seed), g in runs.groupby(["variant", "seed"]):
        by_rung = g.set_index("scale").loc[RUNGS]
        assert by_rung["n_params"].is_monotonic_increasing and by_rung["tokens"].is_monotonic_increasing
        ppl = by_rung["final_ppl"].to_list()
        assert ppl[0] > ppl[1] > ppl[2], (variant, seed, ppl)


@pytest.mark.slow
def test_each_main_run_trained_at_its_tuned_lr(store):
    chosen = {(r.variant, r.scale): r.chosen_lr for r in pd.read_csv(RESULTS / STUDY / "tuning.csv").itertuples()}
    assert len(chosen) == 6
    c = MlflowClient(store)
    exp = c.get_experiment_by_name(STUDY)
    main = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    assert len(main) == 12
    for r in main:
        want = chosen[(run_tag(r.data.tags, "variant"), run_tag(r.data.tags, "scale"))]
        assert float(r.data.params["lr"]) == want
        # logged every few steps, so the logged peak may sit just past the schedule's peak; the
        # grid's points are 3x apart
        peak = max(m.value for m in c.get_metric_history(r.info.run_id, "lr"))
        assert 0.98 * want <= peak <= want * (1 + 1e-9), (r.info.run_name, peak, want)


@pytest.mark.slow
def test_results_md_quotes_the_regenerated_ladder(regenerated):
    """The ladder's rows (N, tokens, both arms' finals, tuned LRs and their grid edges), the
    paired differences, the unigram perplexity and the arm above it are the regenerated report's."""
    text = (RESULTS.parent / "RESULTS.md").read_text()
    assert missing_quotes(text, regenerated) == []


def test_the_quote_check_fails_on_a_misquote(tmp_path):
    """Negative control: the published tables (the report's layout) pass the check; one final
    perplexity moved by 0.01, or one tuned LR typed wrong into the page, is reported missing."""
    text = (RESULTS.parent / "RESULTS.md").read_text()
    shutil.copytree(RESULTS / STUDY, tmp_path / STUDY, ignore=shutil.ignore_patterns("*.png", "*.html"))
    report = tmp_path / STUDY
    assert missing_quotes(text, report) == []
    fp = pd.read_csv(report / "final_ppl.csv")
    i = fp.index[(fp["scale"] == "n800k") & (fp["variant"] == "differential")][0]
    fp.loc[i, "mean_ppl"] += 0.01
    fp.to_csv(report / "final_ppl.csv", index=False)
    moved = f"{fp.loc[i, 'mean_ppl']:.2f} ± {fp.loc[i, 'std']:.2f}"
    missing = missing_quotes(text, report)
    assert (None, moved) in missing
    assert any(sec == SECTION and s.startswith("| n800k |") and moved in s for sec, s in missing), missing
    shutil.copy(RESULTS / STUDY / "final_ppl.csv", report / "final_ppl.csv")
    typo = missing_quotes(text.replace("| 0.003 / 0.003 |", "| 0.003 / 0.001 |"), report)
    assert len(typo) == 1 and typo[0][1].startswith("| n800k |"), typo


def test_the_scaling_fit_is_refused_on_three_scales():
    fits = json.loads((RESULTS / STUDY / "summary.json").read_text())["scaling"]["fits"]
    for variant in ("standard", "differential"):
        for axis in ("N", "flops"):
            assert fits[variant][axis]["fit"] is None and "at least 5 distinct scales" in fits[variant][axis]["reason"]
