"""MQAR accuracy (`val/accuracy`, `final/val_accuracy`) is reported per variant, mean ± std over seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from orchestrator.report import build_report
from orchestrator.track.tracking import run_tag
from tests.synthetic_study import SyntheticStudy, write_synthetic_study

MQAR = SyntheticStudy(
    study="mqar-acc",
    variants={"standard": 1.0, "coupled": 1.5},
    scales={"xs": 2e6, "s": 8e6},
    seeds=(0, 1, 2),
    extend=(2.0,),
    n_eval=6,
    accuracy={"standard": 0.62, "coupled": 0.97},
    accuracy_noise=0.01,
    corpus="mqar",
)


@pytest.fixture(scope="module")
def mqar_report(synthetic_store, tmp_path_factory):
    write_synthetic_study(MQAR, synthetic_store)
    out = tmp_path_factory.mktemp("mqar") / "r"
    return build_report(MQAR.study, synthetic_store, out, log_to_mlflow=False, n_boot=20), out


def _logged(synthetic_store) -> pd.DataFrame:
    """final/val_accuracy of every x1 run, read back through the MLflow client."""
    client = MlflowClient(synthetic_store)
    exp = client.get_experiment_by_name(MQAR.study)
    rows = [
        {"scale": run_tag(r.data.tags, "scale"), "variant": run_tag(r.data.tags, "variant"), "acc": r.data.metrics["final/val_accuracy"]}
        for r in client.search_runs([exp.experiment_id])
        if run_tag(r.data.tags, "extend") == "1"
    ]
    return pd.DataFrame(rows)


def test_accuracy_table_is_the_seed_mean_and_std_of_the_logged_finals(mqar_report, synthetic_store):
    summary, out = mqar_report
    table = pd.read_csv(out / "accuracy.csv")
    truth = _logged(synthetic_store).groupby(["scale", "variant"])["acc"].agg(["mean", "std", "size"])
    assert len(table) == 4 and list(table["variant"].drop_duplicates()) == ["standard", "coupled"]  # reference first
    for r in table.itertuples():
        t = truth.loc[(r.scale, r.variant)]
        assert r.mean == pytest.approx(t["mean"], abs=1e-12) and r.std == pytest.approx(t["std"], abs=1e-12) and r.n_seeds == 3
        assert r.mean == pytest.approx(MQAR.accuracy[r.variant], abs=0.03)  # 3 seeds of noise 0.01
    md = (out / "report.md").read_text()
    section = md.split("## MQAR accuracy")[1].split("## ")[0]
    c = truth.loc[("xs", "coupled")]
    assert f"{100 * c['mean']:.2f} ± {100 * c['std']:.2f}" in section
    assert "accuracy.csv" in summary["tables"]


def test_studies_without_accuracy_have_no_accuracy_section(main_report):
    summary, out = main_report
    assert "## MQAR accuracy" not in (out / "report.md").read_text()
    assert not (out / "accuracy.csv").exists() and "accuracy.csv" not in summary["tables"]
    runs = pd.read_csv(out / "runs.csv")
    assert np.isnan(runs["final_accuracy"]).all()


def test_accuracy_curves_give_each_seeds_crossings_and_the_ratio_at_90pct(mqar_report, synthetic_store):
    """The synthetic runs log val/accuracy = final accuracy x step / planned tokens, a line through
    0, so each seed crosses a at a / final x planned exactly. Standard (0.62) never reaches 90%:
    coupled's ratio there is a '>' bound, with no interval."""
    summary, out = mqar_report
    cross = pd.read_csv(out / "accuracy_crossings.csv")
    client = MlflowClient(synthetic_store)
    exp = client.get_experiment_by_name(MQAR.study)
    logged = {
        (run_tag(r.data.tags, "scale"), run_tag(r.data.tags, "variant"), int(run_tag(r.data.tags, "seed"))): (
            r.data.metrics["final/val_accuracy"],
            float(r.data.params["planned_tokens"]),
        )
        for r in client.search_runs([exp.experiment_id])
        if run_tag(r.data.tags, "extend") == "1"
    }
    assert len(cross) == len(logged) == 12
    for r in cross.itertuples():
        acc, planned = logged[(r.scale, r.variant, r.seed)]
        assert r.tokens_to_50pct == pytest.approx(0.5 / acc * planned, rel=1e-6)
        assert (r.tokens_to_90pct == pytest.approx(0.9 / acc * planned, rel=1e-6)) if acc >= 0.9 else np.isnan(r.tokens_to_90pct)
    ratio = {r["scale"]: r for r in summary["accuracy_ratio"]}
    for scale in ("xs", "s"):
        r = ratio[scale]
        assert r["direction"] == ">" and r["ci_low"] is None and r["pairs"] == 3
        bound = [
            logged[(scale, "standard", s)][1] / (0.9 / logged[(scale, "coupled", s)][0] * logged[(scale, "coupled", s)][1])
            for s in (0, 1, 2)
        ]
        assert r["ratio"] == pytest.approx(float(np.exp(np.mean(np.log(bound)))), rel=1e-6)
    section = (out / "report.md").read_text().split("## MQAR accuracy")[1].split("\n## ")[0]
    assert f">{ratio['xs']['ratio']:.2f}x" in section and "accuracy_vs_tokens.png" in section
    assert (out / "accuracy_vs_tokens.png").stat().st_size > 0
