"""The gated ladder's decision and its place in the report.

``decide`` is the product's ``orchestrator.plan.gate.GateDecider``: after a rung trains, the
gated protocol (``run.driver.study``, handed this function by the CLI: the run stage never
imports the report) asks it, per (corpus, variant) still training, for the seed-paired
difference against the reference at that rung in the gate's currency. The numbers are the
report's own: ``currencies.contrast_table`` (equal tokens or equal model FLOPs, the arm that
spent more read on its own eval curve) and its paired t-test (``verdict.compare``), so the
gate and the report's "every currency" table cannot disagree. ``plan.gate.stops`` is the rule.

``attach`` reads the stopped arms back from the experiment's tags (``track.gate_record``,
read with the study by ``report.query``; ``report.parts.gate`` is the report's part) and
marks them in the report: a table of the evidence, and their runs at the larger rungs listed
as gated (not trained by design), not as missing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from orchestrator.plan.gate import GateEvidence, GateSpec, stops
from orchestrator.report.errors import ReportError
from orchestrator.report.query import StudyData, query_study
from orchestrator.report.stats.currencies import contrast_table
from orchestrator.report.stats.curves import run_finals
from orchestrator.track.gate_record import gate_ran_from_tags, gates_from_tags

TABLE = "gated"
COLUMNS = ["corpus", "variant", "stopped_at", "rung", "currency", "bound", "dloss", "low", "high", "n_pairs", "p_value", "not_trained_at"]


def evidence_at(data: StudyData, reference: str, gate: GateSpec, scale: str, rung: int, variants: Sequence[str]) -> list[GateEvidence]:
    """The gate's evidence for every corpus of ``data`` and every variant of ``variants`` (the
    reference left out) at ``scale`` (rung ``rung``, 1-based): paired Δloss (nats/token,
    variant - reference) in ``gate.currency`` with its ``gate.level`` interval, and whether
    ``stops`` stops the arm. A variant without a finished seed pair there gets NaN numbers and
    is not stopped. ``skipped`` is left empty (the caller knows the larger rungs)."""
    out = []
    others = [v for v in variants if v != reference]
    for corpus in sorted(str(c) for c in data.runs["corpus"].dropna().unique()):
        runs = data.runs[data.runs["corpus"] == corpus]
        metrics = data.metrics[data.metrics["run_uuid"].isin(runs["run_uuid"])]
        table = contrast_table(run_finals(runs, metrics), metrics, [scale], [(v, reference) for v in others], None, gate.level)
        rows = {r.variant: r for r in table[table["currency"] == gate.currency].itertuples()}
        for v in others:
            r = rows.get(v)
            nums: dict[str, Any] = (
                dict(dloss=r.paired_dloss, low=r.paired_low, high=r.paired_high, n_pairs=int(r.n_pairs), p_value=r.p_value, note=r.note)
                if r is not None
                else dict(
                    dloss=math.nan, low=math.nan, high=math.nan, n_pairs=0, p_value=math.nan, note="no finished seed pair at this rung"
                )
            )
            nums = {k: float(x) if k in ("dloss", "low", "high", "p_value") else x for k, x in nums.items()}
            stopped = stops(gate, nums["dloss"], nums["low"])
            out.append(
                GateEvidence(corpus, v, reference, scale, rung, gate.currency, gate.worse_than, level=gate.level, stopped=stopped, **nums)
            )
    return out


def decide(
    tracking_uri: str, study: str, reference: str, gate: GateSpec, scale: str, rung: int, variants: Sequence[str]
) -> list[GateEvidence]:
    """``evidence_at`` on the study's MLflow store (``GateDecider``); [] when the store holds
    no training run of the study yet."""
    try:
        data = query_study(study, tracking_uri)
    except ReportError:
        return []
    return evidence_at(data, reference, gate, scale, rung, variants)


def evidence_table(evidence: list[GateEvidence]) -> pd.DataFrame:
    """One row per stopped arm (COLUMNS; dloss, low, high in nats/token)."""
    rows = [
        {
            "corpus": e.corpus,
            "variant": e.variant,
            "stopped_at": e.scale,
            "rung": e.rung,
            "currency": e.currency,
            "bound": e.bound,
            "dloss": e.dloss,
            "low": e.low,
            "high": e.high,
            "n_pairs": e.n_pairs,
            "p_value": e.p_value,
            "not_trained_at": ", ".join(e.skipped),
        }
        for e in evidence
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def attach(summary: dict, tabs: dict[str, pd.DataFrame], experiment_tags: dict[str, str], corpus: str | None) -> None:
    """Mark the arms the study's gate stopped (of ``corpus``; None: a single-corpus study):
    ``summary["gates"]`` (each arm's evidence and sentence), ``tabs[TABLE]``, and each missing
    run of a stopped arm at a scale it skipped moved from ``summary["runs"]["missing"]`` to
    ``summary["runs"]["gated"]`` (and marked ``gated`` in the issues table). ``summary["gate"]``:
    the gate's settings and the rungs it decided after, where the store recorded that it ran
    (``track.gate_record``); a gate that ran and stopped nothing gets the section too (a saving
    of 0). No change for a study without a gate."""
    stopped = [e for e in gates_from_tags(experiment_tags) if corpus in (None, e.corpus)]
    ran = gate_ran_from_tags(experiment_tags)
    if ran is not None:
        summary["gate"] = ran
    if not stopped and ran is None:
        return
    why = {(e.variant, s): e.sentence() for e in stopped for s in e.skipped}
    runs = summary["runs"]
    runs["gated"] = [
        m | {"problem": "gated", "detail": why[(m["variant"], m["scale"])]} for m in runs["missing"] if (m["variant"], m["scale"]) in why
    ]
    runs["missing"] = [m for m in runs["missing"] if (m["variant"], m["scale"]) not in why]
    issues = tabs.get("issues")
    if issues is not None and len(issues):
        keys = list(zip(issues["variant"], issues["scale"]))
        gated = (issues["problem"] == "missing") & pd.Series([k in why for k in keys], index=issues.index)
        issues.loc[gated, "problem"] = "gated"
        issues.loc[gated, "detail"] = [why[k] for k, g in zip(keys, gated) if g]
    summary["gates"] = [{"corpus": e.corpus, "variant": e.variant, "sentence": e.sentence(), **_numbers(e)} for e in stopped]
    summary["gate_saving"] = saving(runs["gated"], runs.get("planned_flops"))
    tabs[TABLE] = evidence_table(stopped)


def saving(gated: list[dict], planned_flops: float | None) -> dict | None:
    """The training FLOPs the gate did not spend: the gated runs' planned FLOPs, and their
    fraction of the whole plan's (every arm at every rung). None without the plan's FLOPs (a
    report built from the study's name, not its spec). Tuning runs are not counted."""
    if planned_flops is None or not planned_flops or any("flops" not in g for g in gated):
        return None
    saved = float(sum(g["flops"] for g in gated))
    return {"saved_flops": saved, "planned_flops": planned_flops, "fraction": saved / planned_flops}


def _numbers(e: GateEvidence) -> dict:
    """The evidence's numbers for summary.json (``skipped`` as a list)."""
    keys = ("scale", "rung", "currency", "bound", "dloss", "low", "high", "n_pairs", "p_value")
    return {k: getattr(e, k) for k in keys} | {"skipped": list(e.skipped)}


def display(table: pd.DataFrame) -> pd.DataFrame:
    """``evidence_table`` as the report prints it: Δloss with its interval (nats), p, bound."""

    def num(x: float, spec: str = "+.4f") -> str:
        return "—" if x is None or not math.isfinite(float(x)) else format(float(x), spec)

    return pd.DataFrame(
        {
            "corpus": table["corpus"],
            "variant": table["variant"],
            "stopped at (rung)": [f"{s} ({r})" for s, r in zip(table["stopped_at"], table["rung"])],
            "paired Δloss [interval] (nats)": [
                f"{num(d)} [{num(lo)}, {num(hi)}]" for d, lo, hi in zip(table["dloss"], table["low"], table["high"])
            ],
            "pairs": table["n_pairs"],
            "p": [num(p, ".3g") for p in table["p_value"]],
            "bound (nats)": [num(b) for b in table["bound"]],
            "currency": table["currency"],
            "not trained at": table["not_trained_at"],
        }
    )


def section_text(summary: dict) -> list[str]:
    """The gated-arms section's sentences: the rule, then one line per stopped arm (or that
    none stopped), then what the gate saved."""
    ran, bound = summary.get("gate"), ""
    if ran:
        spec = ran["gate"]
        bound = (
            f" (here +{spec['worse_than']:g} nats at equal {'model FLOPs' if spec['currency'] == 'flops' else 'tokens'}, "
            f"{spec['level']:.0%} interval, decided after {', '.join(ran['decided_after'])}; each rung's Δloss is in the "
            "every-currency table)"
        )
    text = [
        "The study's gate trained the ladder rung by rung (scales by N, non-embedding): after each rung, a variant whose "
        f"seed-paired Δloss against the reference (variant - reference, nats/token) was above the gate's bound{bound} with its "
        "interval excluding zero stopped, and its runs at the larger rungs were not trained (listed as gated, not missing). "
        "The reference trained every rung."
    ]
    if not summary.get("gates"):
        text.append("No arm was stopped: the gate skipped no planned run.")
    for g in summary.get("gates", []):
        where = f" on corpus `{g['corpus']}`" if summary.get("corpus") else ""
        text.append(f"`{g['variant']}`{where} {g['sentence']}; not trained at {', '.join(g['skipped']) or '—'}.")
    s = summary.get("gate_saving")
    text.append(
        f"The gate saved {s['saved_flops']:.3g} training FLOPs of the {s['planned_flops']:.3g} the plan's runs cost with every arm "
        f"at every rung ({s['fraction']:.1%}; tuning runs not counted)."
        if s
        else "What the gate saved is not computed: the report was built without the study's spec (its plan's FLOPs)."
    )
    return text
