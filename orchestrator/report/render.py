"""report.md and report.html from one list of sections (sections.py), so both always say the same thing.

The HTML page is self-contained: figures are embedded as base64 PNG data URIs and the only
style is an inline <style> block, so it opens from an MLflow artifact view or an e-mail.
"""

from __future__ import annotations

import base64
import html as htmlmod
import re
from pathlib import Path

import pandas as pd

from orchestrator.report import provenance
from orchestrator.report.sections import sections

CAPTIONS = {
    "ppl_vs_tokens.png": "Validation perplexity vs tokens seen, one panel per scale "
    "(seed mean, band = ± 1 std over seeds, not an interval; x = final points of the reference's extend runs).",
    "ppl_vs_flops.png": 'Validation perplexity vs training FLOPs (3 x forward; README, "Conventions the numbers depend on"), '
    "one panel per scale.",
    "ppl_vs_wallclock.png": "Validation perplexity vs wall-clock seconds, one panel per scale.",
    "paired_dloss_vs_tokens.png": "Seed-paired Δ val loss (variant − reference, nats/token) vs the variant's tokens seen, "
    "one panel per scale and corpus: at each eval point of the planned runs the mean over seed pairs with its 95% paired t "
    "interval (the tables' test; no bar with one pair), n = seed pairs. The reference's loss is read at the same step "
    "where it evaluated there, else interpolated linearly in log tokens on its own curve (a FLOP-matched arm's steps), "
    "never extrapolated (paired_curve.csv, column read). Hollow diamond: the verdict table's paired Δ of the final "
    "passes at the planned budget (in a FLOP-matched study the reference's final is at its own token count, so the "
    "diamond can lie off the equal-token curve).",
    "token_ratio.png": "Token ratio per scale with its 95% seed-paired interval; triangles are censored bounds.",
    "scaling.png": "Final perplexity vs N (non-embedding) and vs FLOPs, with fitted L = E + A x^-alpha only where "
    "the Scaling section accepts a fit; the paper's points on their own panel.",
    "seed_std.png": "Seed standard deviation of final perplexity (paper: coupled 0.04, uncoupled MLP 0.31).",
    "attention.png": "Attention diagnostics over training (seed mean, band = ± 1 std over seeds, not an interval).",
}


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


def _links(text: str) -> str:
    """Markdown links to http(s) pages, ``[text](https://...)``, -> <a> (the text is already HTML-escaped)."""
    return re.sub(r"\[([^\[\]]+)\]\((https?://[^\s()<>\"]+)\)", r'<a href="\2">\1</a>', text)


def html(summary: dict, tables: dict[str, pd.DataFrame], fig_dir: Path) -> str:
    """One self-contained HTML page; each figure is read from fig_dir and embedded as base64."""
    esc = htmlmod.escape
    body = []
    for i, s in enumerate(sections(summary, tables)):
        body.append(f"<h{1 if i == 0 else 2}>{esc(s.title)}</h{1 if i == 0 else 2}>")
        body += [f"<p>{_links(_code(esc(t)))}</p>" for t in s.text]
        if s.table is not None:
            body.append(_links(s.table.to_html(index=False, na_rep="—", border=0, classes="t")))
        for f in s.figures:
            data = base64.b64encode((Path(fig_dir) / f).read_bytes()).decode("ascii")
            caption = esc(CAPTIONS.get(f, f))
            body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{esc(f)}"><figcaption>{caption}</figcaption></figure>')
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;color:#222}"
        "table.t{border-collapse:collapse;font-size:13px;margin:1em 0}table.t td,table.t th{border:1px solid #ccc;padding:3px 8px}"
        "table.t th{background:#f3f3f3}img{max-width:100%}figcaption{font-size:12px;color:#555}"
    )
    title = esc(f"qkstudy report: {summary['study']}")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{style}</style></head>\n<body>\n'
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def corpus_index(summary: dict) -> str:
    """The index report.md of a several-corpora study: links and one headline row per (corpus, scale)."""
    corpora, variants = summary["corpora"], _variants(summary)
    lines = [f"# qkstudy report: {summary['study']}", "", "One report per corpus (scales are not pooled across corpora):", ""]
    lines += [f"- [{c}]({c}/report.md) ([html]({c}/report.html))" for c in corpora]
    if "code" in summary:  # which commit(s) the runs came from (provenance.py)
        lines += ["", provenance.code_line(summary["code"])]
    lines += [
        "",
        "Token ratio of each scale's headline variant (`<B`/`>B`: censored at the measured range), "
        "seed-mean final perplexity per variant, and the corpus's unigram perplexity (its validation split under its "
        "tokenizer; `not recorded` in an older store).",
        "",
        "| corpus | scale | variant | token ratio | 95% interval | " + " | ".join(f"{v} ppl" for v in variants) + " | unigram ppl |",
        "|---|---|---|---|---|" + "---|" * len(variants) + "---|",
    ]
    for s_ in summary["scales"]:
        head = s_.get("ratios", {}).get(s_.get("target")) or {}
        ppl = " | ".join(f"{s_['final_ppl'][v]:.2f}" if v in s_.get("final_ppl", {}) else "-" for v in variants)
        lines.append(
            f"| {s_['corpus']} | {s_['scale']} | {s_.get('target') or '-'} | {s_.get('token_ratio_display', 'n/a')} "
            f"| {head.get('interval_display', 'n/a')} | {ppl} | {_unigram(s_.get('unigram_ppl'))} |"
        )
    return "\n".join(lines) + "\n"


def _unigram(ppl: float | None) -> str:
    return "not recorded" if ppl is None else f"{ppl:.2f}"


def _variants(summary: dict) -> list[str]:
    seen: list[str] = []
    for s_ in summary["scales"]:
        seen += [v for v in s_.get("final_ppl", {}) if v not in seen]
    return seen
