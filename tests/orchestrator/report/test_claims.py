"""Paper claims decided by intervals (claims.py) and Holm's adjustment (verdict.holm), on known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.report.stats.claims import CANNOT_TELL, CONTRADICTS, REPRODUCES, SOLVED, decide, paper_claims, variance_ratio
from orchestrator.report.stats.verdict import holm
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
    from orchestrator.report.stats.ratio import token_ratio

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


def _mqar(coupled_final: tuple[float, float], coupled_mid: tuple[float, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A 2-seed MQAR study (finals, metrics): standard learns to 0.999 with its jump at 6M tokens
    in both seeds; coupled ends at ``coupled_final[s]`` with its jump at ``coupled_mid[s]``.
    Curves: a guess among 4 values (0.25) rising logistically in ln tokens, 24 evaluations."""
    t = np.linspace(5.12e5, 1.2288e7, 24)
    finals, metrics = [], []
    for v, final, mid in (("standard", (0.999, 0.999), (6e6, 6e6)), ("coupled", coupled_final, coupled_mid)):
        for seed in (0, 1):
            rid = f"{v}-{seed}"
            acc = 0.25 + (final[seed] - 0.25) / (1 + np.exp(-(np.log(t) - math.log(mid[seed])) / 0.15))
            finals.append(dict(run_uuid=rid, scale="mqar", variant=v, seed=seed, extend=1.0, status="finished",
                               complete=True, final_ppl=1.5, final_accuracy=acc[-1]))  # fmt: skip
            metrics += [dict(run_uuid=rid, key="val/accuracy", step=x, value=a) for x, a in zip(t, acc)]
    return pd.DataFrame(finals), pd.DataFrame(metrics)


def _mqar_claims(f: pd.DataFrame, m: pd.DataFrame) -> dict:
    return {c.claim.split(" (")[0]: c for c in paper_claims(f, m, ["mqar"], ["standard", "coupled"], [])}


RECALL, FASTER = "coupled recalls perfectly on MQAR", "coupled reaches 90% MQAR accuracy on fewer tokens than standard"


def test_mqar_claims_decide_recall_and_tokens_to_90pct_and_drop_the_perplexity_claims():
    """Known answers: coupled at 99.9% in both seeds reproduces "perfect" recall, and its jump at
    half standard's tokens (2.0x and 2.1x by seed) gives a token ratio at 90% near 2 whose interval
    excludes 1. Negative controls: coupled at 80-82% contradicts "perfect"; jumping at 0.80x and
    0.79x standard's speed contradicts "fewer tokens"; never reaching 90% is a bound: no verdict.
    The WikiText perplexity claims are not applied to an MQAR loss."""
    got = _mqar_claims(*_mqar((0.999, 0.999), (3e6, 6e6 / 2.1)))
    assert set(got) == {RECALL, FASTER}
    assert got[RECALL].decision == REPRODUCES and got[RECALL].estimate == pytest.approx(0.999, abs=1e-3) and got[RECALL].low > SOLVED
    ratio = got[FASTER]
    assert ratio.decision == REPRODUCES and ratio.estimate == pytest.approx(math.sqrt(2.0 * 2.1), rel=0.02)
    assert 1 < ratio.low < 2 < ratio.high
    got = _mqar_claims(*_mqar((0.80, 0.82), (9e6, 1e7)))
    assert got[RECALL].decision == CONTRADICTS and got[RECALL].high < SOLVED
    assert got[FASTER].decision == CANNOT_TELL and got[FASTER].note.startswith("<") and math.isnan(got[FASTER].low)
    spread = _mqar_claims(*_mqar((0.30, 0.95), (3e6, 6e6)))[RECALL]  # t interval 0.62 ± 4.1, cut to where accuracy lies
    assert (spread.low, spread.high, spread.decision) == (0.0, 1.0, CANNOT_TELL)
    later = _mqar_claims(*_mqar((0.999, 0.999), (7.5e6, 7.6e6)))
    assert later[FASTER].decision == CONTRADICTS and later[FASTER].high < 1
