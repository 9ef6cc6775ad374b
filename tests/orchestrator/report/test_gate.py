"""The gate's decision on synthetic stores with known answers, and the report's gated arms.

Known answers (tests/synthetic_study.py, N = 2e6 at the first rung): `bad` (token efficiency
0.5) is ~0.16 nats worse than the reference with a tight interval: stopped. Negative
controls: `close` (0.97) is ~0.006 nats worse with its interval above zero, but within the
0.02 bound; `noisy` (0.75, seed noise 0.08 nats) is worse than the bound on average, but
its interval includes zero. Neither is stopped.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from orchestrator.plan.gate import GateSpec
from orchestrator.report import build_report
from orchestrator.report.gate import TABLE, decide
from orchestrator.track.gate_record import gates_from_tags, record_gate, record_gate_ran, recorded_gates
from orchestrator.track.tracking import client_for
from tests.helpers import mlflow_store
from tests.synthetic_study import SyntheticStudy

ARMS = ["standard", "bad", "close", "noisy"]
GATED = SyntheticStudy(
    study="gated",
    variants={"standard": 1.0, "bad": 0.5, "close": 0.97, "noisy": 0.75},
    scales={"xs": 2e6, "s": 8e6},
    seeds=(0, 1, 2),
    extend=(2.0,),
    seed_noise={"standard": 0.0005, "close": 0.0005, "noisy": 0.08},
    n_eval=6,
    skip=tuple(("bad", "s", seed, 1.0) for seed in (0, 1, 2)),  # the gated driver never trained them
    rng_seed=2,
)
# FLOP-matched: `costly` learns per token as well as the reference (k = 1.0) but costs 1.3x
# the FLOPs per token, so it trains 1/1.3 of the tokens: equal at equal tokens, worse at
# equal FLOPs. The gate's currency decides.
FLOP_MATCHED = SyntheticStudy(
    study="gated-flops",
    variants={"standard": 1.0, "costly": 1.0},
    scales={"xs": 2e6, "s": 8e6},
    seeds=(0, 1, 2),
    extend=(),
    seed_noise={"standard": 0.0005, "costly": 0.0005},
    n_eval=6,
    budget_mode="flops",
    flops_factor={"costly": 1.3},
    rng_seed=2,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return mlflow_store(tmp_path_factory.mktemp("gate"), GATED, FLOP_MATCHED)


def _by_variant(uri, study, gate, variants):
    return {e.variant: e for e in decide(uri, study, "standard", gate, "xs", 1, variants)}


def test_a_gate_that_must_stop_an_arm_stops_only_that_arm(store):
    ev = _by_variant(store, GATED.study, GateSpec(worse_than=0.02, currency="tokens"), ARMS)
    assert sorted(ev) == ["bad", "close", "noisy"]  # the reference is never gated
    bad, close, noisy = ev["bad"], ev["close"], ev["noisy"]
    assert bad.stopped and bad.n_pairs == 3 and 0.14 < bad.dloss < 0.18 and bad.low > 0.02
    assert bad.sentence().startswith("stopped at rung 1 (xs): Δ=+0.1")
    # negative controls: within the bound (interval above zero), and worse on average with an interval including zero
    assert not close.stopped and 0 < close.low and close.dloss < 0.02
    assert not noisy.stopped and noisy.dloss > 0.02 and noisy.low < 0 < noisy.high
    assert noisy.sentence().startswith("continues after rung 1 (xs)")


def test_a_looser_bound_stops_nothing(store):
    ev = _by_variant(store, GATED.study, GateSpec(worse_than=0.5), ARMS)
    assert not any(e.stopped for e in ev.values())


def test_the_currency_decides_for_an_arm_that_costs_more_per_token(store):
    tokens = _by_variant(store, FLOP_MATCHED.study, GateSpec(worse_than=0.02, currency="tokens"), ["standard", "costly"])["costly"]
    flops = _by_variant(store, FLOP_MATCHED.study, GateSpec(worse_than=0.02, currency="flops"), ["standard", "costly"])["costly"]
    assert not tokens.stopped and abs(tokens.dloss) < 0.02 and tokens.currency == "tokens"
    assert flops.stopped and flops.dloss > 0.02 and flops.low > 0 and "equal model FLOPs" in flops.sentence()


def test_an_arm_without_a_finished_pair_is_not_stopped(store):
    ev = decide(store, GATED.study, "standard", GateSpec(worse_than=0.0), "s", 2, ["standard", "bad"])
    assert len(ev) == 1 and not ev[0].stopped and ev[0].n_pairs == 0 and "no finished seed pair" in ev[0].note
    assert decide(store, "no-such-study", "standard", GateSpec(worse_than=0.0), "xs", 1, ARMS) == []


def test_the_report_marks_the_stopped_arm_with_its_evidence(store, tmp_path):
    client = client_for(store)
    exp_id = client.get_experiment_by_name(GATED.study).experiment_id
    for e in decide(store, GATED.study, "standard", GateSpec(worse_than=0.02), "xs", 1, ARMS):
        record_gate(client, exp_id, dataclasses.replace(e, skipped=("s",)) if e.stopped else e)
    [recorded] = recorded_gates(store, GATED.study)
    assert recorded.variant == "bad" and recorded.skipped == ("s",)

    summary = build_report(GATED.study, store, tmp_path / "report", n_boot=50, log_to_mlflow=False)
    [g] = summary["gates"]
    assert g["variant"] == "bad" and g["scale"] == "xs" and g["n_pairs"] == 3 and g["skipped"] == ["s"]
    gated = summary["runs"]["gated"]
    assert sorted((m["variant"], m["scale"], m["seed"]) for m in gated) == [("bad", "s", 0), ("bad", "s", 1), ("bad", "s", 2)]
    assert not [m for m in summary["runs"]["missing"] if m["variant"] == "bad"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Gated arms" in md and "`bad` stopped at rung 1 (xs): Δ=+0.1" in md and "not trained at s." in md
    assert re.search(r"\| gated +\| +\| bad +\| s +\|", md)  # the issues table names them gated, not missing
    assert (tmp_path / "report" / f"{TABLE}.csv").read_text().startswith("corpus,variant,stopped_at,rung,currency,bound,dloss")


def test_the_report_gives_the_compute_the_gate_saved(store, tmp_path):
    """Given the plan's FLOPs per run (as `qkstudy report SPEC` passes them), the saving is the
    gated runs' planned FLOPs over the whole plan's: here the 3 `bad` runs at rung s, each 1e18 of
    a plan of 4 arms x 2 rungs x 3 seeds plus the reference's extends. Without them, it says so."""
    client = client_for(store)
    exp_id = client.get_experiment_by_name(GATED.study).experiment_id
    for e in decide(store, GATED.study, "standard", GateSpec(worse_than=0.02), "xs", 1, ARMS):
        record_gate(client, exp_id, dataclasses.replace(e, skipped=("s",)) if e.stopped else e)
    plan = [
        {"variant": v, "scale": sc, "seed": sd, "extend": ext, "flops": (1e18 if v == "bad" and sc == "s" else 2e18)}
        for v in ARMS
        for sc in ("xs", "s")
        for sd in (0, 1, 2)
        for ext in ((1.0, 2.0) if v == "standard" else (1.0,))
    ]
    summary = build_report(GATED.study, store, tmp_path / "r", n_boot=50, log_to_mlflow=False, expected=plan)
    total = 3 * 1e18 + (len(plan) - 3) * 2e18
    assert summary["gate_saving"] == pytest.approx({"saved_flops": 3e18, "planned_flops": total, "fraction": 3e18 / total})
    assert f"The gate saved 3e+18 training FLOPs of the {total:.3g}" in (tmp_path / "r" / "report.md").read_text()
    bare = build_report(GATED.study, store, tmp_path / "bare", n_boot=50, log_to_mlflow=False)
    assert bare["gate_saving"] is None and "What the gate saved is not computed" in (tmp_path / "bare" / "report.md").read_text()


def test_an_arm_no_longer_stopped_loses_its_record(store):
    client = client_for(store)
    exp_id = client.get_experiment_by_name(FLOP_MATCHED.study).experiment_id
    [e] = decide(store, FLOP_MATCHED.study, "standard", GateSpec(worse_than=0.02, currency="flops"), "xs", 1, ["costly"])
    record_gate(client, exp_id, e)
    assert [x.variant for x in gates_from_tags(client.get_experiment(exp_id).tags)] == ["costly"]
    record_gate(client, exp_id, dataclasses.replace(e, stopped=False))  # e.g. the spec's bound was loosened
    assert gates_from_tags(client.get_experiment(exp_id).tags) == []


def test_a_gate_that_stopped_no_arm_is_reported_with_a_saving_of_zero(tmp_path):
    """A gated study where no arm was ever worse past the bound: the store records that the gate
    ran (its settings and the rungs it decided after), so the report says it ran, stopped
    nothing and saved 0 FLOPs of the plan's. Control: the same store without that record (a
    study without a gate) gets no gate section. A changed gate restarts the record."""
    none = SyntheticStudy(
        study="gated-none",
        variants={"standard": 1.0, "close": 0.97},
        scales={"xs": 2e6, "s": 8e6},
        seeds=(0, 1),
        extend=(),
        seed_noise={"standard": 0.0005, "close": 0.0005},
        n_eval=6,
        rng_seed=2,
    )
    uri = mlflow_store(tmp_path, none)
    plan = [
        {"variant": v, "scale": sc, "seed": sd, "extend": 1.0, "flops": 2e18} for v in none.variants for sc in none.scales for sd in (0, 1)
    ]
    bare = build_report(none.study, uri, tmp_path / "bare", n_boot=50, log_to_mlflow=False, expected=plan)
    assert "gate_saving" not in bare and "## Gated arms" not in (tmp_path / "bare" / "report.md").read_text()

    client = client_for(uri)
    exp_id = client.get_experiment_by_name(none.study).experiment_id
    spec = GateSpec(worse_than=0.02, currency="flops")
    record_gate_ran(client, exp_id, GateSpec(worse_than=0.5), "xs")  # an earlier submit's other gate
    for scale in ("xs", "xs"):  # a resubmit decides the same rung again: listed once
        record_gate_ran(client, exp_id, spec, scale)
    summary = build_report(none.study, uri, tmp_path / "r", n_boot=50, log_to_mlflow=False, expected=plan)
    assert summary["gates"] == [] and summary["gate"] == {"gate": spec.model_dump(), "decided_after": ["xs"]}
    assert summary["gate_saving"] == {"saved_flops": 0.0, "planned_flops": 8 * 2e18, "fraction": 0.0}
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Gated arms" in md and "(here +0.02 nats at equal model FLOPs, 95% interval, decided after xs;" in md
    assert "No arm was stopped: the gate skipped no planned run." in md and "The gate saved 0 training FLOPs of the 1.6e+19" in md
