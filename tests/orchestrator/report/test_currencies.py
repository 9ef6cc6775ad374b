"""Verdicts in every currency (currencies.py) on synthetic MLflow stores with known answers.

FLOP tax: the variant has the reference's loss per token (k = 1) but 2.6% more FLOPs per token
(the QK transform's at cpu-xs), and the budget matches FLOPs, so it trains 1/1.026 of the
tokens: worse at equal FLOPs, no different at equal tokens (the reference read on its curve
at 97.5% of its tokens carries the writer's schedule gap, 0.03 x 2.5% = 0.0008 nats, inside
the interval's half-width). A read at 80% is flagged with the bound it implies. Per-token
gain: k = 1.5 at token-matched budgets: better at equal tokens. Seeds share a large offset (the pairing) and carry a small one of their own.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.report.query import query_study
from orchestrator.report.stats import curves as C
from orchestrator.report.stats.currencies import contrast_table, decomposition, matched_currency, with_defaults
from tests.helpers import mlflow_store
from tests.synthetic_study import SyntheticStudy

NOISE = dict(seed_noise={"standard": 0.0008, "coupled": 0.0008, "uncoupled_mlp": 0.0008}, seed_shared=0.02, extend=(), n_eval=40)
FLOP_TAX = SyntheticStudy(
    study="flop-tax",
    variants={"standard": 1.0, "coupled": 1.0},
    scales={"xs": 2e6},
    flops_factor={"coupled": 1.026},
    budget_mode="flops",
    **NOISE,
)
PER_TOKEN = SyntheticStudy(
    study="per-token",
    variants={"standard": 1.0, "coupled": 1.5, "uncoupled_mlp": 1.0},
    scales={"xs": 2e6},
    flops_factor={"coupled": 1.02, "uncoupled_mlp": 1.02},
    **NOISE,
)


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory):
    return mlflow_store(tmp_path_factory.mktemp("currencies"), FLOP_TAX, PER_TOKEN)


@pytest.fixture(scope="module")
def stores(store_uri):
    uri = store_uri
    out = {}
    for study in (FLOP_TAX, PER_TOKEN):
        data = query_study(study.study, uri)
        out[study.study] = (C.run_finals(data.runs, data.metrics), data.metrics)
    return out


def _rows(stores, name, contrasts, matched=None):
    finals, metrics = stores[name]
    t = contrast_table(finals, metrics, ["xs"], contrasts, matched)
    return t.set_index(["variant", "against", "currency"]), finals


def test_budget_currency_is_read_from_the_runs(stores):
    assert matched_currency(*stores["flop-tax"][:1], "standard") == "flops"
    assert matched_currency(*stores["per-token"][:1], "standard") == "tokens"  # negative control: not called FLOP-matched
    finals = stores["per-token"][0].copy()
    finals.loc[finals["variant"] == "coupled", "tokens"] *= 0.9  # neither tokens nor FLOPs agree now
    assert matched_currency(finals, "standard") is None


def test_a_flop_tax_is_worse_at_equal_flops_and_no_different_at_equal_tokens(stores):
    t, finals = _rows(stores, "flop-tax", [("coupled", "standard")], "flops")
    flops, tokens = t.loc[("coupled", "standard", "flops")], t.loc[("coupled", "standard", "tokens")]
    # truth at equal FLOPs: L(D / 1.1) - L(D) of the law's token term
    d = FLOP_TAX.tokens_per_param * 2e6
    truth = 100.0 * ((d / 1.026) ** -0.28 - d**-0.28)
    assert flops["verdict"] == "worse" and flops["paired_low"] <= truth <= flops["paired_high"] and bool(flops["matched"])
    assert flops["read"] == "both at their final pass"
    assert tokens["verdict"] == "no detectable difference" and tokens["paired_low"] <= 0.0 <= tokens["paired_high"]
    # the reference is read on its own curve at the variant's tokens: 1/1.1 of its own
    assert tokens["read"] == "against read on its own eval curve at 97.5% of its tokens" and tokens["note"] == ""
    dec = decomposition(t.reset_index(), finals).iloc[0]
    assert dec["cost_ratio_flops"] == pytest.approx(1.026)
    assert dec["cost_part_flops"] == pytest.approx(flops["paired_dloss"] - tokens["paired_dloss"])
    assert dec["cost_part_flops"] / dec["dloss_flops"] > 0.8  # the tax is most of the equal-FLOP gap


def test_a_per_token_gain_is_better_at_equal_tokens_and_variant_pairs_compare(stores):
    t, _ = _rows(stores, "per-token", [("coupled", "standard"), ("coupled", "uncoupled_mlp")], "tokens")
    d = PER_TOKEN.tokens_per_param * 2e6
    truth = 100.0 * ((1.5 * d) ** -0.28 - d**-0.28)
    for against in ("standard", "uncoupled_mlp"):  # uncoupled_mlp has k = 1: the same gain against it
        row = t.loc[("coupled", against, "tokens")]
        assert row["verdict"] == "better" and row["paired_low"] <= truth <= row["paired_high"]
    # at equal wall-clock coupled (10% slower per token in the writer) loses part of it, still better
    wall = t.loc[("coupled", "standard", "wall_s")]
    assert wall["paired_dloss"] > t.loc[("coupled", "standard", "tokens")]["paired_dloss"] and wall["verdict"] == "better"
    # negative control: uncoupled_mlp is the reference's equal per token
    t2, _ = _rows(stores, "per-token", [("uncoupled_mlp", "standard")], "tokens")
    assert t2.loc[("uncoupled_mlp", "standard", "tokens")]["verdict"] == "no detectable difference"


def test_an_early_read_says_how_far_the_schedule_can_move_it(stores):
    finals, metrics = stores["flop-tax"]
    finals = finals.copy()
    tax = finals["variant"] == "coupled"
    finals.loc[tax, "flops_per_token"] *= 1.25  # at equal FLOPs the variant is now read at 80% of its tokens
    row = contrast_table(finals, metrics, ["xs"], [("coupled", "standard")], "flops").set_index("currency").loc["flops"]
    assert row["read"] == "variant read on its own eval curve at 80.0% of its tokens"
    assert "read at 80.0% of a run's tokens" in row["note"]
    final_gap = float(
        np.mean(np.log(finals[tax]["final_ppl"]).to_numpy() - np.log(finals[~tax & (finals.extend == 1)]["final_ppl"]).to_numpy())
    )
    assert f"Δ would be {final_gap:+.4f}" in row["note"]  # the arm at its final pass


def test_a_read_before_the_first_eval_point_is_no_verdict():
    finals = pd.DataFrame(
        [
            dict(
                run_uuid=f"{v}{s}",
                scale="xs",
                variant=v,
                seed=s,
                extend=1.0,
                complete=True,
                tokens=t,
                final_ppl=np.exp(3.0),
                flops_per_token=f,
                final_wall_s=1.0,
            )  # fmt: skip
            for s in (0, 1)
            for v, t, f in (("standard", 100.0, 1.0), ("coupled", 40.0, 2.5))
        ]
    )
    metrics = pd.DataFrame([dict(run_uuid=f"standard{s}", key="val/ppl", step=st, value=np.exp(3.0)) for s in (0, 1) for st in (50, 100)])
    row = contrast_table(finals, metrics, ["xs"], [("coupled", "standard")], "flops").set_index("currency").loc["tokens"]
    assert row["verdict"] == "no verdict" and "curve starts after 40%" in row["note"]


def test_named_contrasts_join_the_default_ones_once():
    got = with_defaults([("coupled", "uncoupled_mlp"), ("standard", "coupled")], ["coupled", "standard", "uncoupled_mlp"], "standard")
    assert got == [("coupled", "standard"), ("uncoupled_mlp", "standard"), ("coupled", "uncoupled_mlp")]


def test_the_spec_and_the_command_line_name_contrasts_for_the_report(store_uri, tmp_path):
    spec = tmp_path / "per-token.yaml"
    spec.write_text(
        "name: per-token\nscales: [cpu-xs]\nvariants: [standard, coupled, uncoupled_mlp]\nbudget: {tokens: 40960}\n"
        f"tracking_uri: {store_uri}\ncontrasts: [[coupled, uncoupled_mlp]]\n"
    )
    res = CliRunner().invoke(app, ["report", str(spec), "--out", str(tmp_path / "r"), "--no-log"])
    assert res.exit_code == 0, res.output
    pairs = {(r["variant"], r["against"]) for r in json.loads((tmp_path / "r" / "summary.json").read_text())["contrasts"]}
    assert pairs == {("coupled", "standard"), ("uncoupled_mlp", "standard"), ("coupled", "uncoupled_mlp")}
    # negative control: by name, no spec, no --contrast: only the defaults
    res = CliRunner().invoke(app, ["report", "per-token", "--tracking-uri", store_uri, "--out", str(tmp_path / "n"), "--no-log"])
    assert res.exit_code == 0, res.output
    pairs = {(r["variant"], r["against"]) for r in json.loads((tmp_path / "n" / "summary.json").read_text())["contrasts"]}
    assert pairs == {("coupled", "standard"), ("uncoupled_mlp", "standard")}
    args = [
        "report",
        "per-token",
        "--tracking-uri",
        store_uri,
        "--out",
        str(tmp_path / "c"),
        "--no-log",
        "--contrast",
        "uncoupled_mlp:coupled",
    ]
    assert CliRunner().invoke(app, args).exit_code == 0
    pairs = {(r["variant"], r["against"]) for r in json.loads((tmp_path / "c" / "summary.json").read_text())["contrasts"]}
    assert ("uncoupled_mlp", "coupled") in pairs
    bad = CliRunner().invoke(app, [*args[:-1], "coupled"])
    assert bad.exit_code == 2 and "give VARIANT:AGAINST" in bad.output


def test_a_contrast_naming_an_unknown_variant_is_refused_naming_the_field(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nscales: [cpu-xs]\nvariants: [standard, coupled]\nbudget: {tokens: 40960}\ncontrasts: [[coupled, banana]]\n")
    res = CliRunner().invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and "contrasts" in res.output and "['banana'] not among the variants" in res.output
