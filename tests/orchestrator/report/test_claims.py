"""Paper claims decided by intervals (claims.py) and Holm's adjustment (verdict.holm), on known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.claims import CANNOT_TELL, CONTRADICTS, REPRODUCES, decide, paper_claims, variance_ratio
from orchestrator.report.verdict import holm
from tests.synthetic_study import SyntheticStudy, finals_frame

EMPTY_METRICS = pd.DataFrame(columns=["run_uuid", "key", "step", "value"])


@pytest.mark.parametrize(
    ("low", "high", "paper", "direction", "want"),
    [
        (-0.10, -0.02, -0.07, -1, REPRODUCES),  # below zero, the paper's side
        (-0.02, -0.01, -0.07, -1, REPRODUCES),  # the paper's side, though smaller: direction decides first
        (0.01, 0.05, -0.07, -1, CONTRADICTS),  # excludes the paper's value
        (-0.09, 0.02, -0.07, -1, CANNOT_TELL),  # holds both zero and the paper's value
        (-0.05, 0.02, -0.07, -1, CONTRADICTS),  # holds zero but not the paper's (larger) gain
        (0.05, 78.0, 60.0, 1, CANNOT_TELL),  # the 3 vs 3 seed-std contrast: [0.05, 78] holds 1 and 60
        (1.2, math.inf, 2.4, 1, REPRODUCES),  # an open upper end
        (-math.inf, 0.8, 2.4, 1, CONTRADICTS),
        (-0.5, 3.0, None, 1, CANNOT_TELL),  # direction only: holds the null
        (-3.0, -0.5, None, 1, CONTRADICTS),  # direction only: the other side
        (math.nan, math.nan, 2.4, 1, CANNOT_TELL),
    ],
)
def test_decision_rule(low, high, paper, direction, want):
    null = 1.0 if paper in (60.0, 2.4) else 0.0
    assert decide(low, high, null, direction, paper) == want


def test_holm_matches_the_step_down_by_hand_and_leaves_one_test_alone():
    got = holm([0.01, 0.04, 0.03, math.nan])
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04; monotone: 0.03, 0.06, 0.06
    assert got[:3] == pytest.approx([0.03, 0.06, 0.06]) and math.isnan(got[3])
    assert holm([0.2]) == pytest.approx([0.2])  # negative control: a family of one is not adjusted
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_variance_ratio_interval_covers_the_truth_at_its_level_and_detects_a_large_ratio():
    rng = np.random.default_rng(0)
    reps, truth = 4000, 4.0  # std ratio 2
    hits = 0
    for _ in range(reps):
        a, b = rng.normal(0, 2.0, 3), rng.normal(0, 1.0, 3)
        _, lo, hi, _ = variance_ratio(a, b)
        hits += lo <= truth <= hi
    assert 0.935 <= hits / reps <= 0.965  # nominal 95%, normal samples: exact
    # 3 vs 3 seeds cannot tell a ratio of 1 from the paper's 60: the interval spans 39^2 x
    _, lo, hi, _ = variance_ratio(np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.0]))
    assert lo < 1 / 30 and hi > 30
    # negative control: with 30 seeds each, a true ratio of 4 is told from 1 almost always
    excluded = sum(variance_ratio(rng.normal(0, 2.0, 30), rng.normal(0, 1.0, 30))[1] > 1 for _ in range(500))
    assert excluded / 500 > 0.9


def _finals(study: SyntheticStudy) -> pd.DataFrame:
    f = finals_frame(study, np.random.default_rng(3))
    return f.assign(run_uuid=[f"r{i}" for i in range(len(f))])


def test_a_study_like_the_paper_reproduces_and_one_against_it_contradicts():
    like = SyntheticStudy(variants={"standard": 1.0, "coupled": 2.4, "uncoupled_mlp": 1.2}, scales={"xs": 2e6}, seed_shared=0.05)
    from orchestrator.report.ratio import token_ratio

    f = _finals(like)
    ratios = [token_ratio("xs", "coupled", "standard", f).to_dict()]
    got = {c.claim: c for c in paper_claims(f, EMPTY_METRICS, ["xs"], ["standard", "coupled", "uncoupled_mlp"], ratios)}
    assert got["coupled has lower loss than standard"].decision == REPRODUCES
    ratio = got["standard needs 2.4x the tokens of coupled"]
    assert ratio.decision == REPRODUCES and ratio.low <= 2.4 <= ratio.high
    assert got["coupled has lower loss than the uncoupled MLP"].decision == REPRODUCES
    std = next(c for n, c in got.items() if n.startswith("the uncoupled MLP varies more"))
    assert std.decision != REPRODUCES and std.low < 1 < std.high  # equal seed noise, 3 vs 3 seeds: no difference shown
    against = SyntheticStudy(variants={"standard": 1.0, "coupled": 0.5}, scales={"xs": 2e6}, seed_shared=0.05)
    f = _finals(against)
    claims = paper_claims(f, EMPTY_METRICS, ["xs"], ["standard", "coupled"], [token_ratio("xs", "coupled", "standard", f).to_dict()])
    assert {c.claim: c.decision for c in claims}["coupled has lower loss than standard"] == CONTRADICTS
