"""The paper's claims (arXiv 2604.01683) decided against the study's intervals, by one rule.

Each claim is a quantity with a null value (0 for a loss difference, 1 for a ratio), the
direction the paper reports and, where the paper gives one, its value. With the study's
interval [low, high] for that quantity (an end censored at the measured range is open):

- *reproduces*: the interval lies on the paper's side of the null and excludes it;
- *contradicts*: the interval excludes the paper's value (a direction-only claim: the
  interval lies on the other side of the null and excludes it);
- *cannot tell*: otherwise.

The tests: paired t on final loss for "coupled beats standard" (at each scale) and
"coupled beats the uncoupled MLP"; the token ratio's interval (interval.py) for the 2.4x;
a variance-ratio F interval (two-sided, normal seeds) for the seed-std contrast 0.31 vs 0.04;
paired t on the per-seed final effective rank for "coupling raises the effective rank".
Differences are losses in nats (ln perplexity), so a perplexity ratio of the paper is
compared as its log. Where the study's scale is none of the paper's sizes, the paper's
smallest (60M) number is the one compared, and the row says so.

On a labelled corpus (MQAR: runs log final accuracy) the loss, token-ratio and seed-std
numbers of the paper do not apply (they are WikiText-103 perplexities, and an MQAR loss is not
one). Its MQAR claim is tested instead (``mqar_claims``): "coupled recalls perfectly", read
as final accuracy above SOLVED (a t interval over seeds; the paper prints no decimals, so an
interval above 99% reproduces it and one below contradicts it), and the sample-efficiency
direction at recall: coupled reaches 90% accuracy on fewer tokens than standard (the
seed-paired token ratio at 90%, orchestrator/report/stats/recall.py; the paper gives no MQAR number,
so direction only). The effective-rank claim is tested on either corpus.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from orchestrator.report.stats import recall
from orchestrator.report.stats.curves import ATTENTION_KEYS, last_value
from orchestrator.report.stats.paper import PAPER_PPL, PAPER_SEED_STD, PAPER_TOKEN_RATIO, paper_scale, paper_variant
from orchestrator.report.stats.power import paired_verdict

REPRODUCES, CONTRADICTS, CANNOT_TELL = "reproduces", "contradicts", "cannot tell"
SOLVED = 0.99  # "perfect" MQAR recall: final accuracy above this (the paper prints no decimals)


@dataclass
class Claim:
    """One paper claim against the study: estimate and interval in the claim's unit."""

    claim: str
    scale: str
    test: str
    estimate: float
    low: float
    high: float
    null: float
    paper_value: float | None
    direction: int  # +1: the paper's value lies above the null, -1: below
    p_value: float = math.nan
    decision: str = CANNOT_TELL
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def decide(low: float, high: float, null: float, direction: int, paper_value: float | None) -> str:
    """The rule of the module docstring. low/high may be -inf/inf (an open end); NaN: cannot tell."""
    if not (np.isfinite(low) or np.isfinite(high)) or math.isnan(low) or math.isnan(high):
        return CANNOT_TELL
    if (direction > 0 and low > null) or (direction < 0 and high < null):
        return REPRODUCES
    if paper_value is not None:
        if paper_value < low or paper_value > high:
            return CONTRADICTS
    elif (direction > 0 and high < null) or (direction < 0 and low > null):
        return CONTRADICTS
    return CANNOT_TELL


def _claim(**kw) -> Claim:
    c = Claim(**kw)
    c.decision = decide(c.low, c.high, c.null, c.direction, c.paper_value)
    return c


def _paper_dloss(scale: str, variant: str, against: str) -> tuple[float | None, str]:
    """ln(paper ppl of variant / paper ppl of against) at the scale (or 60M), and a note."""
    key = paper_scale(scale)
    note = "" if key else "the paper's 60M value (the study's scale is none of the paper's sizes)"
    table = PAPER_PPL[key or "60m"]
    if variant not in table or against not in table:
        return None, ""
    mid = {v: (lo + hi) / 2 for v, (lo, hi) in table.items()}
    return math.log(mid[variant] / mid[against]), note


def _names(variants: list[str]) -> dict[str, str]:
    """Paper key -> the study's variant name, for the variants the paper has."""
    return {k: v for v in variants if (k := paper_variant(v))}


def _loss_by_seed(finals: pd.DataFrame, scale: str, variant: str, col: str = "final_ppl", log: bool = True) -> dict[int, float]:
    f = finals[
        (finals["scale"] == scale)
        & (finals["variant"] == variant)
        & (finals["extend"] == 1.0)
        & finals["complete"]
        & finals["seed"].notna()
    ]
    vals = np.log(f[col]) if log else f[col]
    return {int(s): float(x) for s, x in zip(f["seed"], vals) if np.isfinite(x)}


def _paired_claim(name: str, scale: str, a: dict, b: dict, paper: float | None, direction: int, note: str, test: str) -> Claim | None:
    pv = paired_verdict(a, b)
    if pv.n_pairs < 2:
        return None
    unpaired = f"seed(s) {', '.join(map(str, pv.unpaired))} not paired" if pv.unpaired else ""
    note = "; ".join(filter(None, [note, unpaired]))
    return _claim(
        claim=name, scale=scale, test=test, estimate=pv.mean_diff, low=pv.low, high=pv.high, null=0.0,
        paper_value=paper, direction=direction, p_value=pv.p_value, note=note,
    )  # fmt: skip


def variance_ratio(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float, float, float]:
    """(var(a)/var(b), interval low, high, two-sided p of equal variances): the F test and its
    inverted interval (normal samples; df = n_a - 1, n_b - 1). a, b: shape (n_a,), (n_b,), n >= 2."""
    ratio = float(np.var(a, ddof=1) / np.var(b, ddof=1))
    d1, d2 = len(a) - 1, len(b) - 1
    q = (1 - level) / 2
    low, high = ratio / stats.f.ppf(1 - q, d1, d2), ratio / stats.f.ppf(q, d1, d2)
    p = float(min(1.0, 2 * min(stats.f.cdf(ratio, d1, d2), stats.f.sf(ratio, d1, d2))))
    return ratio, float(low), float(high), p


def paper_claims(finals: pd.DataFrame, metrics: pd.DataFrame, scales: list[str], variants: list[str], ratios: list[dict]) -> list[Claim]:
    """Every claim of the module docstring the study's variants can test, per scale (on a
    labelled corpus, ``mqar_claims``)."""
    if "final_accuracy" in finals and np.isfinite(finals["final_accuracy"].to_numpy(float)).any():
        return mqar_claims(finals, metrics, scales, variants)
    names = _names(variants)
    coupled, standard, mlp = names.get("coupled"), names.get("standard"), names.get("uncoupled_mlp")
    out: list[Claim] = []
    rank = last_value(metrics, ATTENTION_KEYS["effective_rank"])
    for s in scales:
        if coupled and standard:
            paper, note = _paper_dloss(s, "coupled", "standard")
            c = _paired_claim(
                "coupled has lower loss than standard", s, _loss_by_seed(finals, s, coupled), _loss_by_seed(finals, s, standard),
                paper, -1, note, "paired t, final loss (nats)",
            )  # fmt: skip
            out += [c] if c else []
            out += _ratio_claim(s, coupled, ratios)
            out += _rank_claim(s, finals, rank, coupled, standard)
        if coupled and mlp:
            paper, note = _paper_dloss(s, "coupled", "uncoupled_mlp")
            c = _paired_claim(
                "coupled has lower loss than the uncoupled MLP", s, _loss_by_seed(finals, s, coupled), _loss_by_seed(finals, s, mlp),
                paper, -1, note, "paired t, final loss (nats)",
            )  # fmt: skip
            out += [c] if c else []
            out += _std_claim(s, finals, coupled, mlp)
    return out


def _ratio_claim(scale: str, variant: str, ratios: list[dict]) -> list[Claim]:
    r = next((r for r in ratios if r["scale"] == scale and r["variant"] == variant), None)
    if r is None or r["ci_low"] is None or r["token_ratio"]["value"] is None:
        return []
    low = -math.inf if r["ci_low_side"] == "<" else r["ci_low"]
    high = math.inf if r["ci_high_side"] == ">" else r["ci_high"]
    note = "an open interval end: the set continues past the reference's runs" if r["ci_low_side"] or r["ci_high_side"] else ""
    return [
        _claim(
            claim=f"standard needs {PAPER_TOKEN_RATIO}x the tokens of coupled",
            scale=scale,
            test=f"token-ratio interval ({r['ci_method']})",
            estimate=r["token_ratio"]["value"],
            low=low,
            high=high,
            null=1.0,
            paper_value=PAPER_TOKEN_RATIO,
            direction=1,
            note=note,
        )
    ]


def _std_claim(scale: str, finals: pd.DataFrame, coupled: str, mlp: str) -> list[Claim]:
    c = np.array(list(_loss_by_seed(finals, scale, coupled, log=False).values()))
    m = np.array(list(_loss_by_seed(finals, scale, mlp, log=False).values()))
    if len(c) < 2 or len(m) < 2 or np.var(c, ddof=1) == 0:
        return []
    ratio, low, high, p = variance_ratio(m, c)
    paper = (PAPER_SEED_STD["uncoupled_mlp"] / PAPER_SEED_STD["coupled"]) ** 2
    return [
        _claim(
            claim="the uncoupled MLP varies more over seeds than coupled (ppl std 0.31 vs 0.04)",
            scale=scale,
            test=f"variance ratio, F({len(m) - 1}, {len(c) - 1}) interval",
            estimate=ratio,
            low=low,
            high=high,
            null=1.0,
            paper_value=paper,
            direction=1,
            p_value=p,
            note=f"std ratio {math.sqrt(ratio):.2f} (paper {math.sqrt(paper):.2f}); unpaired",
        )
    ]


def _rank_claim(scale: str, finals: pd.DataFrame, rank: pd.Series, coupled: str, standard: str) -> list[Claim]:
    def by_seed(v: str) -> dict[int, float]:
        f = finals[
            (finals["scale"] == scale) & (finals["variant"] == v) & (finals["extend"] == 1.0) & finals["complete"] & finals["seed"].notna()
        ]
        vals = rank.reindex(f["run_uuid"]).to_numpy(float)
        return {int(s): float(x) for s, x in zip(f["seed"], vals) if np.isfinite(x)}

    c = _paired_claim("coupling raises the attention maps' effective rank", scale, by_seed(coupled), by_seed(standard), None, 1, "",
                      "paired t, final effective rank")  # fmt: skip
    return [c] if c else []


def mqar_claims(finals: pd.DataFrame, metrics: pd.DataFrame, scales: list[str], variants: list[str]) -> list[Claim]:
    """The MQAR claims of the module docstring, per scale: coupled's final accuracy against
    SOLVED, the token ratio at recall.RATIO_AT (standard over coupled, seed-paired), and the
    effective rank. ``finals``: curves.run_finals (final_accuracy, status, run_uuid);
    ``metrics``: the long metric table holding ``val/accuracy`` curves."""
    names = _names(variants)
    coupled, standard = names.get("coupled"), names.get("standard")
    if not coupled:
        return []
    cross = recall.crossing_table(finals, metrics) if standard else pd.DataFrame()
    rank = last_value(metrics, ATTENTION_KEYS["effective_rank"])
    out: list[Claim] = []
    for s in scales:
        out += _recall_claim(s, _loss_by_seed(finals, s, coupled, col="final_accuracy", log=False))
        if standard and len(cross):
            out.append(_recall_ratio_claim(recall.accuracy_ratio(cross, s, coupled, standard)))
        if standard:
            out += _rank_claim(s, finals, rank, coupled, standard)
    return out


def _recall_claim(scale: str, accuracy: dict[int, float], level: float = 0.95) -> list[Claim]:
    """Coupled's final accuracy (fractions, one per seed) against SOLVED: the mean with its
    t interval over seeds (n - 1 degrees of freedom), cut to [0, 1] where an accuracy lies, and
    the one-sample t test's p."""
    a = np.array(list(accuracy.values()))
    if len(a) < 2:
        return []
    half = float(stats.t.ppf((1 + level) / 2, len(a) - 1) * np.std(a, ddof=1) / math.sqrt(len(a)))
    p = float(stats.ttest_1samp(a, SOLVED).pvalue) if np.std(a) > 0 else math.nan
    return [
        _claim(
            claim=f"coupled recalls perfectly on MQAR (final accuracy above {SOLVED:.0%})",
            scale=scale,
            test="t interval over seeds, final accuracy",
            estimate=float(a.mean()),
            low=max(0.0, float(a.mean()) - half),
            high=min(1.0, float(a.mean()) + half),
            null=SOLVED,
            paper_value=None,
            direction=1,
            p_value=p,
            note=f"{len(a)} seeds: " + ", ".join(f"{x:.2%}" for x in a),
        )
    ]


def _recall_ratio_claim(r: dict) -> Claim:
    """The seed-paired token ratio at recall.RATIO_AT accuracy (recall.accuracy_ratio's dict):
    decided on its interval; a bound or no ratio is 'cannot tell', with the reason."""
    exact = r["ratio"] is not None and r["ci_low"] is not None
    low, high = (r["ci_low"], r["ci_high"]) if exact else (math.nan, math.nan)
    note = "" if exact else r["note"] if r["ratio"] is None else f"{r['direction']}{r['ratio']:.2f}x, {r['note']}"
    return _claim(
        claim=f"coupled reaches {r['accuracy']:.0%} MQAR accuracy on fewer tokens than standard",
        scale=r["scale"], test=f"token ratio at {r['accuracy']:.0%} accuracy, paired t on ln ratios ({r['pairs']} pairs)",
        estimate=math.nan if r["ratio"] is None else r["ratio"], low=low, high=high, null=1.0, paper_value=None,
        direction=1, note=note,
    )  # fmt: skip
