"""The gated ladder's protocol without Ray (``run_gated_study`` with the executor replaced): rung
by rung in N order, a stopped arm's runs at the larger rungs are never handed to the executor
(per corpus), its record survives the later rungs, and a gated study needs a decider."""

from __future__ import annotations

import math

import pytest

import orchestrator.run.driver.study as study_mod
from orchestrator.plan.gate import GateEvidence
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.runner import DriverOptions, StudyResult
from orchestrator.track.gate_record import recorded_gates
from orchestrator.track.tracking import study_tracking_uri

CORPUS = {"source": "stdlib", "max_documents": 60}


@pytest.fixture
def study(tmp_path):
    return parse_spec(
        {
            "name": "gated",
            "corpora": {"a": CORPUS, "b": CORPUS},
            "scales": ["cpu-m", "cpu-xs", "cpu-s"],
            "variants": ["standard", {"name": "slow", "kind": "standard", "lr": 1e-7}],
            "seeds": [0, 1],
            "budget": {"mode": "tokens", "tokens": 4096, "max_epochs": 1000},
            "train": {"global_batch": 8, "seq_len": 64},
            "gate": {"worse_than": 0.02},
            "workdir": str(tmp_path / "w"),
        }
    )


def _evidence(corpus, variant, scale, rung, stopped):
    nums = (0.5, 0.4, 0.6) if stopped else (math.nan, math.nan, math.nan)
    return GateEvidence(corpus, variant, "standard", scale, rung, "tokens", 0.02, *nums, 2, 0.01, 0.95, stopped)


def test_a_stopped_arm_trains_no_larger_rung_on_its_corpus_only(study, monkeypatch):
    handed: list[list[tuple[str, str, str]]] = []
    asked: list[tuple[str, int, tuple[str, ...]]] = []
    options = DriverOptions(max_in_flight=3)

    def fake_run_runs(runs, name, uri, storage, given, *, lease=None, **kw):
        assert lease is not None  # every rung under the one study lease
        assert given is options  # every rung hands its runs to Ray the same way
        handed.append(sorted({(r.scale, r.corpus_name, r.variant) for r in runs}))
        return StudyResult(status={r.run_id: "finished" for r in runs})

    def decide(uri, name, reference, gate, scale, rung, variants):
        asked.append((scale, rung, tuple(variants)))
        # `slow` is clearly worse on corpus a at rung 1; the real decider finds no pair for it later
        return [_evidence(c, "slow", scale, rung, stopped=(c == "a" and rung == 1)) for c in ("a", "b")]

    monkeypatch.setattr(study_mod, "run_runs", fake_run_runs)
    res = study_mod.run_study(study, options, gate_decider=decide)

    assert [sorted({s for s, _, _ in h}) for h in handed] == [["cpu-xs"], ["cpu-s"], ["cpu-m"]]  # rungs by N
    assert ("cpu-xs", "a", "slow") in handed[0]
    for h in handed[1:]:
        assert ("a", "slow") not in {(c, v) for _, c, v in h} and {("b", "slow"), ("a", "standard")} <= {(c, v) for _, c, v in h}
    assert asked == [("cpu-xs", 1, ("slow", "standard")), ("cpu-s", 2, ("slow", "standard"))]  # never after the last rung
    gated = [rid for rid, s in res.status.items() if s == "gated"]
    assert len(gated) == 4 and res.ok  # slow@a at cpu-s and cpu-m, two seeds each
    assert all(res.reasons[rid].startswith("stopped at rung 1 (cpu-xs)") for rid in gated)
    [ev] = recorded_gates(study_tracking_uri(study), "gated")  # the rung-2 "no pair" for (a, slow) did not erase it
    assert (ev.corpus, ev.variant, ev.skipped) == ("a", "slow", ("cpu-s", "cpu-m"))


def test_a_gated_study_needs_a_decider(study):
    with pytest.raises(ValueError, match="gate_decider"):
        study_mod.run_study(study)
    with pytest.raises(ValueError, match="has no gate"):
        study_mod.run_gated_study(study.model_copy(update={"gate": None}), lambda *a: [])


def test_a_tuned_gated_ladder_tunes_each_rung_for_the_arms_still_training(tmp_path, monkeypatch):
    """With tune: each rung hands its tuning runs (alive arms only), then its main runs at the
    chosen LR; the stopped arm is neither tuned nor trained at the larger rungs."""
    study = parse_spec(
        {
            "name": "gated-tuned",
            "corpus": CORPUS,
            "scales": ["cpu-s", "cpu-xs"],
            "variants": ["standard", "coupled"],
            "seeds": [0, 1],
            "budget": {"mode": "tokens", "tokens": 4096, "max_epochs": 1000},
            "train": {"global_batch": 8, "seq_len": 64},
            "tune": {"lr": [1e-3, 2e-3, 4e-3], "tokens": 0.5, "seeds": [0], "min_steps": 1},
            "gate": {"worse_than": 0.02},
            "workdir": str(tmp_path / "w"),
        }
    )
    handed: list[list[tuple]] = []

    def fake_run_runs(runs, *a, lease=None, **kw):
        assert lease is not None
        handed.append(sorted({(r.kind, r.scale, r.variant, r.train.lr) for r in runs}))
        return StudyResult(status={r.run_id: "finished" for r in runs})

    def outcomes(uri, name, runs):  # best at 2e-3 for every arm: an interior optimum, no extension
        return {r.run_id: (1.0 + abs(math.log(r.train.lr / 2e-3)), "finished") for r in runs}

    def decide(uri, name, reference, gate, scale, rung, variants):
        return [_evidence(corpus, "coupled", scale, rung, stopped=True) for corpus in study.corpus_map]

    monkeypatch.setattr(study_mod, "run_runs", fake_run_runs)
    monkeypatch.setattr(study_mod, "tuning_outcomes", outcomes)
    res = study_mod.run_study(study, gate_decider=decide)

    grid = [1e-3, 2e-3, 4e-3]
    assert handed[0] == sorted(("tune", "cpu-xs", v, lr) for v in ("coupled", "standard") for lr in grid)
    assert handed[1] == [("train", "cpu-xs", "coupled", 2e-3), ("train", "cpu-xs", "standard", 2e-3)]
    assert handed[2] == [("tune", "cpu-s", "standard", lr) for lr in grid]  # coupled stopped: not tuned at cpu-s
    assert handed[3] == [("train", "cpu-s", "standard", 2e-3)] and len(handed) == 4
    gated = [rid for rid, s in res.status.items() if s == "gated"]
    assert len(gated) == 2 and res.ok  # coupled at cpu-s, two seeds
