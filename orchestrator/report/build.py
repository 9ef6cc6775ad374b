"""build_report: MLflow -> figures, tables, markdown, HTML and a JSON summary, atomically.

The whole output folder is built in a temporary sibling folder and swapped in at the end,
so a reader never sees half a report. The same files are then logged as artifacts of a run
tagged qkstudy.kind=report in the study's experiment (query.py skips such runs).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.report import curves as C
from orchestrator.report import plots, render
from orchestrator.report.errors import ReportError
from orchestrator.report.paper import paper_ppl
from orchestrator.report.query import KIND_TAG, StudyData, query_study
from orchestrator.report.ratio import token_ratio
from orchestrator.report.scaling import scaling_analysis

DIAGNOSTICS = ("attn/effective_rank", "attn/entropy", "attn/spectral_gap")
DEFAULT_TARGET = "coupled"  # build_report's default target; only it falls back when absent
GENERATOR = "qkstudy"  # summary.json["generator"]: marks a folder build_report may replace
RUN_KEY = ["variant", "scale", "seed", "extend"]


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
    The summary's "scales" list holds per scale: scale, n_params (non-embedding N), final_ppl
    {variant: seed mean}, token_ratio (value, bound if censored, or None), censored, ...
    Raises ReportError when the experiment is missing, has no training runs, has no run of
    the reference variant, target names no variant of the study, or out_dir exists and is a
    file or a non-empty folder that is not a previous qkstudy report (it is never touched).
    """
    _check_out_dir(Path(out_dir))
    data = query_study(study, tracking_uri)
    corpora = sorted(str(c) for c in data.runs["corpus"].dropna().unique()) if "corpus" in data.runs else []
    if corpus is not None:
        if corpus not in corpora:
            raise ReportError(f"study {study!r} has no runs on corpus {corpus!r}; corpora: {corpora}")
        data = _only_corpus(data, corpus)
        expected = [e for e in expected if e.get("corpus", corpus) == corpus] if expected is not None else None
    elif len(corpora) > 1:
        return _build_per_corpus(study, tracking_uri, out_dir, corpora, reference=reference, target=target,
                                 log_to_mlflow=log_to_mlflow, expected=expected, n_boot=n_boot, seed=seed)
    summary, tables, figures_fn = analyse(data, reference=reference, target=target, expected=expected, n_boot=n_boot, seed=seed)
    if corpus is not None:
        summary["corpus"] = corpus
        for s_ in summary.get("scales", []):
            s_["corpus"] = corpus
    out = Path(out_dir)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as err:
        raise ReportError(f"cannot write report folder {out}: {err}") from err
    client = run_id = None
    try:
        if log_to_mlflow:
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri)
            name = f"report-{study}" + (f"-{corpus}" if corpus else "")
            run = client.create_run(data.experiment_id, run_name=name, tags={KIND_TAG: "report", "study": study})
            run_id = run.info.run_id
            summary["mlflow_report_run"] = run_id
        summary["figures"] = [p.name for p in figures_fn(tmp)]
        for name, df in tables.items():
            df.to_csv(tmp / f"{name}.csv", index=False)
        summary["tables"] = [f"{n}.csv" for n in tables]
        summary = _jsonable(summary)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
        (tmp / "report.md").write_text(render.markdown(summary, tables))
        (tmp / "report.html").write_text(render.html(summary, tables, tmp))
        _check_out_dir(out)  # again: something may have appeared while we worked
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if run_id is not None:
            client.set_terminated(run_id, status="FAILED")
        raise
    if client is not None:
        client.log_artifacts(run_id, str(out))
        client.set_terminated(run_id, status="FINISHED")
    return summary


def _only_corpus(data: StudyData, corpus: str) -> StudyData:
    import dataclasses

    runs = data.runs[data.runs["corpus"] == corpus]
    return dataclasses.replace(data, runs=runs, metrics=data.metrics[data.metrics["run_uuid"].isin(runs["run_uuid"])])


def _build_per_corpus(study: str, tracking_uri: str, out_dir: str | os.PathLike, corpora: list[str], **kw) -> dict:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(f"cannot write report folder {out}: {err}") from err
    os.chmod(out, 0o755)
    parts = {c: build_report(study, tracking_uri, out / c, corpus=c, **kw) for c in corpora}
    summary = {"generator": GENERATOR, "study": study, "corpora": corpora,
               "scales": [s_ for c in corpora for s_ in parts[c]["scales"]],
               "reports": {c: f"{c}/report.md" for c in corpora}}
    lines = [f"# qkstudy report: {study}", "", "One report per corpus (scales are not pooled across corpora):", ""]
    lines += [f"- [{c}]({c}/report.md) ([html]({c}/report.html))" for c in corpora]
    rows = ["", "Token ratio of each scale's headline variant (`<B`/`>B`: censored at the measured range), "
            "seed-mean final perplexity per variant.", "",
            "| corpus | scale | variant | token ratio | 95% interval | " + " | ".join(f"{v} ppl" for v in _variants(summary)) + " |",
            "|---|---|---|---|---|" + "---|" * len(_variants(summary))]
    for s_ in summary["scales"]:
        head = s_.get("ratios", {}).get(s_.get("target")) or {}
        interval = head.get("interval_display", "n/a")
        ppl = " | ".join(f"{s_['final_ppl'][v]:.2f}" if v in s_.get("final_ppl", {}) else "-" for v in _variants(summary))
        rows.append(f"| {s_['corpus']} | {s_['scale']} | {s_.get('target') or '-'} | {s_.get('token_ratio_display', 'n/a')} "
                    f"| {interval} | {ppl} |")
    for name, text in (("report.md", "\n".join(lines + rows) + "\n"), ("summary.json", json.dumps(_jsonable(summary), indent=2))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
    return summary


def _variants(summary: dict) -> list[str]:
    seen: list[str] = []
    for s_ in summary["scales"]:
        seen += [v for v in s_.get("final_ppl", {}) if v not in seen]
    return seen


def is_report_dir(path: Path) -> bool:
    """True when path holds a report qkstudy wrote (summary.json with "generator": "qkstudy")."""
    try:
        return json.loads((path / "summary.json").read_text()).get("generator") == GENERATOR
    except (OSError, ValueError, AttributeError):
        return False


def _check_out_dir(out: Path) -> None:
    """ReportError unless out is absent, an empty folder or a previous qkstudy report.

    The report replaces out whole, so anything else there would be lost.
    """
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ReportError(f"report output {out} exists and is not a folder; refusing to replace it")
    if out.is_dir() and any(out.iterdir()) and not is_report_dir(out):
        raise ReportError(
            f"report output {out} is a non-empty folder that is not a qkstudy report (no summary.json with "
            f'"generator": "{GENERATOR}"); refusing to replace it: pick another folder or remove it yourself'
        )


def _swap_in(tmp: Path, out: Path) -> None:
    """Replace out with tmp: rename the old folder aside first (rename cannot replace a full dir).

    Modes are set explicitly (folders 0755, files 0644): mkdtemp makes 0700 and the
    umask is the caller's, but a report is meant to be read by others.
    """
    for root, dirs, files in os.walk(tmp):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    os.chmod(tmp, 0o755)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def analyse(data: StudyData, *, reference: str, target: str, expected=None, n_boot: int = 1000, seed: int = 0):
    """All numbers of the report. Returns (summary dict, {name: table}, figures(dir) -> [paths])."""
    runs, metrics = data.runs, data.metrics
    if reference not in set(runs["variant"].dropna()):
        raise ReportError(
            f"study {data.study!r}: reference variant {reference!r} has no runs; variants: {sorted(runs['variant'].dropna().unique())}"
        )
    rng = np.random.default_rng(seed)
    finals = C.run_finals(runs, metrics)
    ppl_curves = C.curve_stats(runs, metrics, C.PPL)
    diag = {k: C.curve_stats(runs, metrics, k) for k in DIAGNOSTICS if (metrics["key"] == k).any()}
    scales = list(finals.groupby("scale")["n_params"].median().sort_values(kind="stable").index)
    others = sorted(v for v in runs["variant"].dropna().unique() if v != reference)
    variants = [reference, *others]
    if target not in others and target != DEFAULT_TARGET:  # the default falls back; a named one must exist
        raise ReportError(
            f"study {data.study!r}: target variant {target!r} has no runs or is the reference; non-reference variants: {others}"
        )
    target = target if target in others else (others[0] if others else None)
    cmap = plots.colors(variants)

    ratios = [token_ratio(s, v, reference, finals, ppl_curves, n_boot=n_boot, rng=rng).to_dict() for s in scales for v in others]
    final_table = _final_table(finals, scales, variants, reference)
    std = C.seed_std(finals)
    cost = _in_order(C.paired_cost(finals, reference), scales, variants)
    attention = _in_order(C.final_attention(finals, metrics), scales, variants)
    scaling = scaling_analysis(finals, reference, n_boot=max(50, n_boot // 5), rng=rng)
    status = _run_status(finals, expected)

    per_scale = []
    for s in scales:
        ft = final_table[final_table["scale"] == s]
        rs = {r["variant"]: r for r in ratios if r["scale"] == s}
        head = rs.get(target)
        entry = {
            "scale": s,
            "n_params": _num(finals.loc[finals["scale"] == s, "n_params"].median()),
            "final_ppl": {r.variant: _num(r.mean_ppl) for r in ft.itertuples()},
            "final_ppl_std": {r.variant: _num(r.std) for r in ft.itertuples()},
            "n_seeds": {r.variant: int(r.n_seeds) for r in ft.itertuples()},
            "target": target,
            "token_ratio": head["token_ratio"]["value"] if head else None,
            "censored": bool(head["token_ratio"]["censored"]) if head else False,
            "token_ratio_display": head["token_ratio"]["display"] if head else "n/a",
            "token_ratio_ci": [head["ci_low"], head["ci_high"]] if head and head["ci_low"] is not None else None,
            "token_ratio_reason": (head["token_ratio"]["reason"] or head["ci_note"]) if head else "no non-reference variant",
            "single_run_ratio": head["single_run"]["value"] if head else None,
            "flop_ratio": head["flop_ratio"]["value"] if head else None,
            "wall_ratio": head["wall_ratio"]["value"] if head else None,
            "ratios": rs,
            # per run at the planned budget, paired by seed with the reference (not at equal perplexity)
            "run_wall_ratio": {r.variant: _num(r.wall_ratio) for r in cost[cost["scale"] == s].itertuples()},
            "time_per_token_ratio": {r.variant: _num(r.time_per_token_ratio) for r in cost[cost["scale"] == s].itertuples()},
            "effective_rank": {r.variant: _num(r.effective_rank) for r in attention[attention["scale"] == s].itertuples()},
        }
        per_scale.append(entry)

    ratio_table = pd.DataFrame(
        [
            {
                "scale": r["scale"],
                "variant": r["variant"],
                "token_ratio": r["token_ratio"]["display"],
                "interval_95": r["interval_display"],
                "single_run_estimate": r["single_run"]["display"],
                "flop_ratio": r["flop_ratio"]["display"],
                "wall_ratio": r["wall_ratio"]["display"],
                "value": r["token_ratio"]["value"],
                "censored": r["token_ratio"]["censored"],
                "ci_low": r["ci_low"],
                "ci_high": r["ci_high"],
                "target_ppl": r["target_ppl"],
                "target_tokens": r["target_tokens"],
                "reference_extends": " ".join(f"x{e:g}" for e in r["ref_extends"]),
                "note": r["token_ratio"]["reason"] or r["ci_note"] or "",
            }
            for r in ratios
        ],
        columns=["scale", "variant", "token_ratio", "interval_95", "single_run_estimate", "flop_ratio", "wall_ratio", "value", "censored", "ci_low", "ci_high", "target_ppl", "target_tokens", "reference_extends", "note"],
    )
    run_cols = ["run_name", "run_id", "variant", "scale", "seed", "extend", "status", "tokens", "final_ppl", "final_wall_s", "n_params", "flops_per_token", "failure_reason"]
    tables = {
        "final_ppl": final_table,
        "token_ratio": ratio_table,
        "seed_std": std,
        "cost": cost,
        "attention": attention,
        "runs": finals[[c for c in run_cols if c in finals.columns]],
        "issues": status["table"],
    }
    summary = {
        "generator": GENERATOR,
        "study": data.study,
        "tracking_uri": data.tracking_uri,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "reference": reference,
        "target": target,
        "variants": variants,
        "scales": per_scale,
        "scaling": scaling,
        "seed_std": std.to_dict(orient="records"),
        "runs": {k: v for k, v in status.items() if k != "table"},
        "n_boot": n_boot,
    }

    def figures(d: Path) -> list[Path]:
        made = [
            plots.ppl_curves(ppl_curves, finals, scales, cmap, reference, "step", d / "ppl_vs_tokens.png"),
            plots.ppl_curves(ppl_curves, finals, scales, cmap, reference, "flops", d / "ppl_vs_flops.png"),
            plots.ppl_curves(ppl_curves.dropna(subset=["wall_s"]), finals, scales, cmap, reference, "wall_s", d / "ppl_vs_wallclock.png"),
            plots.token_ratios(ratios, scales, cmap, d / "token_ratio.png"),
            plots.scaling(finals, scaling, cmap, d / "scaling.png"),
            plots.seed_spread(std, scales, cmap, d / "seed_std.png"),
            plots.attention(diag, scales, cmap, d / "attention.png"),
        ]
        return [p for p in made if p is not None]

    return summary, tables, figures


def _in_order(df: pd.DataFrame, scales: list[str], variants: list[str]) -> pd.DataFrame:
    """Rows sorted by scale (by N) then variant (reference first), as every other table."""
    key = {(s, v): (i, j) for i, s in enumerate(scales) for j, v in enumerate(variants)}
    return df.iloc[sorted(range(len(df)), key=lambda i: key.get((df["scale"].iat[i], df["variant"].iat[i]), (1e9, 1e9)))].reset_index(drop=True)


def _final_table(finals: pd.DataFrame, scales: list[str], variants: list[str], reference: str) -> pd.DataFrame:
    """Final val ppl per scale x variant (planned runs), change vs reference, paper numbers beside."""
    f = finals[(finals["extend"] == 1.0) & finals["complete"]]
    g = f.groupby(["scale", "variant"]).agg(
        n_params=("n_params", "median"),
        n_params_total=("n_params_total", "median"),
        tokens=("tokens", "mean"),
        mean_ppl=("final_ppl", "mean"),
        std=("final_ppl", "std"),
        n_seeds=("final_ppl", "size"),
    )
    rows = []
    for s in scales:
        ref = g.loc[(s, reference), "mean_ppl"] if (s, reference) in g.index else np.nan
        pref = paper_ppl(s, reference)
        for v in variants:
            if (s, v) not in g.index:
                continue
            r = g.loc[(s, v)]
            p = paper_ppl(s, v)
            pmid = None if p is None else sum(p) / 2
            rows.append(
                {
                    "scale": s,
                    "variant": v,
                    "n_params": r["n_params"],
                    "n_params_total": r["n_params_total"],
                    "tokens": r["tokens"],
                    "mean_ppl": r["mean_ppl"],
                    "std": r["std"],
                    "n_seeds": int(r["n_seeds"]),
                    "change_vs_reference_pct": 100.0 * (r["mean_ppl"] / ref - 1.0) if np.isfinite(ref) else np.nan,
                    "paper_ppl": None if p is None else (f"{p[0]:g}" if p[0] == p[1] else f"{p[0]:g}-{p[1]:g}"),
                    "paper_change_pct": None if (p is None or pref is None) else 100.0 * (pmid / (sum(pref) / 2) - 1.0),
                }
            )
    return pd.DataFrame(rows, columns=["scale", "variant", "n_params", "n_params_total", "tokens", "mean_ppl", "std", "n_seeds", "change_vs_reference_pct", "paper_ppl", "paper_change_pct"])


def _run_status(finals: pd.DataFrame, expected) -> dict:
    """Failed, incomplete (running, or finished without final/val_ppl) and missing runs."""

    def row(r, problem):
        return {
            "problem": problem,
            "run_name": r.get("run_name") or "",
            "variant": r.get("variant"),
            "scale": r.get("scale"),
            "seed": None if pd.isna(r.get("seed")) else int(r.get("seed")),
            "extend": float(r.get("extend", 1.0)),
            "detail": r.get("failure_reason") if isinstance(r.get("failure_reason"), str) else "",
        }

    recs = finals.to_dict(orient="records")
    failed = [row(r, "failed") for r in recs if r["status"] == "failed"]
    incomplete = [
        row(r, "incomplete") | {"detail": f"status {r['status']}" + ("" if r["status"] != "finished" else ", no final/val_ppl")}
        for r in recs
        if r["status"] != "failed" and not r["complete"]
    ]
    expected_from = "inferred grid (variants x scales x seeds, reference extend levels)" if expected is None else "plan"
    present = {(r["variant"], r["scale"], None if pd.isna(r["seed"]) else int(r["seed"]), float(r["extend"])) for r in recs}
    if expected is None:
        expected = _inferred_grid(finals)
    else:
        expected = {(e["variant"], e["scale"], int(e["seed"]), float(e.get("extend", 1.0))) for e in expected}
    missing = [
        {"problem": "missing", "run_name": "", "variant": v, "scale": s, "seed": sd, "extend": e, "detail": "planned but no MLflow run"}
        for v, s, sd, e in sorted(expected - present, key=lambda k: (k[1], k[0], k[3], k[2]))
    ]
    table = pd.DataFrame(failed + incomplete + missing, columns=["problem", "run_name", "variant", "scale", "seed", "extend", "detail"])
    return {
        "total": len(recs),
        "finished": int(finals["complete"].sum()),
        "failed": failed,
        "incomplete": incomplete,
        "missing": missing,
        "expected_from": expected_from,
        "table": table,
    }


def _inferred_grid(finals: pd.DataFrame) -> set[tuple]:
    """The plan as the runs present imply it.

    Planned runs (x1): every variant x scale x seed seen at x1. Extend runs: each variant's
    extend levels x every scale x the seeds seen in that variant's extend runs (a study may
    extend only some seeds).
    """
    scales = finals["scale"].dropna().unique()
    ints = lambda s: {int(v) for v in s.dropna()}  # noqa: E731
    x1_seeds = ints(finals.loc[finals["extend"] == 1.0, "seed"])
    grid = set()
    for v, g in finals.groupby("variant"):
        grid |= {(v, s, sd, 1.0) for s in scales for sd in x1_seeds}
        ext = g[g["extend"] != 1.0]
        ext_seeds = ints(ext["seed"])
        for e in set(ext["extend"]):
            grid |= {(v, s, sd, float(e)) for s in scales for sd in ext_seeds}
    return grid


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) or pd.isna(x) else float(x)


def _jsonable(obj):
    """Plain JSON types; NaN/inf become None."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if obj is pd.NA or obj is pd.NaT:
        return None
    return obj
