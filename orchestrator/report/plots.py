"""The report's PNG figures (matplotlib, Agg backend; no display needed).

Each function draws one figure from already-aggregated tables, saves it to `path` and returns
the path, or None when there is nothing to draw. Colours are fixed per variant so every
figure of one report reads the same way.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from orchestrator.report.stats.paper import PAPER_NOMINAL_N, PAPER_PPL, PAPER_SEED_STD, PAPER_TOKEN_RATIO, paper_variant  # noqa: E402
from orchestrator.report.stats.recall import THRESHOLDS  # noqa: E402

DPI = 110


def colors(variants: list[str]) -> dict[str, str]:
    """A stable colour per variant (tab10 order)."""
    cycle = _cycle("tab10")
    return {v: matplotlib.colors.to_hex(cycle[i % len(cycle)]) for i, v in enumerate(variants)}


def _cycle(name: str) -> list:
    """The colours of a qualitative colormap, in order."""
    cmap = plt.get_cmap(name)
    return [cmap(i) for i in range(cmap.N)]


def _panels(n: int, width: float = 4.2, height: float = 3.4, rows: int = 1):
    """A rows x n grid; constrained layout sizes the margins to the labels so none overlap."""
    cols = max(n, 1)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    return fig, axes


# Tick positions per decade, coarsest first; _log_ticks picks the first giving >= 3 ticks.
_SUBS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0))
_MAX_TICKS = 6


def _log_ticks(axis, eng: bool = True) -> None:
    """Few, short, labelled ticks on a log axis; no minor tick labels.

    Matplotlib's default labels minor ticks when the axis spans under ~1 decade, and their
    sci-notation labels ("3x10^4 4x10^4 6x10^4") run into each other. Here: major ticks at
    1-2-5 (or 1..8) x 10^k chosen for the current limits, at most _MAX_TICKS, labelled with
    SI prefixes (2M, 500k; eng=True, for counts) or plain numbers (perplexity), none closer than
    1/(_MAX_TICKS + 1) of the axis span in log. Call after the data is drawn (uses the limits then).
    """
    lo, hi = sorted(axis.get_view_interval())
    if not (lo > 0 and np.isfinite(hi)):
        return
    ticks: list[float] = []
    for subs in _SUBS:
        ticks = [t for t in ticker.LogLocator(base=10, subs=subs).tick_values(lo, hi) if lo <= t <= hi]
        if len(ticks) >= 3:
            break
    if len(ticks) < 2:  # a sliver of a decade: evenly spaced round values
        ticks = [t for t in ticker.MaxNLocator(nbins=3).tick_values(lo, hi) if lo <= t <= hi and t > 0]
    ticks = _spaced(ticks[:: -(-len(ticks) // _MAX_TICKS)], np.log10(hi / lo) / (_MAX_TICKS + 1))
    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.EngFormatter(sep="") if eng else ticker.FuncFormatter(lambda v, _: f"{v:.4g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def _spaced(ticks: list[float], gap: float) -> list[float]:
    """The ticks, left to right, less any closer than `gap` decades to the last one kept (1-8 x 10^k
    ticks crowd at the top of a decade: 500M and 600M labels touch on a narrow panel)."""
    kept: list[float] = []
    for t in ticks:
        if not kept or np.log10(t / kept[-1]) >= gap:
            kept.append(t)
    return kept


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


XLABEL = {"step": "tokens seen", "flops": "training FLOPs", "wall_s": "wall-clock (s)"}
STD_BAND = "band: ± 1 std over seeds"  # a spread of 2-3 seeds, not an interval: the legend says so
DIAGNOSTIC_LABEL = {
    "attn/effective_rank": "effective rank",
    "attn/entropy": "attention entropy (nats)",
    "attn/spectral_gap": "spectral gap",
}


def _positive(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    """Rows whose `cols` are finite and > 0: what a log axis can show (a partial store has NaN)."""
    ok = np.ones(len(df), bool)
    for c in cols:
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        ok &= np.isfinite(v) & (v > 0)
    return df[ok]


def _log_axes(ax, drawn: bool, what: str) -> bool:
    """Log-log axes with few ticks where something was drawn; else a note in the empty panel."""
    if not drawn:
        ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, fontsize=8, color="grey")
        ax.set_xticks([])
        ax.set_yticks([])
        return False
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_ticks(ax.xaxis)
    _log_ticks(ax.yaxis, eng=False)
    return True


def ppl_curves(
    curves: pd.DataFrame, finals: pd.DataFrame, scales: list[str], cmap: dict[str, str], reference: str, x: str, path: Path
) -> Path | None:
    """Val perplexity vs x ("step" = tokens, "flops" or "wall_s"), one panel per scale.

    Lines: seed mean of each variant's planned (x1) run, band = +-1 seed std (labelled so); dotted: the
    reference's extend runs. Markers: final perplexity of the reference's extend runs (the
    points the token ratio interpolates). Points without a positive x (no flops_per_token, no
    time/wall_s) are left out; None when no panel has any.
    """
    curves = _positive(curves, x, "mean")
    if curves.empty:
        return None
    fig, axes = _panels(len(scales))
    fx = {"step": "tokens", "flops": "final_flops", "wall_s": "final_wall_s"}[x]
    for ax, scale in zip(axes[0], scales):
        c = curves[curves["scale"] == scale]
        for variant, g in c[c["extend"] == 1.0].groupby("variant", sort=False):
            g = g.sort_values("step")
            xs, m, s = g[x].to_numpy(float), g["mean"].to_numpy(float), g["std"].fillna(0.0).to_numpy(float)
            ax.plot(xs, m, color=cmap[variant], label=variant, lw=1.5)
            ax.fill_between(xs, m - s, m + s, color=cmap[variant], alpha=0.2, lw=0)
        for _, g in c[(c["variant"] == reference) & (c["extend"] != 1.0)].groupby("extend"):
            g = g.sort_values("step")
            ax.plot(g[x], g["mean"], color=cmap[reference], lw=0.8, ls=":", alpha=0.7)
        f = _positive(finals[(finals["scale"] == scale) & (finals["variant"] == reference) & finals["complete"]], fx, "final_ppl")
        pts = f.groupby("extend")[[fx, "final_ppl"]].mean()
        if len(pts):
            ax.plot(pts[fx], pts["final_ppl"], "kx", ms=7, label=f"{reference} extend finals")
        if _log_axes(ax, not c.empty, f"val/ppl vs {XLABEL[x]}"):
            ax.fill_between([], [], [], color="grey", alpha=0.2, lw=0, label=STD_BAND)
            ax.legend(fontsize=7)
        ax.set_title(f"scale {scale}: val perplexity, seed mean", fontsize=10)
        ax.set_xlabel(XLABEL[x])
        ax.set_ylabel("val perplexity")
        ax.grid(True, which="major", alpha=0.3)
    return _save(fig, path)


def accuracy_curves(curves: pd.DataFrame, scales: list[str], cmap: dict[str, str], path: Path) -> Path | None:
    """MQAR val accuracy vs tokens seen, one panel per scale: seed mean of each variant's planned
    (x1) run, band = +-1 seed std, dashed lines at the accuracies the report reads crossings at
    (recall.THRESHOLDS). None when no run logged accuracy."""
    curves = curves[curves["extend"] == 1.0]
    if curves.empty:
        return None
    fig, axes = _panels(len(scales))
    for ax, scale in zip(axes[0], scales):
        for variant, g in curves[curves["scale"] == scale].groupby("variant", sort=False):
            g = g.sort_values("step")
            xs, m, s = g["step"].to_numpy(float), g["mean"].to_numpy(float), g["std"].fillna(0.0).to_numpy(float)
            ax.plot(xs, m, color=cmap[variant], label=variant, lw=1.5)
            ax.fill_between(xs, m - s, m + s, color=cmap[variant], alpha=0.2, lw=0)
        for th in THRESHOLDS:
            ax.axhline(th, color="grey", lw=0.7, ls="--")
        ax.fill_between([], [], [], color="grey", alpha=0.2, lw=0, label=STD_BAND)
        ax.legend(fontsize=7)
        ax.set_ylim(0, 1)
        ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
        ax.set_title(f"scale {scale}: MQAR val accuracy, seed mean", fontsize=10)
        ax.set_xlabel(XLABEL["step"])
        ax.set_ylabel("val accuracy")
        ax.grid(True, which="major", alpha=0.3)
    return _save(fig, path)


def token_ratios(ratios: list[dict], scales: list[str], cmap: dict[str, str], path: Path) -> Path | None:
    """Token ratio per scale and variant with its bootstrap interval; censored ones as arrows."""
    rows = [r for r in ratios if r["token_ratio"]["value"] is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
    variants = sorted({r["variant"] for r in rows})
    for j, variant in enumerate(variants):
        for r in (r for r in rows if r["variant"] == variant):
            xi = scales.index(r["scale"]) + (j - (len(variants) - 1) / 2) * 0.15
            v = r["token_ratio"]["value"]
            if r["token_ratio"]["censored"]:
                up = r["token_ratio"]["direction"] == ">"
                ax.plot([xi], [v], marker="^" if up else "v", color=cmap[variant], ms=9, ls="none")
            else:
                lo, hi = r["ci_low"], r["ci_high"]
                yerr = None if lo is None else [[v - lo], [hi - v]]
                ax.errorbar([xi], [v], yerr=yerr, fmt="o", color=cmap[variant], capsize=3)
        ax.plot([], [], "o", color=cmap[variant], label=variant)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(PAPER_TOKEN_RATIO, color="grey", lw=0.8, ls="--", label=f"paper {PAPER_TOKEN_RATIO}x")
    ax.set_xticks(range(len(scales)), scales)
    ax.set_xlabel("scale")
    ax.set_ylabel("reference tokens / variant tokens\nat equal perplexity")
    ax.set_title("token ratio, bars: 95% interval (triangles: censored bound)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def scaling(finals: pd.DataFrame, analysis: dict, cmap: dict[str, str], path: Path) -> Path | None:
    """Final perplexity vs N (non-embedding) and vs FLOPs, with the fitted laws the analysis
    accepted (scaling.py; titles say "fits" only where one is drawn); paper points beside."""
    f = finals[(finals["extend"] == 1.0) & finals["complete"]]
    if f.empty:
        return None
    fig, axes = _panels(3, width=4.6)
    for ax, xcol, key, label in (
        (axes[0][0], "n_params", "N", "N (non-embedding parameters)"),
        (axes[0][1], "final_flops", "flops", "training FLOPs"),
    ):
        drawn = _scaling_panel(ax, _positive(f, xcol, "final_ppl"), xcol, key, analysis, cmap)
        ax.set_xlabel(label)
        ax.set_ylabel("final val perplexity")
        ax.set_title("this study: L = E + A x^-alpha fits" if drawn else "this study: final perplexity vs size")
        ax.grid(True, which="major", alpha=0.3)
    _paper_panel(axes[0][2], cmap)
    return _save(fig, path)


def _scaling_panel(ax, f: pd.DataFrame, xcol: str, key: str, analysis: dict, cmap: dict[str, str]) -> bool:
    """Seed-mean points per variant (error bars: +-1 std over seeds) and the accepted fits with
    their 95% prediction interval of the seed mean at the measured scales; True when a fit was drawn."""
    from orchestrator.report.stats.scaling import PowerLawFit

    drawn = False
    for variant, g in f.groupby("variant"):
        p = g.groupby("scale")[[xcol, "final_ppl"]].agg(["mean", "std"])
        ax.errorbar(
            p[(xcol, "mean")],
            p[("final_ppl", "mean")],
            yerr=p[("final_ppl", "std")].fillna(0),
            fmt="o",
            color=cmap[variant],
            label=f"{variant} (seed mean ± 1 std)",
            capsize=2,
        )
        fit = analysis["fits"].get(variant, {}).get(key, {}).get("fit")
        if fit:
            drawn = True
            law = PowerLawFit(**fit)
            xs = np.logspace(np.log10(g[xcol].min() / 2), np.log10(g[xcol].max() * 4), 100)
            ax.plot(xs, law.ppl(xs), color=cmap[variant], lw=1, label=f"fit a={law.alpha:.2f}")
        pred = [q for q in analysis["fits"].get(variant, {}).get(key, {}).get("prediction") or [] if q["low"] is not None]
        if pred:
            ax.fill_between(
                [q["n_params"] for q in pred], np.exp([q["low"] for q in pred]), np.exp([q["high"] for q in pred]),
                color=cmap[variant], alpha=0.15, lw=0, label=f"{variant}: 95% prediction interval",
            )  # fmt: skip
    if _log_axes(ax, not f.empty, "runs with this size logged"):
        ax.legend(fontsize=6)
    return drawn


def _paper_panel(ax, cmap: dict[str, str]) -> None:
    pvars = sorted({v for d in PAPER_PPL.values() for v in d})
    pmap = {v: matplotlib.colors.to_hex(c) for v, c in zip(pvars, _cycle("Dark2"))}
    for variant in pvars:
        cv = next((c for v, c in cmap.items() if paper_variant(v) == variant), pmap[variant])
        pts = [(PAPER_NOMINAL_N[s], sum(d[variant]) / 2) for s, d in PAPER_PPL.items() if variant in d]
        xs, ys = zip(*pts)
        ax.plot(xs, ys, "s--", color=cv, label=variant, lw=1)
    ax.set_xscale("log")
    _log_ticks(ax.xaxis)
    ax.set_xlabel("nominal model size (paper)")
    ax.set_ylabel("WikiText-103 val perplexity")
    ax.set_title("paper reference (arXiv 2604.01683)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=6)


def seed_spread(std: pd.DataFrame, scales: list[str], cmap: dict[str, str], path: Path) -> Path | None:
    """Seed std of final perplexity per variant and scale, with the paper's 0.04 / 0.31 lines."""
    s = std.dropna(subset=["std"])
    if s.empty:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
    variants = list(dict.fromkeys(s["variant"]))
    width = 0.8 / len(variants)
    for j, variant in enumerate(variants):
        g = s[s["variant"] == variant]
        xs = [scales.index(sc) + (j - (len(variants) - 1) / 2) * width for sc in g["scale"]]
        ax.bar(xs, g["std"], width=width, color=cmap[variant], label=variant)
    for variant, val in PAPER_SEED_STD.items():
        ax.axhline(val, ls="--", lw=0.8, color="grey")
        ax.text(len(scales) - 0.5, val, f"paper {variant} {val}", fontsize=6, va="bottom", ha="right")
    ax.set_xticks(range(len(scales)), scales)
    ax.set_ylabel("seed std of final val perplexity")
    ax.set_title("stability over seeds")
    ax.legend(fontsize=7)
    return _save(fig, path)


def attention(diag: dict[str, pd.DataFrame], scales: list[str], cmap: dict[str, str], path: Path) -> Path | None:
    """Attention diagnostics (one row per metric) over training tokens, one column per scale:
    seed mean per variant, band = +-1 std over seeds (labelled so in each legend)."""
    diag = {k: v for k, v in diag.items() if not v.empty}
    if not diag:
        return None
    fig, axes = _panels(len(scales), height=3.0, rows=len(diag))
    for row, (key, c) in enumerate(diag.items()):
        for ax, scale in zip(axes[row], scales):
            cs = _positive(c[(c["scale"] == scale) & (c["extend"] == 1.0)], "step")
            for variant, g in cs.groupby("variant", sort=False):
                g = g.sort_values("step")
                ax.plot(g["step"], g["mean"], color=cmap[variant], label=variant)
                ax.fill_between(
                    g["step"], g["mean"] - g["std"].fillna(0), g["mean"] + g["std"].fillna(0), color=cmap[variant], alpha=0.2, lw=0
                )
            ax.set_title(f"{key}, scale {scale}: seed mean", fontsize=9)
            if cs.empty:
                ax.text(0.5, 0.5, f"no {key}", ha="center", va="center", transform=ax.transAxes, fontsize=8, color="grey")
                continue
            ax.set_xscale("log")
            _log_ticks(ax.xaxis)
            ax.set_xlabel("tokens seen")
            ax.set_ylabel(DIAGNOSTIC_LABEL.get(key, key))
            ax.grid(True, alpha=0.3)
            ax.fill_between([], [], [], color="grey", alpha=0.2, lw=0, label=STD_BAND)
            ax.legend(fontsize=6)
    return _save(fig, path)


def paired_dloss(data: pd.DataFrame, cmap: dict[str, str], reference: str, path: Path) -> Path | None:
    """Seed-paired Δ val loss (variant - reference, nats/token) vs the variant's tokens seen, one
    panel per (scale, corpus), from paired_curve.paired_curves rows.

    Points joined by a line: the eval points, bars = their 95% paired t interval (none where
    one seed pairs); hollow diamond: the final passes at the planned budget, the verdict table's
    paired Δ and interval (in a FLOP-matched study the reference's final is at its own tokens).
    Variants sit a little apart in x (±2% of tokens per step) so their bars do not hide each
    other. Each panel names its seed pairs n per variant (a point with fewer pairs than its
    variant's most carries its own n); one legend under the panels. None when there is no row.
    """
    if data.empty:
        return None
    panels = list(dict.fromkeys(zip(data["scale"], data["corpus"])))
    variants = list(dict.fromkeys(data["variant"]))
    fig, axes = _panels(len(panels), width=4.6, height=3.6)
    for ax, (scale, corpus) in zip(axes[0], panels):
        p = data[(data["scale"] == scale) & (data["corpus"] == corpus)]
        counts = [
            _dloss_points(ax, g, cmap[v], 1.02 ** (variants.index(v) - (len(variants) - 1) / 2))
            for v, g in p.groupby("variant", sort=False)
        ]
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        _log_ticks(ax.xaxis)
        ax.set_xlabel("tokens seen (variant's run)")
        ax.set_ylabel("Δ val loss (nats/token)\nvariant − reference, < 0: variant better")
        ax.set_title(f"scale {scale}" + (f", corpus {corpus}" if corpus else "") + ": seed-paired Δ loss", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ns = dict(zip(p.groupby("variant", sort=False).groups, counts))
        text = f"n = {counts[0]} seed pairs" if len(set(counts)) == 1 else "seed pairs: " + ", ".join(f"{v} {n}" for v, n in ns.items())
        ax.text(0.02, 0.98, text, transform=ax.transAxes, fontsize=7, va="top", ha="left", bbox={"fc": "white", "ec": "none", "alpha": 0.8})
    one = int(data["n_pairs"].max()) < 2
    handles = [Line2D([], [], color=cmap[v], marker="o", ms=3, lw=1, label=f"{v} − {reference}") for v in variants]
    handles.append(Line2D([], [], color="k", marker="D", mfc="none", ls="none", label="final pass at the planned budget (verdict table)"))
    bars = "bars: none (one seed pair: no interval)" if one else "bars: 95% paired t interval over seed pairs"
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), fontsize=7, title=bars, title_fontsize=7)
    return _save(fig, path)


def _dloss_points(ax, g: pd.DataFrame, color: str, dodge: float) -> str:
    """One variant's eval points (line, interval bars, low-n labels) and its final-pass point, at
    tokens x `dodge`; returns its seed pairs n ("3", or "2-3" when the points differ)."""

    def err(r: pd.DataFrame) -> np.ndarray:
        d = r["dloss"].to_numpy(float)
        return np.nan_to_num(np.vstack([d - r["low"].to_numpy(float), r["high"].to_numpy(float) - d]), nan=0.0)

    e, fin = g[g["point"] == "eval"].sort_values("tokens"), g[g["point"] == "final"]
    lo, hi = int(g["n_pairs"].min()), int(g["n_pairs"].max())
    ax.errorbar(e["tokens"] * dodge, e["dloss"], yerr=err(e), fmt="o-", ms=3, lw=1, capsize=2, color=color)
    for r in e[e["n_pairs"] < hi].itertuples():
        ax.annotate(
            f"n={r.n_pairs}", (r.tokens * dodge, r.dloss), textcoords="offset points", xytext=(0, 6), fontsize=6, ha="center", color=color
        )
    ax.errorbar(fin["tokens"] * dodge, fin["dloss"], yerr=err(fin), fmt="D", mfc="none", ms=6, capsize=3, color=color)
    return str(hi) if lo == hi else f"{lo}-{hi}"
