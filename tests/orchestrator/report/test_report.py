"""build_report / load_study / export_study against real MLflow runs with known answers."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest

from orchestrator.report import ReportError, build_report, export_study, load_study
from orchestrator.report.query import _query_client, _read_tables_sqlalchemy, query_study
from tests.fixtures.synthetic import ALL_FAILED, MAIN, NO_EXTEND, ONE_SEED


def _scale(summary, name):
    return next(s for s in summary["scales"] if s["scale"] == name)


def test_token_ratio_recovers_known_2_4_with_covering_interval(main_report):
    summary, _ = main_report
    truth = MAIN.true_ratio("coupled")
    assert truth == 2.4
    assert [s["scale"] for s in summary["scales"]] == ["xs", "s", "m"]  # ordered by N
    for s in summary["scales"]:
        assert s["target"] == "coupled"
        assert not s["censored"]
        assert s["token_ratio"] == pytest.approx(truth, rel=0.03), s["scale"]
        lo, hi = s["token_ratio_ci"]
        assert lo <= truth <= hi, s["scale"]
        # tokens mode: the FLOP ratio scales by flops_per_token (synthetic coupled = 1.0011 x standard)
        assert s["flop_ratio"] == pytest.approx(s["token_ratio"] / 1.0011, rel=1e-6)
        # synthetic coupled runs 1.1x slower per token: equal-ppl wall-clock ratio = ratio / 1.1
        assert s["wall_ratio"] == pytest.approx(s["token_ratio"] / 1.1, rel=0.01)
        # the single-run estimate is labelled; on these synthetic runs it is high by construction
        # (schedule_gap: intermediate points carry the not-yet-annealed LR), so it is no flag
        r = s["ratios"]["coupled"]
        assert "single-run curve estimate" in r["single_run_source"]
        assert r["single_run"]["value"] > s["token_ratio"]
        assert r["single_run_flag"] is None and "overstates" not in r["single_run_source"]


def test_target_beyond_extend_range_is_censored_not_extrapolated(main_report):
    summary, out = main_report
    for s in summary["scales"]:
        r = s["ratios"]["uncoupled_mlp"]["token_ratio"]
        assert r["censored"] and r["direction"] == ">"
        assert r["value"] == pytest.approx(3.0)  # the bound: the longest extend run
        assert r["display"] == ">3.00x"
    table = pd.read_csv(out / "token_ratio.csv")
    row = table[(table["variant"] == "uncoupled_mlp") & (table["scale"] == "xs")].iloc[0]
    assert row["token_ratio"] == ">3.00x" and bool(row["censored"])
    assert ">3.00x" in (out / "report.md").read_text()


def test_failed_and_missing_runs_are_listed(main_report):
    summary, out = main_report
    runs = summary["runs"]
    assert [(r["run_name"], r["detail"]) for r in runs["failed"]] == [("coupled-s-s2-x1", "synthetic failure: loss became NaN")]
    assert [(r["variant"], r["scale"], r["seed"], r["extend"]) for r in runs["missing"]] == [("standard", "m", 1, 2.0)]
    md = (out / "report.md").read_text()
    assert "coupled-s-s2-x1" in md and "synthetic failure: loss became NaN" in md
    issues = pd.read_csv(out / "issues.csv")
    assert sorted(issues["problem"]) == ["failed", "missing"]
    # the failed seed is excluded from the mean: scale s has two coupled seeds
    assert _scale(summary, "s")["n_seeds"]["coupled"] == 2


def test_outputs_written_and_summary_matches_file(main_report):
    summary, out = main_report
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "report.html", "summary.json", "final_ppl.csv", "token_ratio.csv", "seed_std.csv"} <= names
    assert {"ppl_vs_tokens.png", "ppl_vs_flops.png", "ppl_vs_wallclock.png", "scaling.png", "seed_std.png", "attention.png"} <= names
    assert json.loads((out / "summary.json").read_text())["scales"] == summary["scales"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
    # paper reference numbers are printed beside ours
    md = (out / "report.md").read_text()
    assert "24.22" in md and "22.55-22.62" in md and "0.31" in md
    # 3 scales for the 3-parameter law (5 needed): every fit is refused with its reason (test_scaling.py
    # has the studies whose fits are made), and the seed std of the noisy variant is the largest
    fit = summary["scaling"]["fits"]["coupled"]["N"]
    assert fit["fit"] is None and "a fit needs at least 5 distinct scales" in fit["reason"]
    std = {(r["scale"], r["variant"]): r["std"] for r in summary["seed_std"]}
    assert std[("m", "uncoupled_mlp")] > std[("m", "coupled")]


def test_report_is_logged_to_mlflow_and_excluded_from_training_runs(main_report, synthetic_store):
    summary, _ = main_report
    client = mlflow.MlflowClient(synthetic_store)
    run = client.get_run(summary["mlflow_report_run"])
    assert run.data.tags["qkstudy.kind"] == "report"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"report.html", "report.md", "summary.json"}
    data = query_study(MAIN.study, synthetic_store, with_metrics=False)
    assert summary["mlflow_report_run"] not in set(data.runs["run_uuid"])
    assert len(data.runs) == len(MAIN.planned()) - len(MAIN.skip)


def test_one_seed_has_no_interval_and_says_so(synthetic_store, tmp_path):
    summary = build_report(ONE_SEED.study, synthetic_store, tmp_path / "r", log_to_mlflow=False, n_boot=50)
    s = summary["scales"][0]
    assert s["token_ratio"] == pytest.approx(2.4, rel=0.03)
    assert s["token_ratio_ci"] is None
    assert "one seed" in s["token_ratio_reason"]


def test_no_extend_runs_gives_null_ratio_with_reason(synthetic_store, tmp_path):
    summary = build_report(NO_EXTEND.study, synthetic_store, tmp_path / "r", log_to_mlflow=False, n_boot=50)
    s = summary["scales"][0]
    assert s["token_ratio"] is None and not s["censored"]
    assert "extend" in s["token_ratio_reason"]
    assert "extend" in (tmp_path / "r" / "report.md").read_text()


def test_existing_report_folder_is_replaced_whole(synthetic_store, tmp_path):
    out = tmp_path / "r"
    build_report(ONE_SEED.study, synthetic_store, out, log_to_mlflow=False, n_boot=10)
    (out / "stale.txt").write_text("old")
    build_report(ONE_SEED.study, synthetic_store, out, log_to_mlflow=False, n_boot=10)
    assert not (out / "stale.txt").exists() and (out / "report.html").exists()


def test_unknown_study_or_store_raises_report_error(synthetic_store, tmp_path):
    with pytest.raises(ReportError, match="no-such-study"):
        load_study("no-such-study", synthetic_store)
    with pytest.raises(ReportError, match="does not exist"):
        build_report("ratio", f"sqlite:///{tmp_path}/absent.db", tmp_path / "r")
    with pytest.raises(ReportError, match="reference variant"):
        build_report(ONE_SEED.study, synthetic_store, tmp_path / "r", reference="nope", log_to_mlflow=False)
    assert not (tmp_path / "r").exists()


def test_tidy_table_and_parquet_export(synthetic_store, tmp_path):
    df = load_study(ONE_SEED.study, synthetic_store)
    n_runs = len(ONE_SEED.planned())
    assert df["run_uuid"].nunique() == n_runs
    ppl = df[(df["key"] == "val/ppl") & (df["variant"] == "coupled")]
    assert len(ppl) == ONE_SEED.n_eval and ppl["step"].is_monotonic_increasing
    assert ppl["step"].iloc[-1] == ppl["planned_tokens"].iloc[0]  # step = tokens seen
    out = export_study(ONE_SEED.study, synthetic_store, tmp_path / "x" / "study.parquet")
    back = pd.read_parquet(out)
    assert len(back) == len(df) and {"variant", "scale", "seed", "extend", "key", "step", "value"} <= set(back.columns)


def test_sql_bulk_path_matches_client_api_path(synthetic_store):
    sql = query_study(ONE_SEED.study, synthetic_store)
    api = _query_client(ONE_SEED.study, synthetic_store, True)
    alchemy = _read_tables_sqlalchemy(synthetic_store, ONE_SEED.study, ["metrics"])[1]["metrics"]
    assert len(alchemy) == len(sql.metrics)  # the non-SQLite SQL path (postgres) reads the same rows
    cols = ["run_uuid", "variant", "scale", "seed", "extend", "status", "n_params", "planned_tokens"]
    pd.testing.assert_frame_equal(sql.runs[cols].reset_index(drop=True), api.runs[cols].reset_index(drop=True))
    pd.testing.assert_frame_equal(sql.metrics.reset_index(drop=True), api.metrics.reset_index(drop=True))


def test_study_where_every_run_failed_still_reports_them(synthetic_store, tmp_path):
    summary = build_report(ALL_FAILED.study, synthetic_store, tmp_path / "r", log_to_mlflow=False, n_boot=20)
    assert sorted(r["run_name"] for r in summary["runs"]["failed"]) == ["coupled-xs-s0-x1", "standard-xs-s0-x1", "standard-xs-s0-x2"]
    s = summary["scales"][0]
    assert s["token_ratio"] is None and s["final_ppl"] == {}
    assert "no finished coupled run" in s["token_ratio_reason"]
    assert "standard-xs-s0-x2" in (tmp_path / "r" / "report.html").read_text()


def test_paper_numbers_printed_beside_matching_scales(synthetic_store, tmp_path):
    from tests.synthetic_study import SyntheticStudy, write_synthetic_study

    spec = SyntheticStudy(study="paper-scales", scales={"cpu-xs": 6e5, "60m": 2.5e7}, seeds=(0, 1), extend=(3.0,), n_eval=5)
    write_synthetic_study(spec, synthetic_store)
    build_report(spec.study, synthetic_store, tmp_path / "r", log_to_mlflow=False, n_boot=20)
    final_section = (tmp_path / "r" / "report.md").read_text().split("## Paper reference numbers")[0]
    rows = {
        line.split("|")[1].strip() + "/" + line.split("|")[2].strip(): line
        for line in final_section.splitlines()
        if line.startswith("| ") and "±" in line
    }
    assert "24.22" in rows["60m/standard"] and "22.55-22.62" in rows["60m/coupled"]
    assert "nan" not in rows["cpu-xs/coupled"] and "—" in rows["cpu-xs/coupled"]


def test_two_corpora_are_reported_separately(synthetic_store, tmp_path):
    """Scales are never pooled across corpora: each corpus gets its own ratio."""
    from orchestrator.report import build_report
    from tests.synthetic_study import SyntheticStudy, write_synthetic_study

    common = dict(study="two-corpora", scales={"xs": 2e6}, seeds=(0, 1, 2), extend=(1.5, 2.0, 3.0), n_eval=8)
    write_synthetic_study(SyntheticStudy(corpus="code", variants={"standard": 1.0, "coupled": 2.4}, **common), synthetic_store)
    write_synthetic_study(SyntheticStudy(corpus="web", variants={"standard": 1.0, "coupled": 1.5}, **common), synthetic_store)
    summary = build_report("two-corpora", synthetic_store, tmp_path / "out", log_to_mlflow=False)
    assert summary["corpora"] == ["code", "web"]
    ratios = {s["corpus"]: s["token_ratio"] for s in summary["scales"]}
    assert ratios["code"] == pytest.approx(2.4, rel=0.03) and ratios["web"] == pytest.approx(1.5, rel=0.03)
    for c in ("code", "web"):
        assert (tmp_path / "out" / c / "report.md").exists()
    index = (tmp_path / "out" / "report.md").read_text()
    assert "[code](code/report.md)" in index and "| web | xs |" in index
    one = build_report("two-corpora", synthetic_store, tmp_path / "web", corpus="web", log_to_mlflow=False)
    assert [s["corpus"] for s in one["scales"]] == ["web"]


def test_cost_and_attention_tables_pair_runs_by_seed(main_report):
    """Synthetic non-reference variants run 1.1x slower per token on the same tokens and end
    with effective rank 35 against the reference's 30 (tests.synthetic_study)."""
    summary, out = main_report
    for s in summary["scales"]:
        assert s["time_per_token_ratio"]["standard"] == pytest.approx(1.0)
        assert s["time_per_token_ratio"]["coupled"] == pytest.approx(1.1, rel=1e-6)
        assert s["run_wall_ratio"]["coupled"] == pytest.approx(1.1, rel=1e-6)
        assert s["effective_rank"] == pytest.approx({v: 30.0 if v == "standard" else 35.0 for v in s["effective_rank"]})
    cost = pd.read_csv(out / "cost.csv")
    assert set(cost["variant"]) == {"standard", "coupled", "uncoupled_mlp"}
    assert list(cost["scale"].drop_duplicates()) == ["xs", "s", "m"]
    assert cost["time_per_token_ratio_std"].abs().max() < 1e-9  # the synthetic slowdown is exact for every seed
    att = pd.read_csv(out / "attention.csv")
    assert (att["n_seeds"] <= 3).all() and att.loc[att["variant"] == "standard", "entropy"].round(6).eq(2.5).all()
    md = (out / "report.md").read_text()
    assert "## Cost and attention at the planned budget" in md and "1.100 ± 0.000" in md
