"""The report prints each corpus's unigram perplexity (experiment tag) beside its finals,
with every (scale, variant)'s final / unigram ratio; an older store says it is not recorded."""

import json

import mlflow
import pandas as pd
import pytest

from orchestrator.report import build_report
from orchestrator.track.tracking import set_unigram_tags
from tests.fixtures.synthetic import ONE_SEED
from tests.synthetic_study import SyntheticStudy, write_synthetic_study

UNIGRAM = {"code": 812.5, "web": 1.25}  # web: below every final, so every arm is above half of it


@pytest.fixture(scope="module")
def two_corpora(synthetic_store, tmp_path_factory):
    common = dict(study="unigram-two-corpora", scales={"xs": 2e6, "s": 8e6}, seeds=(0, 1), extend=(2.0,), n_eval=6)
    write_synthetic_study(SyntheticStudy(corpus="code", **common), synthetic_store)
    write_synthetic_study(SyntheticStudy(corpus="web", **common), synthetic_store)
    client = mlflow.MlflowClient(synthetic_store)
    eid = client.get_experiment_by_name("unigram-two-corpora").experiment_id
    set_unigram_tags(client, eid, "code", UNIGRAM["code"], 123_456)
    set_unigram_tags(client, eid, "web", UNIGRAM["web"], 789)
    out = tmp_path_factory.mktemp("unigram") / "r"
    return build_report("unigram-two-corpora", synthetic_store, out, log_to_mlflow=False, n_boot=20), out


def test_ratio_is_each_arms_final_over_the_corpus_unigram(two_corpora):
    _, out = two_corpora
    for corpus, u in UNIGRAM.items():
        final = pd.read_csv(out / corpus / "final_ppl.csv")
        table = pd.read_csv(out / corpus / "unigram.csv")
        assert list(table[["scale", "variant"]].itertuples(index=False)) == list(final[["scale", "variant"]].itertuples(index=False))
        assert (table["unigram_ppl"] == u).all()
        assert table["ppl_over_unigram"].to_numpy() == pytest.approx(final["mean_ppl"].to_numpy() / u, rel=1e-12)
        runs = pd.read_csv(out / corpus / "runs.csv")
        worst = runs[runs["extend"] == 1.0].groupby(["scale", "variant"])["final_ppl"].max()
        assert table["worst_seed_ppl"].tolist() == [worst[(s, v)] for s, v in zip(table["scale"], table["variant"])]
        assert (table["worst_seed_ppl"] >= table["final_ppl"]).all()

        summary = json.loads((out / corpus / "summary.json").read_text())
        entry = summary["unigram"]
        assert entry["recorded"] and entry["corpus"] == corpus and entry["val_ppl"] == u
        assert entry["val_tokens"] == (123_456 if corpus == "code" else 789)
        assert entry["all_at_most_half"] is (corpus == "code")
        for s_ in summary["scales"]:
            mine = final[final["scale"] == s_["scale"]]
            assert s_["unigram_ppl"] == u
            assert s_["ppl_over_unigram"] == pytest.approx(dict(zip(mine["variant"], mine["mean_ppl"] / u)), rel=1e-12)


def test_report_prints_it_beside_the_finals(two_corpora):
    _, out = two_corpora
    code = (out / "code" / "report.md").read_text()
    # right after the final table, before the paired differences
    assert code.index("## Final validation perplexity") < code.index("## Unigram baseline") < code.index("## Seed-paired")
    assert "Unigram perplexity of corpus `code`: 812.50" in code and "123,456 tokens" in code
    assert "Every arm's seed-mean final perplexity is at most half of it." in code
    web = (out / "web" / "report.md").read_text()
    assert "Unigram perplexity of corpus `web`: 1.25" in web and "Above half of it: `standard` @ xs (" in web
    assert "Unigram baseline" in (out / "web" / "report.html").read_text()
    index = (out / "report.md").read_text()
    assert "unigram ppl |" in index
    assert all(f"| {c} | xs |" in index and f"| {UNIGRAM[c]:.2f} |" in index for c in UNIGRAM)


def test_store_without_the_tag_says_not_recorded_and_keeps_its_tables(synthetic_store, tmp_path):
    summary = build_report(ONE_SEED.study, synthetic_store, tmp_path / "r", log_to_mlflow=False, n_boot=20)
    assert summary["unigram"] == {"recorded": False, "corpus": "synthetic", "note": "unigram perplexity not recorded"}
    assert summary["scales"][0]["unigram_ppl"] is None and summary["scales"][0]["ppl_over_unigram"] == {}
    assert "unigram.csv" not in summary["tables"] and not (tmp_path / "r" / "unigram.csv").exists()
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Unigram perplexity not recorded for corpus `synthetic`" in md
