"""Seed-paired verdicts of every (scale, variant) against the reference, as one table.

Runs of one seed share the data order and (DESIGN.md "Conventions") the initial weights of
every parameter the variants share, so the comparison is paired by seed: for each seed s
with a finished planned (x1) run of both, delta_s = L_v,s - L_ref,s (final val loss = ln
perplexity, nats/token), and power.paired_verdict gives the paired t-test on the delta_s
(mean, interval, p-value), the smallest gap these seeds detect with 80% power (exact
noncentral t) and the seeds that would detect the observed gap. Beside it the unpaired
numbers the tables have always shown: the difference of seed means over every finished seed
of each, with Welch's interval (Satterthwaite degrees of freedom). A loss difference delta
is a perplexity ratio exp(delta).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from orchestrator.report.stats.power import paired_verdict

COLUMNS = [
    "scale",
    "variant",
    "n_pairs",
    "paired_dloss",
    "paired_low",
    "paired_high",
    "p_value",
    "detectable",
    "seeds_needed",
    "paired_ppl_pct",
    "paired_ppl_pct_low",
    "paired_ppl_pct_high",
    "unpaired_dloss",
    "unpaired_low",
    "unpaired_high",
    "verdict",
    "note",
]


def paired_differences(
    finals: pd.DataFrame, scales: list[str], variants: list[str], reference: str, level: float = 0.95, power: float = 0.8
) -> pd.DataFrame:
    """One row per (scale, non-reference variant) with a finished x1 run of both.

    finals: curves.run_finals output. Columns: COLUMNS (dloss in nats; *_ppl_pct the paired
    mean and interval as a perplexity change in percent; detectable: the smallest |dloss| the
    pairs detect with `power`; seeds_needed: pairs to detect the observed gap; verdict:
    'better', 'worse', 'no detectable difference' or 'no verdict: ...'; note: unpaired seeds).
    """
    f = finals[(finals["extend"] == 1.0) & finals["complete"] & finals["seed"].notna()]
    loss = f.assign(loss=np.log(f["final_ppl"])).groupby(["scale", "variant", "seed"])["loss"].mean()
    rows = []
    for s in scales:
        for v in variants:
            if v == reference or (s, v) not in loss.index or (s, reference) not in loss.index:
                continue
            rows.append({"scale": s, "variant": v} | compare(loss.loc[(s, v)], loss.loc[(s, reference)], level, power))
    return pd.DataFrame(rows, columns=COLUMNS)


def compare(var: pd.Series, ref: pd.Series, level: float = 0.95, power: float = 0.8) -> dict:
    """Paired and unpaired difference of two seed -> final loss series (module docstring)."""
    pv = paired_verdict(
        {int(k): float(x) for k, x in var.items()}, {int(k): float(x) for k, x in ref.items()}, alpha=1 - level, power=power
    )
    out = {
        "n_pairs": pv.n_pairs,
        "paired_dloss": pv.mean_diff,
        "paired_low": pv.low,
        "paired_high": pv.high,
        "p_value": pv.p_value,
        "detectable": pv.mde,
        "seeds_needed": pv.seeds_needed,
        "verdict": pv.verdict,
        "note": f"seed(s) {', '.join(map(str, pv.unpaired))} without a partner: not paired" if pv.unpaired else "",
    }
    for key, x in (("paired_ppl_pct", pv.mean_diff), ("paired_ppl_pct_low", pv.low), ("paired_ppl_pct_high", pv.high)):
        out[key] = 100 * np.expm1(x)
    return out | _unpaired(var.to_numpy(float), ref.to_numpy(float), level)


def _unpaired(v: np.ndarray, r: np.ndarray, level: float) -> dict:
    """Difference of means with Welch's interval; NaN ends unless both have 2+ seeds."""
    out = {"unpaired_dloss": float(v.mean() - r.mean()), "unpaired_low": np.nan, "unpaired_high": np.nan}
    if len(v) < 2 or len(r) < 2:
        return out
    a, b = v.var(ddof=1) / len(v), r.var(ddof=1) / len(r)
    if a + b == 0:
        out["unpaired_low"] = out["unpaired_high"] = out["unpaired_dloss"]
        return out
    dof = (a + b) ** 2 / (a**2 / (len(v) - 1) + b**2 / (len(r) - 1))
    w = float(stats.t.ppf((1 + level) / 2, dof) * np.sqrt(a + b))
    out["unpaired_low"], out["unpaired_high"] = out["unpaired_dloss"] - w, out["unpaired_dloss"] + w
    return out


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple
    test procedure"), same order and shape as `p_values`; NaN entries stay NaN and are not
    counted among the tests. Rejecting where adjusted p < alpha keeps the family-wise error
    rate at most alpha under any dependence between the tests."""
    p = np.asarray(p_values, float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order]).clip(max=1.0)
    out[order] = adjusted
    return out
