"""Defects a new user hit: output safety, export checks, empty studies, report text, plots."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from orchestrator.report import ReportError, build_report, export_study
from tests.fixtures.synthetic import FIVE_SCALES, MAIN, ONE_SEED
from tests.synthetic_study import SyntheticStudy, write_synthetic_study

# One variant only, and its single run failed half-way: no finished run anywhere.
ONLY_FAILED = SyntheticStudy(
    study="only-failed",
    variants={"standard": 1.0},
    scales={"xs": 2e6},
    seeds=(0,),
    extend=(),
    n_eval=6,
    failed=(("standard", "xs", 0, 1.0),),
)
# One variant, finished: no non-reference variant to compare.
SINGLE_VARIANT = SyntheticStudy(study="single-variant", variants={"standard": 1.0}, scales={"xs": 2e6}, seeds=(0,), extend=(), n_eval=6)


@pytest.fixture(scope="module")
def extra_store(synthetic_store):
    """The session store plus the studies above and an experiment with no runs at all."""
    from mlflow import MlflowClient

    for spec in (ONLY_FAILED, SINGLE_VARIANT):
        write_synthetic_study(spec, synthetic_store)
    client = MlflowClient(synthetic_store)
    client.create_experiment("no-runs")
    # A run that failed at start-up: tags only, no params, not one metric.
    eid = client.create_experiment("failed-at-start")
    tags = {
        "study": "failed-at-start",
        "variant": "standard",
        "scale": "xs",
        "seed": "0",
        "extend": "1",
        "status": "failed",
        "failure_reason": "CUDA out of memory",
        "qkstudy.kind": "train",
    }
    rid = client.create_run(eid, run_name="standard-xs-s0-x1", tags=tags).info.run_id
    client.set_terminated(rid, status="FAILED")
    return synthetic_store


def _mode(p):
    return stat.S_IMODE(p.stat().st_mode)


# --- 1. never destroy what is not a previous report ------------------------------------------


def test_out_dir_that_is_a_file_is_refused_untouched(synthetic_store, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("precious")
    with pytest.raises(ReportError, match=re.escape(str(f))):
        build_report(ONE_SEED.study, synthetic_store, f, log_to_mlflow=False, n_boot=10)
    assert f.read_text() == "precious"


def test_foreign_non_empty_folder_is_refused_untouched(synthetic_store, tmp_path):
    d = tmp_path / "home"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    with pytest.raises(ReportError, match=re.escape(str(d))):
        build_report(ONE_SEED.study, synthetic_store, d, log_to_mlflow=False, n_boot=10)
    assert (d / "thesis.tex").read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["home"]  # no temp folder left behind


def test_foreign_summary_json_is_not_taken_for_a_report(synthetic_store, tmp_path):
    d = tmp_path / "other"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"generator": "something-else"}))
    with pytest.raises(ReportError, match="not a qkstudy report"):
        build_report(ONE_SEED.study, synthetic_store, d, log_to_mlflow=False, n_boot=10)
    assert (d / "summary.json").exists()


def test_previous_report_and_empty_folder_are_replaced(synthetic_store, tmp_path):
    d = tmp_path / "r"
    d.mkdir()  # empty: fine
    build_report(ONE_SEED.study, synthetic_store, d, log_to_mlflow=False, n_boot=10)
    assert json.loads((d / "summary.json").read_text())["generator"] == "qkstudy"
    build_report(ONE_SEED.study, synthetic_store, d, log_to_mlflow=False, n_boot=10)  # a report: fine
    assert (d / "report.md").exists()


def test_per_corpus_index_refuses_foreign_folder(synthetic_store, tmp_path):
    d = tmp_path / "corpora"
    d.mkdir()
    (d / "keep.txt").write_text("precious")
    with pytest.raises(ReportError, match=re.escape(str(d))):
        build_report("two-corpora", synthetic_store, d, log_to_mlflow=False, n_boot=10)
    assert sorted(p.name for p in d.iterdir()) == ["keep.txt"]


def test_report_files_are_world_readable(synthetic_store, tmp_path):
    d = tmp_path / "r"
    build_report(ONE_SEED.study, synthetic_store, d, log_to_mlflow=False, n_boot=10)
    assert _mode(d) == 0o755
    assert {_mode(p) for p in d.iterdir()} == {0o644}


# --- 2. export_study -------------------------------------------------------------------------


def test_export_refuses_wrong_suffix(synthetic_store, tmp_path):
    with pytest.raises(ReportError, match=r"\.parquet"):
        export_study(ONE_SEED.study, synthetic_store, tmp_path / "study.csv")
    assert not (tmp_path / "study.csv").exists()


def test_export_write_errors_become_report_error(synthetic_store, tmp_path):
    with pytest.raises(ReportError, match="/proc/x.parquet"):
        export_study(ONE_SEED.study, synthetic_store, "/proc/x.parquet")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match=re.escape(str(blocker / "sub"))):
        export_study(ONE_SEED.study, synthetic_store, blocker / "sub" / "s.parquet")


def test_export_file_is_world_readable(synthetic_store, tmp_path):
    out = export_study(ONE_SEED.study, synthetic_store, tmp_path / "s.parquet")
    assert _mode(out) == 0o644


# --- 3. studies without finished runs --------------------------------------------------------


def test_only_failed_run_gives_report_saying_nothing_to_compare(extra_store, tmp_path):
    summary = build_report(ONLY_FAILED.study, extra_store, tmp_path / "r", log_to_mlflow=False, n_boot=10)
    assert [r["run_name"] for r in summary["runs"]["failed"]] == ["standard-xs-s0-x1"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "standard-xs-s0-x1" in md and "no finished run to compare" in md


def test_run_failed_at_start_without_metrics_gives_report(extra_store, tmp_path):
    summary = build_report("failed-at-start", extra_store, tmp_path / "r", log_to_mlflow=False, n_boot=10)
    assert [r["detail"] for r in summary["runs"]["failed"]] == ["CUDA out of memory"]
    md = (tmp_path / "r" / "report.md").read_text()
    assert "standard-xs-s0-x1" in md and "no finished run to compare" in md


def test_experiment_without_runs_raises_report_error(extra_store, tmp_path):
    with pytest.raises(ReportError, match="study 'no-runs' has no training runs"):
        build_report("no-runs", extra_store, tmp_path / "r", log_to_mlflow=False)
    assert not (tmp_path / "r").exists()


# --- 4. unknown target ------------------------------------------------------------------------


def test_unknown_target_lists_variants(synthetic_store, tmp_path):
    with pytest.raises(ReportError, match=r"target variant 'nosuch'.*coupled"):
        build_report(ONE_SEED.study, synthetic_store, tmp_path / "r", target="nosuch", log_to_mlflow=False)


# --- 5. report text ---------------------------------------------------------------------------


def test_report_text_cites_readme_and_formats_numbers(main_report):
    _, out = main_report
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for text in (md, html):
        assert "DESIGN.md" not in text
    assert "Conventions the numbers depend on" in md
    # N and tokens as exact integers with thousands separators (xs: N = 2e6, 20 tokens/param).
    assert re.search(r"\|\s+2,000,000 \|", md) and re.search(r"\|\s+40,000,000 \|", md)
    final_table = md.split("## Paper reference")[0]
    assert not re.search(r"\|\s+\d(\.\d+)?e\+\d\d \|", final_table)
    # The censored bound shown in the table is described by the text.
    assert "`<1.00x`" not in md and "reference's x1 tokens" in md


def test_single_variant_text_says_no_ratio(extra_store, tmp_path):
    summary = build_report(SINGLE_VARIANT.study, extra_store, tmp_path / "r", log_to_mlflow=False, n_boot=10)
    md = (tmp_path / "r" / "report.md").read_text()
    assert "None`" not in md
    assert "no non-reference variant: no token ratio" in md
    ratio_section = md.split("## Token ratio at equal perplexity")[1].split("## ")[0]
    assert "| scale" not in ratio_section  # no empty table
    assert summary["target"] is None


def test_scaling_text_without_fit_does_not_contradict_itself(synthetic_store, tmp_path):
    build_report(ONE_SEED.study, synthetic_store, tmp_path / "r", log_to_mlflow=False, n_boot=10)
    md = (tmp_path / "r" / "report.md").read_text()
    assert "falls below 1% at N" not in md and "not below 1% up to" not in md
    assert "a fit needs at least 5 distinct scales" in md


def _drawn_figures(monkeypatch) -> dict:
    """Spy on Figure.savefig: {png name: figure}, inspected after the real save drew it."""
    from matplotlib.figure import Figure

    seen, save = {}, Figure.savefig

    def spy(fig, fname, *a, **k):
        save(fig, fname, *a, **k)
        seen[Path(fname).name] = {"titles": [ax.get_title() for ax in fig.axes], "overlaps": _overlaps(fig)}

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def _overlaps(fig) -> list[str]:
    """Pairs of drawn tick labels, axis labels and titles whose boxes overlap (by > 0.5 px)."""
    fig.draw_without_rendering()  # lay out again at the figure's own dpi (savefig drew at another)
    renderer = fig.canvas.get_renderer()
    boxes = []
    for i, ax in enumerate(fig.axes):
        for axis in (ax.xaxis, ax.yaxis):
            for t in axis._update_ticks():  # the ticks draw() used: inside the view limits
                if t.label1.get_visible() and t.label1.get_text():
                    boxes.append((f"ax{i} tick {t.label1.get_text()}", t.label1.get_window_extent(renderer)))
            if axis.label.get_text():
                boxes.append((f"ax{i} label {axis.label.get_text()}", axis.label.get_window_extent(renderer)))
        if ax.get_title():
            boxes.append((f"ax{i} title", ax.title.get_window_extent(renderer)))
    out = []
    for j, (na, a) in enumerate(boxes):
        for nb, b in boxes[j + 1 :]:
            if min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5:
                out.append(f"{na} / {nb}")
    return out


def test_scaling_title_mentions_fits_only_when_drawn(synthetic_store, tmp_path, monkeypatch):
    seen = _drawn_figures(monkeypatch)
    build_report(ONE_SEED.study, synthetic_store, tmp_path / "one", log_to_mlflow=False, n_boot=10)  # 1 scale: no fit
    assert seen["scaling.png"]["titles"] and not any("fit" in t for t in seen["scaling.png"]["titles"])
    build_report(MAIN.study, synthetic_store, tmp_path / "main", log_to_mlflow=False, n_boot=20)  # 3 scales: fits refused
    assert not any("fit" in t for t in seen["scaling.png"]["titles"])
    build_report(FIVE_SCALES.study, synthetic_store, tmp_path / "five", log_to_mlflow=False, n_boot=20)  # 5 scales: fits drawn
    assert any("fit" in t for t in seen["scaling.png"]["titles"])
    # 6. No figure has overlapping labels (log-axis minor tick labels, y label vs tick labels).
    assert {k: v["overlaps"] for k, v in seen.items() if v["overlaps"]} == {}
