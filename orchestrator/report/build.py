"""build_report: MLflow -> figures, tables, markdown, HTML and a JSON summary, atomically.

The study is read from MLflow once (query.py: runs, metric histories, experiment tags, tuning
runs); analyse() computes every number from it (``report.stats``; gaps.py says what the
store lacks), the optional parts (``report.parts``) add theirs; build_report writes them. The whole output
folder is built in a temporary sibling folder and swapped in at the end (output.py), so a
reader never sees half a report. The same files are then logged as artifacts of the study's one
report run (report_run.py: kind report, updated by each call; query.py skips such runs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.report import gaps, plots, provenance, render, run_links, tables
from orchestrator.report.errors import ReportError
from orchestrator.report.output import GENERATOR, check_out_dir, jsonable, swap_in, write_file
from orchestrator.report.parts import PartInput, build_parts
from orchestrator.report.query import StudyData, query_study
from orchestrator.report.report_run import log_report, open_report_run
from orchestrator.report.stats import currencies, recall
from orchestrator.report.stats import curves as C
from orchestrator.report.stats.claims import paper_claims
from orchestrator.report.stats.paired_curve import paired_curves
from orchestrator.report.stats.ratio import token_ratio
from orchestrator.report.stats.scaling import scaling_analysis
from orchestrator.report.stats.verdict import holm, paired_differences
from orchestrator.track.tracking import client_for, redact_uri

DIAGNOSTICS = ("attn/effective_rank", "attn/entropy", "attn/spectral_gap")
DEFAULT_TARGET = "coupled"  # build_report's default target; only it falls back when absent

Figures = Callable[[Path], list[Path]]
Progress = Callable[[str], None]  # told what the report is doing now (the CLI shows it)


def _quiet(_: str) -> None:
    pass


def build_report(
    study: str,
    tracking_uri: str,
    out_dir: str | os.PathLike,
    *,
    reference: str = "standard",
    target: str = DEFAULT_TARGET,
    log_to_mlflow: bool = True,
    expected: Iterable[dict] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    corpus: str | None = None,
    contrasts: Iterable[tuple[str, str]] | None = None,
    progress: Progress = _quiet,
) -> dict:
    """Write the study's report into out_dir and return its JSON-able summary.

    A study with several corpora (tag ``corpus``) gets one report per corpus in
    ``out_dir/<corpus>/`` (scales are never pooled across corpora: the paper's finding is
    that the answer depends on the corpus) and an index ``out_dir/report.md``; every entry
    of ``summary["scales"]`` then names its ``corpus``. ``corpus`` restricts to one corpus.

    expected: optional planned runs (dicts with variant, scale, seed, extend) to list missing
        runs against; by default the grid is inferred from the runs present (every variant x
        scale x seed at x1, the reference's extend levels at every scale and seed).
    target: the variant whose ratio is the per-scale headline `token_ratio`. The default
        ("coupled") falls back to the first non-reference variant when the study has none; any
        other name must be a non-reference variant of the study (else ReportError).
    n_boot: bootstrap draws of the scaling crossover (n_boot // 5, at least 50); seed: their RNG.
    contrasts: (variant, against) pairs compared in every currency (currencies.py) beside
        each non-reference variant against the reference (always compared). A pair naming a variant without runs
        raises ReportError.
    The summary's "scales" list holds per scale: scale, n_params (non-embedding N), final_ppl
    {variant: seed mean}, token_ratio (value, bound if censored, or None), censored, ...;
    "gaps" lists every input the store lacks as a sentence (gaps.py); "unigram" the corpus's
    unigram baseline and each arm's final / unigram ratio (unigram.py), also per scale entry;
    "time_split" the study's worker seconds in and outside optimizer steps (time_split.py);
    "startup" (when runs logged one) the median seconds to each run's first optimizer step (startup.py);
    "code" the commit(s) the runs came from, with dirty flags and run counts (provenance.py).
    With ``log_to_mlflow`` the report is the artifacts of the study's one report run
    (report_run.py: found again and updated, not one new run per call); a per-corpus report
    logs the whole folder, index and corpora, into it. ``progress`` is told each step
    (querying, analysing a corpus, drawing, writing, logging) as it starts.
    Raises ReportError when the experiment is missing, has no training runs, no run carries
    the variant and scale tags, the reference variant has no run, target names no variant
    of the study, or out_dir exists and is a file or a non-empty folder that is not a
    previous qkstudy report (it is never touched).
    """
    check_out_dir(Path(out_dir))
    progress(f"querying MLflow for study {study}")
    data = query_study(study, tracking_uri)
    corpora = sorted(str(c) for c in data.runs["corpus"].dropna().unique())
    kw: dict[str, Any] = dict(
        reference=reference, target=target, expected=expected, n_boot=n_boot, seed=seed, contrasts=list(contrasts) if contrasts else None
    )
    if corpus is None and len(corpora) > 1:
        return _build_per_corpus(data, Path(out_dir), corpora, log_to_mlflow=log_to_mlflow, progress=progress, **kw)
    if corpus is not None and corpus not in corpora:
        raise ReportError(f"study {study!r} has no runs on corpus {corpus!r}; corpora: {corpora}")
    return _build_corpus(data, Path(out_dir), corpus, corpora, log_to_mlflow=log_to_mlflow, progress=progress, **kw)


def _build_corpus(
    data: StudyData, out: Path, corpus: str | None, corpora: list[str], *, log_to_mlflow: bool, progress: Progress, **kw
) -> dict:
    """The report of one corpus of ``data`` (None: the study's only one, or it has none) into
    ``out``: the numbers, the parts, the corpus name on the summary and its scales."""
    if corpus is not None:
        data = _only_corpus(data, corpus)
        kw["expected"] = [e for e in kw["expected"] if e.get("corpus", corpus) == corpus] if kw["expected"] is not None else None
    progress(f"analysing {data.study}" + (f" on {corpus}" if corpus else "") + f": {len(data.runs)} runs")
    summary, tabs, figures = analyse(data, **kw)
    build_parts(PartInput(data, summary, tabs, corpus, corpus or (corpora[0] if len(corpora) == 1 else None)))
    if corpus is not None:
        summary["corpus"] = corpus
        for s_ in summary["scales"]:
            s_["corpus"] = corpus
    run_name = f"report-{data.study}" + (f"-{corpus}" if corpus else "")
    return _write(summary, tabs, figures, out, data, run_name if log_to_mlflow else None, progress)


def _write(
    summary: dict, tabs: dict[str, pd.DataFrame], figures: Figures, out: Path, data: StudyData, run_name: str | None, progress: Progress
) -> dict:
    """Render into a temporary sibling folder, swap it in, log it to the study's report run
    (``report_run``; run_name not None)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as err:
        raise ReportError(f"cannot write report folder {out}: {err}") from err
    client = run_id = None
    created = False
    try:
        if run_name is not None:
            client = client_for(data.tracking_uri)
            run_id, created, summary["mlflow_not_logged"] = open_report_run(client, data.experiment_id, run_name, data.study)
            summary["mlflow_report_run"] = run_id
        progress(f"drawing figures of {out.name}")
        summary["figures"] = [p.name for p in figures(tmp)]
        summary["gaps"] += gaps.figure_gaps(summary["figures"])
        progress(f"writing {out.name}: tables, markdown, HTML")
        for name, df in tabs.items():
            df.to_csv(tmp / f"{name}.csv", index=False)
        summary["tables"] = [f"{n}.csv" for n in tabs]
        summary = jsonable(summary)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
        (tmp / "report.md").write_text(render.markdown(summary, tabs))
        (tmp / "report.html").write_text(render.html(summary, tabs, tmp))
        check_out_dir(out)  # again: something may have appeared while we worked
        swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if client is not None and run_id is not None and created:  # an existing run keeps the last good report
            client.set_terminated(run_id, status="FAILED")
        raise
    if client is not None and run_id is not None:
        progress("logging the report to MLflow")
        log_report(client, run_id, out)
    return summary


def _only_corpus(data: StudyData, corpus: str) -> StudyData:
    runs = data.runs[data.runs["corpus"] == corpus]
    return dataclasses.replace(data, runs=runs, metrics=data.metrics[data.metrics["run_uuid"].isin(runs["run_uuid"])])


def _build_per_corpus(data: StudyData, out: Path, corpora: list[str], *, log_to_mlflow: bool, progress: Progress, **kw) -> dict:
    """One report per corpus under out/<corpus>/ (each from ``data``: the store is not read
    again) and an index report.md + summary.json; with ``log_to_mlflow`` the whole folder is
    the artifacts of the study's one report run."""
    study = data.study
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(f"cannot write report folder {out}: {err}") from err
    os.chmod(out, 0o755)
    parts = {}
    for c in corpora:
        check_out_dir(out / c)
        parts[c] = _build_corpus(data, out / c, c, corpora, log_to_mlflow=False, progress=progress, **kw)
    summary: dict[str, Any] = {
        "generator": GENERATOR,
        "study": study,
        "corpora": corpora,
        "scales": [s_ for c in corpora for s_ in parts[c]["scales"]],
        "reports": {c: f"{c}/report.md" for c in corpora},
        "code": provenance.merge_codes([parts[c]["code"] for c in corpora]),
    }
    client = run_id = None
    if log_to_mlflow:
        client = client_for(data.tracking_uri)
        run_id, _, summary["mlflow_not_logged"] = open_report_run(client, data.experiment_id, f"report-{study}", study)
        summary["mlflow_report_run"] = run_id
    write_file(out / "report.md", render.corpus_index(summary))
    write_file(out / "summary.json", json.dumps(jsonable(summary), indent=2))
    if client is not None and run_id is not None:
        progress("logging the report to MLflow")
        log_report(client, run_id, out)
    return summary


@dataclasses.dataclass
class Numbers:
    """Everything analyse computes, before it becomes tables, a summary and figures."""

    finals: pd.DataFrame
    metrics: pd.DataFrame
    ppl_curves: pd.DataFrame
    scales: list[str]
    variants: list[str]
    reference: str
    target: str | None
    ratios: list[dict]
    paired: pd.DataFrame
    paired_curve: pd.DataFrame  # paired_curve.paired_curves: the paired Δ loss at every eval point
    final: pd.DataFrame  # tables.final_table
    cost: pd.DataFrame  # curves.paired_cost, in table order
    attention: pd.DataFrame  # curves.final_attention, in table order
    scaling: dict
    status: dict
    gaps: list[dict]
    currency: str | None  # what the budget matched (currencies.matched_currency)
    contrasts: pd.DataFrame  # currencies.contrast_table, with p_holm
    decomposition: pd.DataFrame
    claims: pd.DataFrame  # claims.paper_claims rows, with p_holm


def analyse(data: StudyData, *, reference: str, target: str, expected=None, n_boot: int = 1000, seed: int = 0, contrasts=None):
    """All numbers of the report. Returns (summary dict, {name: table}, figures(dir) -> [paths]).

    Raises ReportError when no run carries the variant and scale tags (nothing can be
    reported), the reference has no run, a named target is no non-reference variant, or a
    contrast names a variant without runs.
    """
    runs, untagged = gaps.untagged(data.runs)
    if runs.empty:
        raise ReportError(
            f"study {data.study!r}: nothing to report: none of its {len(data.runs)} runs carries the "
            'variant and scale tags (README, "Conventions the numbers depend on")'
        )
    variants_seen = sorted(runs["variant"].unique())
    if reference not in variants_seen:
        raise ReportError(f"study {data.study!r}: reference variant {reference!r} has no runs; variants: {variants_seen}")
    others = [v for v in variants_seen if v != reference]
    if target not in others and target != DEFAULT_TARGET:  # the default falls back; a named one must exist
        raise ReportError(
            f"study {data.study!r}: target variant {target!r} has no runs or is the reference; non-reference variants: {others}"
        )
    for pair in contrasts or []:
        unknown = [v for v in pair if v not in variants_seen]
        if unknown or len(pair) != 2 or pair[0] == pair[1]:
            raise ReportError(
                f"study {data.study!r}: contrast {list(pair)} must name two different variants with runs; variants: {variants_seen}"
            )
    metrics = data.metrics[data.metrics["run_uuid"].isin(runs["run_uuid"])]
    nums = _numbers(
        runs,
        metrics,
        reference,
        target if target in others else (others[0] if others else None),
        expected,
        n_boot,
        np.random.default_rng(seed),
        currencies.with_defaults([tuple(p) for p in contrasts or []], variants_seen, reference),
    )
    nums.gaps = untagged + nums.gaps
    summary, tabs = _summary(data, nums, n_boot), _tables(nums)
    recall.attach(tabs, summary, nums.finals, nums.metrics, reference, nums.variants, nums.scales)  # MQAR corpora only
    return summary, tabs, _figures(nums)


def _numbers(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    reference: str,
    target: str | None,
    expected,
    n_boot: int,
    rng: np.random.Generator,
    contrasts: list[tuple[str, str]],
) -> Numbers:
    finals = C.run_finals(runs, metrics)
    n_of = finals.groupby("scale")["n_params"].median()
    # By N; scales without a logged N after those with one, by name.
    scales = sorted(finals["scale"].dropna().unique(), key=lambda s: (not np.isfinite(n_of.get(s, np.nan)), n_of.get(s, 0.0), s))
    variants = [reference, *sorted(v for v in finals["variant"].unique() if v != reference)]
    ppl_curves = C.curve_stats(runs, metrics, C.PPL)
    ratios = [token_ratio(s, v, reference, finals, ppl_curves).to_dict() for s in scales for v in variants[1:]]
    paired = paired_differences(finals, scales, variants, reference)
    currency = currencies.matched_currency(finals, reference, metrics)
    contrast = currencies.contrast_table(finals, metrics, scales, contrasts, currency)
    claims = pd.DataFrame([c.to_dict() for c in paper_claims(finals, metrics, scales, variants, ratios)])
    _holm_family(paired, contrast, claims)
    return Numbers(
        finals=finals,
        metrics=metrics,
        ppl_curves=ppl_curves,
        scales=scales,
        variants=variants,
        reference=reference,
        target=target,
        ratios=ratios,
        paired=paired,
        paired_curve=paired_curves(finals, metrics, scales, variants, reference),
        final=tables.final_table(finals, scales, variants, reference, paired),
        cost=tables.in_order(C.paired_cost(finals, reference), scales, variants),
        attention=tables.in_order(C.final_attention(finals, metrics), scales, variants),
        scaling=scaling_analysis(finals, reference, n_boot=max(50, n_boot // 5), rng=rng),
        status=tables.run_status(finals, expected),
        gaps=gaps.input_gaps(finals, metrics),
        currency=currency,
        contrasts=contrast,
        decomposition=currencies.decomposition(contrast, finals),
        claims=claims,
    )


def _holm_family(*tables: pd.DataFrame) -> None:
    """Add p_holm to each table: Holm-adjusted over every p-value the report prints (one family)."""
    ps = [t["p_value"].to_numpy(float) if "p_value" in t else np.array([]) for t in tables]
    adjusted = holm(np.concatenate(ps)) if ps else np.array([])
    at = 0
    for t, p in zip(tables, ps):
        t["p_holm"] = adjusted[at : at + len(p)] if len(t) else pd.Series(dtype=float)
        at += len(p)


def _tables(n: Numbers) -> dict[str, pd.DataFrame]:
    run_cols = [
        "run_name",
        "run_id",
        "variant",
        "scale",
        "seed",
        "extend",
        "status",
        "tokens",
        "final_ppl",
        "final_wall_s",
        "final_accuracy",
        "n_params",
        "flops_per_token",
        "failure_reason",
    ]
    out = {
        "final_ppl": n.final,
        "paired": tables.in_order(n.paired, n.scales, n.variants),
        "paired_curve": n.paired_curve,
        "token_ratio": tables.ratio_table(n.ratios),
        "seed_std": C.seed_std(n.finals),
        "cost": n.cost,
        "attention": n.attention,
        "runs": n.finals[[c for c in run_cols if c in n.finals.columns]],
        "issues": n.status["table"],
        "contrasts": n.contrasts,
        "decomposition": n.decomposition,
        "claims": n.claims,
        run_links.TABLE: run_links.table(n.finals, n.scales, n.variants),
    }
    accuracy = C.accuracy_table(n.finals)
    if len(accuracy):  # MQAR corpora only
        out["accuracy"] = tables.in_order(accuracy, n.scales, n.variants)
    return out


def _summary(data: StudyData, n: Numbers, n_boot: int) -> dict:
    return {
        "generator": GENERATOR,
        "study": data.study,
        "tracking_uri": redact_uri(data.tracking_uri),
        "experiment_id": data.experiment_id,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reference": n.reference,
        "target": n.target,
        "variants": n.variants,
        "scales": [_scale_entry(s, n) for s in n.scales],
        "scaling": n.scaling,
        "seed_std": C.seed_std(n.finals).to_dict(orient="records"),
        "paired": n.paired.to_dict(orient="records"),
        "budget_currency": n.currency,
        "contrasts": n.contrasts.to_dict(orient="records"),
        "decomposition": n.decomposition.to_dict(orient="records"),
        "claims": n.claims.to_dict(orient="records"),
        "runs": {k: v for k, v in n.status.items() if k != "table"},
        "gaps": n.gaps,
        "n_boot": n_boot,
    }


def _scale_entry(s: str, n: Numbers) -> dict:
    """The summary's entry of one scale: finals per variant and the headline ratio."""
    rs = {r["variant"]: r for r in n.ratios if r["scale"] == s}
    ft, cost, att = (t[t["scale"] == s] for t in (n.final, n.cost, n.attention))
    return {
        "scale": s,
        "n_params": _num(n.finals.loc[n.finals["scale"] == s, "n_params"].median()),
        "final_ppl": {r.variant: _num(r.mean_ppl) for r in ft.itertuples()},
        "final_ppl_std": {r.variant: _num(r.std) for r in ft.itertuples()},
        "n_seeds": {r.variant: int(r.n_seeds) for r in ft.itertuples()},
        "target": n.target,
        **_headline(rs.get(n.target) if n.target else None),
        "ratios": rs,
        # per run at the planned budget, paired by seed with the reference (not at equal perplexity)
        "run_wall_ratio": {r.variant: _num(r.wall_ratio) for r in cost.itertuples()},
        "time_per_token_ratio": {r.variant: _num(r.time_per_token_ratio) for r in cost.itertuples()},
        "effective_rank": {r.variant: _num(r.effective_rank) for r in att.itertuples()},
    }


def _headline(head: dict | None) -> dict:
    """The headline target's token ratio fields of a scale entry (RatioResult.to_dict or None)."""
    if head is None:
        return {
            "token_ratio": None,
            "censored": False,
            "token_ratio_display": "n/a",
            "token_ratio_ci": None,
            "token_ratio_reason": "no non-reference variant",
            "single_run_ratio": None,
            "flop_ratio": None,
            "wall_ratio": None,
        }
    tr = head["token_ratio"]
    return {
        "token_ratio": tr["value"],
        "censored": bool(tr["censored"]),
        "token_ratio_display": tr["display"],
        "token_ratio_ci": [head["ci_low"], head["ci_high"]] if head["ci_low"] is not None else None,
        "token_ratio_reason": tr["reason"] or head["ci_note"],
        "single_run_ratio": head["single_run"]["value"],
        "flop_ratio": head["flop_ratio"]["value"],
        "wall_ratio": head["wall_ratio"]["value"],
    }


def _figures(n: Numbers) -> Figures:
    diag = {k: C.curve_stats(n.finals, n.metrics, k) for k in DIAGNOSTICS if (n.metrics["key"] == k).any()}
    cmap = plots.colors(n.variants)

    def figures(d: Path) -> list[Path]:
        made = [
            plots.ppl_curves(n.ppl_curves, n.finals, n.scales, cmap, n.reference, "step", d / "ppl_vs_tokens.png"),
            plots.ppl_curves(n.ppl_curves, n.finals, n.scales, cmap, n.reference, "flops", d / "ppl_vs_flops.png"),
            plots.ppl_curves(n.ppl_curves, n.finals, n.scales, cmap, n.reference, "wall_s", d / "ppl_vs_wallclock.png"),
            plots.paired_dloss(n.paired_curve, cmap, n.reference, d / "paired_dloss_vs_tokens.png"),
            plots.token_ratios(n.ratios, n.scales, cmap, d / "token_ratio.png"),
            plots.scaling(n.finals, n.scaling, cmap, d / "scaling.png"),
            plots.seed_spread(C.seed_std(n.finals), n.scales, cmap, d / "seed_std.png"),
            plots.attention(diag, n.scales, cmap, d / "attention.png"),
            plots.accuracy_curves(C.curve_stats(n.finals, n.metrics, recall.ACC), n.scales, cmap, d / "accuracy_vs_tokens.png"),
        ]
        return [p for p in made if p is not None]

    return figures


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) or not np.isfinite(float(x)) else float(x)
