"""report.md and report.html from one list of sections, so both always say the same thing.

The HTML page is self-contained: figures are embedded as base64 PNG data URIs and the only
style is an inline <style> block, so it opens from an MLflow artifact view or an e-mail.
"""

from __future__ import annotations

import base64
import html as htmlmod
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from orchestrator.report.paper import PAPER_PPL, PAPER_SEED_STD, PAPER_TOKEN_RATIO

CAPTIONS = {
    "ppl_vs_tokens.png": "Validation perplexity vs tokens seen, one panel per scale (seed mean, band = +-1 std; x = final points of the reference's extend runs).",
    "ppl_vs_flops.png": "Validation perplexity vs training FLOPs (3 x forward; README, \"Conventions the numbers depend on\"), one panel per scale.",
    "ppl_vs_wallclock.png": "Validation perplexity vs wall-clock seconds, one panel per scale.",
    "token_ratio.png": "Token ratio per scale with 95% bootstrap interval over seeds; triangles are censored bounds.",
    "scaling.png": "Final perplexity vs N (non-embedding) and vs FLOPs, with fitted L = E + A x^-alpha where a panel says so (a fit needs >= 3 scales); the paper's points on their own panel.",
    "seed_std.png": "Seed standard deviation of final perplexity (paper: coupled 0.04, uncoupled MLP 0.31).",
    "attention.png": "Attention diagnostics over training (seed mean +-1 std).",
}


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None
    figures: list[str] = field(default_factory=list)


def _fmt(x, spec=".2f", none="—"):
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return none
    return format(x, spec)


def _int(x):
    """An exact count with thousands separators (N, tokens): 204800 -> 204,800."""
    return _fmt(x if x is None or pd.isna(x) else int(round(float(x))), ",")


def _pct(x):
    return _fmt(x, "+.2f") + ("%" if x is not None and not pd.isna(x) else "")


def sections(summary: dict, tables: dict[str, pd.DataFrame]) -> list[Section]:
    """The report's content in reading order."""
    runs = summary["runs"]
    ref, tgt = summary["reference"], summary["target"]
    head = f"headline target `{tgt}`" if tgt else "no non-reference variant: no token ratio"
    intro = [
        f"Tracking URI `{summary['tracking_uri']}`, generated {summary['generated_at']}. Reference variant "
        f"`{ref}`, {head}. Runs: {runs['total']} in MLflow, {runs['finished']} finished with a final "
        f"perplexity, {len(runs['failed'])} failed, {len(runs['incomplete'])} incomplete, {len(runs['missing'])} missing."
    ]
    if not runs["finished"]:
        intro.append("There is no finished run to compare: every run failed or is incomplete (listed at the end).")
    out = [Section(f"qkstudy report: {summary['study']}", intro)]
    ft = tables["final_ppl"]
    out.append(
        Section(
            "Final validation perplexity (planned runs, mean over seeds)",
            [
                "N counts non-embedding parameters and tokens are the planned training tokens (README, \"Conventions the numbers "
                "depend on\"). `vs reference` is the change of the seed-mean perplexity against "
                f"`{ref}` at the same scale. Paper numbers (arXiv 2604.01683, WikiText-103) appear where the scale name "
                "matches one of the paper's sizes; other corpora and sizes are not comparable in absolute terms."
            ],
            pd.DataFrame(
                {
                    "scale": ft["scale"],
                    "variant": ft["variant"],
                    "N (non-emb.)": ft["n_params"].map(_int),
                    "N total": ft["n_params_total"].map(_int),
                    "tokens": ft["tokens"].map(_int),
                    "val ppl": [f"{_fmt(m, '.3f')} ± {_fmt(s, '.3f')} (n={n})" for m, s, n in zip(ft["mean_ppl"], ft["std"], ft["n_seeds"])],
                    "vs reference": ft["change_vs_reference_pct"].map(_pct),
                    "paper ppl": ft["paper_ppl"].map(lambda v: v if isinstance(v, str) else "—"),
                    "paper vs reference": ft["paper_change_pct"].map(_pct),
                }
            ),
            ["ppl_vs_tokens.png", "ppl_vs_flops.png", "ppl_vs_wallclock.png"],
        )
    )
    paper = pd.DataFrame(
        [{"scale": s, "variant": v, "WikiText-103 ppl": f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"} for s, d in PAPER_PPL.items() for v, (lo, hi) in d.items()]
    )
    out.append(Section("Paper reference numbers", [f"Compute-matched, the paper's standard model needs {PAPER_TOKEN_RATIO}x the tokens to match coupled."], paper))
    rt = tables["token_ratio"]
    out.append(
        Section(
            "Token ratio at equal perplexity",
            [
                f"Tokens `{ref}` needs to reach each variant's final perplexity, divided by that variant's tokens: monotone "
                "(PCHIP) interpolation of log perplexity vs log tokens across the reference's extend runs, 95% percentile "
                f"interval of a parametric bootstrap over seeds ({summary['n_boot']} draws of each run group's seed mean "
                "from the pooled seed spread). A target outside the extend range is censored and shown "
                "as a bound, never extrapolated: `>B` means the reference's longest run never reached it (B = that run's "
                "tokens / the variant's tokens), `<B` means the reference was already better at x1 (B = the reference's "
                "x1 tokens / the variant's tokens; below 1 when the variant trained on more tokens). The single-run curve estimate reads the reference's longest eval curve instead (labelled: "
                "its intermediate checkpoints are not annealed, so it overstates the tokens needed). FLOP and wall-clock "
                f"ratios compare cost at equal perplexity. Paper: {PAPER_TOKEN_RATIO}x."
            ],
            rt[["scale", "variant", "token_ratio", "interval_95", "single_run_estimate", "flop_ratio", "wall_ratio", "reference_extends", "note"]].rename(
                columns={"interval_95": "95% interval", "single_run_estimate": "single-run curve estimate", "flop_ratio": "FLOP ratio", "wall_ratio": "wall-clock ratio", "reference_extends": "reference runs"}
            ) if len(rt) else None,
            ["token_ratio.png"],
        )
    )
    if not len(rt):  # one variant only: the method text stays, the empty table goes
        out[-1].text.insert(0, f"The study has only `{ref}`: no non-reference variant: no token ratio.")
    fits = summary["scaling"]["fits"]
    fit_rows = []
    for v, d in fits.items():
        for axis in ("N", "flops"):
            f = d.get(axis)
            fit_rows.append(
                {"variant": v, "x": "N (non-emb.)" if axis == "N" else "training FLOPs", "scales": d["n_scales"], "E (nats)": _fmt(f and f["E"], ".4f"), "A": _fmt(f and f["A"], ".4g"), "alpha": _fmt(f and f["alpha"], ".3f"), "x0": _fmt(f and f["x0"], ".3g"), "rmse (nats)": _fmt(f and f["rmse"], ".2g")}
            )
    fade_text = []
    for v, d in summary["scaling"]["fade"].items():
        ci = d.get("ci")
        ci_s = "" if not ci else f" (95% bootstrap interval {_fmt(ci[0], '.3g', '>1e16')} to {_fmt(ci[1], '.3g', '>1e16')})"
        if d["n"] is None:  # no fit, or no crossing below 1e16: the note says which
            fade_text.append(f"`{v}`: {d.get('note') or 'no estimate'}.")
        else:
            fade_text.append(f"`{v}`: advantage over `{ref}` falls below 1% at N ≈ {d['n']:.3g}{ci_s}. {d.get('note') or ''}".strip())
    if not fade_text:
        fade_text = ["None: no non-reference variant to compare."]
    out.append(
        Section(
            "Scaling",
            [
                "L = E + A (x/x0)^-alpha fitted to final val loss (nats/token, = ln perplexity) with scipy curve_fit from "
                "several starting points; fits need at least 3 scales. x0 is the geometric mean of x. Predicted scale where "
                "each variant's perplexity advantage falls below 1% (from the fitted laws; an extrapolation, read with care):",
                *fade_text,
            ],
            pd.DataFrame(fit_rows),
            ["scaling.png"],
        )
    )
    ss = tables["seed_std"]
    out.append(
        Section(
            "Stability over seeds",
            ["Seed standard deviation of final perplexity; paper: " + ", ".join(f"{k} {v}" for k, v in PAPER_SEED_STD.items()) + ". One seed gives no std."],
            pd.DataFrame({"scale": ss["scale"], "variant": ss["variant"], "mean ppl": ss["mean"].map(lambda v: _fmt(v, ".3f")), "seed std": ss["std"].map(lambda v: _fmt(v, ".3f", "— (one seed)")), "seeds": ss["n_seeds"]}),
            ["seed_std.png", "attention.png"],
        )
    )
    ct, at = tables["cost"], tables["attention"].set_index(["scale", "variant"])

    def _pm(m, sd, spec):
        return "—" if m is None or m != m else _fmt(m, spec) + ("" if sd != sd else f" ± {_fmt(sd, spec)}")

    cost_rows = []
    for r in ct.itertuples():
        a = at.loc[(r.scale, r.variant)] if (r.scale, r.variant) in at.index else None
        cost_rows.append({
            "scale": r.scale, "variant": r.variant, "train wall-clock (s)": _fmt(r.wall_s, ".1f"),
            "wall-clock vs reference": _pm(r.wall_ratio, r.wall_ratio_std, ".3f"),
            "time/token vs reference": _pm(r.time_per_token_ratio, r.time_per_token_ratio_std, ".3f"),
            "effective rank": "—" if a is None else _pm(a["effective_rank"], a["effective_rank_std"], ".2f"),
            "attention entropy (nats)": "—" if a is None else _pm(a["entropy"], a["entropy_std"], ".3f"),
            "seeds": int(r.n_pairs),
        })
    out.append(
        Section(
            "Cost and attention at the planned budget",
            [f"Per planned (x1) run, paired by seed with `{ref}`'s run of the same scale: training wall-clock "
             "(seconds of optimizer steps, evals excluded) and its ratio, seconds per token and its ratio (mean ± std "
             "over seeds); in a FLOP-matched study the wall-clock ratio is at equal FLOPs. Effective rank and entropy "
             "of the attention maps at the last eval (model.diagnostics; mean over layers and heads); the paper finds "
             "coupling raises the effective rank."],
            pd.DataFrame(cost_rows) if cost_rows else None,
        )
    )
    issues = tables["issues"]
    out.append(
        Section(
            "Failed, incomplete and missing runs",
            [f"Missing runs are judged against the {runs['expected_from']}." if len(issues) else "None: every expected run finished."],
            issues if len(issues) else None,
        )
    )
    figs = set(summary.get("figures", []))
    for s in out:
        s.figures = [f for f in s.figures if f in figs]
    return out


def markdown(summary: dict, tables: dict[str, pd.DataFrame]) -> str:
    """The report as GitHub-flavoured markdown; figures linked as sibling PNG files."""
    parts = []
    for i, s in enumerate(sections(summary, tables)):
        parts.append(("# " if i == 0 else "## ") + s.title)
        parts += s.text
        if s.table is not None:
            parts.append(s.table.to_markdown(index=False))
        parts += [f"![{CAPTIONS.get(f, f)}]({f})" for f in s.figures]
    return "\n\n".join(parts) + "\n"


def _code(text: str) -> str:
    """Markdown `code` spans -> <code> (the text is already HTML-escaped)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def html(summary: dict, tables: dict[str, pd.DataFrame], fig_dir: Path) -> str:
    """One self-contained HTML page; each figure is read from fig_dir and embedded as base64."""
    esc = htmlmod.escape
    body = []
    for i, s in enumerate(sections(summary, tables)):
        body.append(f"<h{1 if i == 0 else 2}>{esc(s.title)}</h{1 if i == 0 else 2}>")
        body += [f"<p>{_code(esc(t))}</p>" for t in s.text]
        if s.table is not None:
            body.append(s.table.to_html(index=False, na_rep="—", border=0, classes="t"))
        for f in s.figures:
            data = base64.b64encode((Path(fig_dir) / f).read_bytes()).decode("ascii")
            body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{esc(f)}"><figcaption>{esc(CAPTIONS.get(f, f))}</figcaption></figure>')
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;color:#222}"
        "table.t{border-collapse:collapse;font-size:13px;margin:1em 0}table.t td,table.t th{border:1px solid #ccc;padding:3px 8px}"
        "table.t th{background:#f3f3f3}img{max-width:100%}figcaption{font-size:12px;color:#555}"
    )
    title = esc(f"qkstudy report: {summary['study']}")
    return f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title><style>{style}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
