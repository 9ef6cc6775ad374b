"""The gated ladder's spec, rungs, rule and compute bounds (orchestrator.plan.gate)."""

from __future__ import annotations

import math

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan.gate import GateEvidence, GateSpec, gate_compute, rungs, stops
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import SpecError, load_spec, parse_spec

# spec order deliberately not N order: rungs follow N
BASE = {
    "name": "gated",
    "scales": ["cpu-s", "cpu-xs"],
    "variants": ["standard", "coupled", {"name": "slow", "kind": "standard", "lr": 1e-5}],
    "seeds": [0, 1],
    "budget": {"mode": "flops", "tokens": {"cpu-xs": 40960, "cpu-s": 81920}},
    "extend": [2],
    "gate": {"metric": "paired_delta_loss", "worse_than": 0.02, "currency": "tokens"},
}


def _problems(tmp_path, **over) -> list[tuple[str, str]]:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**BASE, **over}))
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert str(spec) in str(e.value)  # the file is named
    return e.value.problems


def test_gate_section_parses_with_defaults():
    g = parse_spec({**BASE, "gate": {"worse_than": 0}}).gate
    assert g == GateSpec(metric="paired_delta_loss", worse_than=0.0, currency="tokens", level=0.95)


@pytest.mark.parametrize(
    ("gate", "loc", "msg"),
    [
        ({"metric": "final_loss", "worse_than": 0.02}, "gate.metric", "paired_delta_loss"),
        ({"worse_than": -0.01}, "gate.worse_than", "greater than or equal to 0"),
        ({"worse_than": float("nan")}, "gate.worse_than", "finite"),
        ({"worse_than": 0.02, "currency": "wallclock"}, "gate.currency", "'tokens' or 'flops'"),
        ({"worse_than": 0.02, "level": 1.5}, "gate.level", "less than 1"),
        ({"worse_than": 0.02, "bound": 1}, "gate.bound", "unknown field (allowed: currency, level, metric, worse_than)"),
        ({"currency": "tokens"}, "gate.worse_than", "Field required"),
    ],
)
def test_bad_gate_fields_are_refused_naming_the_field(tmp_path, gate, loc, msg):
    problems = _problems(tmp_path, gate=gate)
    assert [p[0] for p in problems] == [loc]
    assert msg in problems[0][1]


def test_gate_needs_several_scales_and_seeds(tmp_path):
    (loc, msg), *_ = _problems(tmp_path, scales=["cpu-xs"], budget={"mode": "flops", "tokens": 40960})
    assert loc == "gate" and "two or more scales" in msg
    (loc, msg), *_ = _problems(tmp_path, seeds=[0])
    assert loc == "gate" and "two or more seeds" in msg
    tuned = parse_spec({**BASE, "variants": ["standard", "coupled"], "tune": {"lr": [1e-3, 3e-3], "tokens": 0.25}})
    assert tuned.gate is not None and tuned.tune is not None  # a gated ladder may tune each rung


def test_the_gate_does_not_change_run_ids():
    ungated = {**BASE}
    del ungated["gate"]
    assert [r.run_id for r in plan(parse_spec(BASE))] == [r.run_id for r in plan(parse_spec(ungated))]


def test_rungs_follow_the_reference_n_and_compute_bounds_add_up():
    runs = plan(parse_spec(BASE))
    assert rungs("standard", runs) == ["cpu-xs", "cpu-s"]
    worst, best = gate_compute("standard", runs)
    assert worst == sum(r.total_flops for r in runs)
    ref = sum(r.total_flops for r in runs if r.variant == "standard")  # every rung, extend runs included
    first = sum(r.total_flops for r in runs if r.variant != "standard" and r.scale == "cpu-xs")
    assert best == ref + first
    assert best < worst


def test_plan_prints_both_compute_bounds(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    res = CliRunner().invoke(app, ["plan", str(spec)])
    assert res.exit_code == 0, res.output
    worst, best = gate_compute("standard", plan(parse_spec(BASE)))
    text = " ".join(res.output.split())
    assert f"worst case {worst:.3e} FLOPs (every run trains)" in text
    assert f"best case {best:.3e} FLOPs (every non-reference arm stopped after rung 1, cpu-xs" in text
    assert "rungs by N: cpu-xs < cpu-s" in text


@pytest.mark.parametrize(
    ("dloss", "low", "stopped"),
    [
        (0.05, 0.03, True),  # worse than the bound, interval above zero
        (0.05, -0.01, False),  # interval includes zero
        (0.015, 0.01, False),  # within the bound
        (0.02, 0.01, False),  # on the bound: not worse than it
        (math.nan, math.nan, False),  # no verdict
        (-0.1, -0.2, False),  # better
    ],
)
def test_the_rule(dloss, low, stopped):
    assert stops(GateSpec(worse_than=0.02), dloss, low) is stopped


def test_evidence_round_trips_through_json_and_reads_as_a_sentence():
    e = GateEvidence("stdlib", "slow", "standard", "cpu-xs", 1, "tokens", 0.02, 0.05, 0.03, 0.07, 3, 0.004, 0.95, True, ("cpu-s",))
    assert GateEvidence.from_json(e.to_json()) == e
    assert e.sentence() == "stopped at rung 1 (cpu-xs): Δ=+0.0500 nats [+0.0300, +0.0700] at equal tokens, 3 pairs (bound +0.02)"
    none = GateEvidence("c", "v", "standard", "s", 2, "flops", 0.02, math.nan, math.nan, math.nan, 1, math.nan, 0.95, False, note="1 pair")
    back = GateEvidence.from_json(none.to_json())
    assert math.isnan(back.dloss) and back.sentence() == "continues after rung 2 (s): no paired verdict (1 pair)"
    with pytest.raises(ValueError, match="not a gate evidence record"):
        GateEvidence.from_json('{"variant": "v"}')
