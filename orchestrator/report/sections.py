"""The report's content in reading order, as a list of sections (title, text, table, figures).

render.py turns the same list into markdown and HTML, so both always say the same thing.
One function per core section (``CORE``); the optional parts (``report.parts``) draw their
own, each placed after the section its ``Part.after`` names. Every section reads only the
summary and the tables build.py made.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from orchestrator.report import provenance, run_links
from orchestrator.report.parts import PARTS, Part
from orchestrator.report.parts.base import Section
from orchestrator.report.stats import recall
from orchestrator.report.stats.interval import COVERAGE
from orchestrator.report.stats.paper import PAPER_PPL, PAPER_SEED_STD, PAPER_TOKEN_RATIO
from orchestrator.report.stats.scaling import CROSSOVER_LIMIT, PI_COVERAGE, SPARE_SCALES

CONVENTIONS = 'README, "Conventions the numbers depend on"'


def fmt(x, spec=".2f", none="—"):
    """x formatted with spec; `none` for None or NaN."""
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return none
    return format(x, spec)


def _int(x):
    """An exact count with thousands separators (N, tokens): 204800 -> 204,800."""
    return fmt(x if x is None or pd.isna(x) else int(round(float(x))), ",")


def _pct(x):
    return fmt(x, "+.2f") + ("%" if x is not None and not pd.isna(x) else "")


def _ci(mid, lo, hi, spec=".3f", unit=""):
    """'mid [lo, hi]' with a unit after each number; '—' without mid, no bracket without ends."""
    if mid is None or pd.isna(mid):
        return "—"
    out = fmt(mid, spec) + unit
    return out if lo is None or pd.isna(lo) else f"{out} [{fmt(lo, spec)}{unit}, {fmt(hi, spec)}{unit}]"


def _pm(m, sd, spec):
    return "—" if m is None or m != m else fmt(m, spec) + ("" if sd != sd else f" ± {fmt(sd, spec)}")


def intro(summary: dict) -> Section:
    runs, ref, tgt = summary["runs"], summary["reference"], summary["target"]
    head = f"headline target `{tgt}`" if tgt else "no non-reference variant: no token ratio"
    text = [
        f"Tracking URI `{summary['tracking_uri']}`, generated {summary['generated_at']}. Reference variant "
        f"`{ref}`, {head}. Runs: {runs['total']} in MLflow, {runs['finished']} finished with a final "
        f"perplexity, {len(runs['failed'])} failed, {len(runs['incomplete'])} incomplete, {len(runs['missing'])} missing."
    ]
    if "code" in summary:  # which commit(s) the runs came from (provenance.py)
        text.append(provenance.code_line(summary["code"]))
    if not runs["finished"]:
        text.append("There is no finished run to compare: every run failed or is incomplete (listed at the end).")
    if summary.get("gaps"):
        text.append(
            f'The store lacks some inputs ({len(summary["gaps"])} listed under "Missing inputs" at the end); '
            "everything below is what the rest supports."
        )
    return Section(f"qkstudy report: {summary['study']}", text)


def final_ppl(summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
    ft, ref = tables["final_ppl"], summary["reference"]
    text = [
        f"N counts non-embedding parameters and tokens are the planned training tokens ({CONVENTIONS}). `vs reference` "
        f"is the change of the seed-mean perplexity against `{ref}` at the same scale; `paired vs reference` is the "
        "geometric-mean change over seeds paired with the reference's run of the same seed, with its 95% t interval "
        "(next section). Paper numbers (arXiv 2604.01683, WikiText-103) appear where the scale name matches one of the "
        "paper's sizes; other corpora and sizes are not comparable in absolute terms."
    ]
    table = pd.DataFrame(
        {
            "scale": ft["scale"],
            "variant": ft["variant"],
            "N (non-emb.)": ft["n_params"].map(_int),
            "N total": ft["n_params_total"].map(_int),
            "tokens": ft["tokens"].map(_int),
            "val ppl": [f"{fmt(m, '.3f')} ± {fmt(s, '.3f')} (n={n})" for m, s, n in zip(ft["mean_ppl"], ft["std"], ft["n_seeds"])],
            "vs reference": ft["change_vs_reference_pct"].map(_pct),
            "paired vs reference": [
                _ci(m, lo, hi, "+.1f", "%") for m, lo, hi in zip(ft["paired_change_pct"], ft["paired_change_low"], ft["paired_change_high"])
            ],
            "paper ppl": ft["paper_ppl"].map(lambda v: v if isinstance(v, str) else "—"),
            "paper vs reference": ft["paper_change_pct"].map(_pct),
        }
    )
    return Section(
        "Final validation perplexity (planned runs, mean over seeds)",
        text,
        table,
        ["ppl_vs_tokens.png", "ppl_vs_flops.png", "ppl_vs_wallclock.png"],
    )


def paired(summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
    pt, ref = tables["paired"], summary["reference"]
    text = [
        f"Runs of one seed share the data order and the initial weights of every shared parameter, so each "
        f"variant is compared with `{ref}`'s run of the same seed: Δ = variant − reference final loss (nats/token, "
        "= ln perplexity) per seed; mean, 95% paired t interval, two-sided p-value, the smallest |Δ| these seeds "
        "detect with 80% power and the seed pairs that would detect the observed Δ with 80% power (noncentral t; "
        "post hoc, so a resolution, not evidence). Beside it the unpaired difference of seed means with Welch's 95% "
        "interval. `better`/`worse`: the paired interval excludes 0."
    ]
    if not len(pt):
        return Section("Seed-paired differences", [*text, "None: no non-reference variant with a finished run."])
    table = pd.DataFrame(
        {
            "scale": pt["scale"],
            "variant": pt["variant"],
            "seed pairs": pt["n_pairs"],
            "paired Δ loss (nats)": [_ci(m, lo, hi, "+.3f") for m, lo, hi in zip(pt["paired_dloss"], pt["paired_low"], pt["paired_high"])],
            "p": pt["p_value"].map(lambda p: fmt(p, ".3f")),
            "p (Holm)": pt["p_holm"].map(lambda p: fmt(p, ".3f")),
            "detectable |Δ|": pt["detectable"].map(lambda d: fmt(d, ".3f")),
            "seeds to detect Δ": pt["seeds_needed"].map(lambda n: "—" if n is None or pd.isna(n) else _int(n)),
            "unpaired Δ loss (nats)": [
                _ci(m, lo, hi, "+.3f") for m, lo, hi in zip(pt["unpaired_dloss"], pt["unpaired_low"], pt["unpaired_high"])
            ],
            "verdict": pt["verdict"].map(lambda v: v if isinstance(v, str) else "—"),
            "note": pt["note"].fillna(""),
        }
    )
    return Section("Seed-paired differences", text, table, ["paired_dloss_vs_tokens.png"])


CURRENCY_NAMES = {"tokens": "equal tokens", "flops": "equal model FLOPs", "wall_s": "equal wall-clock"}


def every_currency(summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
    ct, dec, matched = tables["contrasts"], tables["decomposition"], summary.get("budget_currency")
    budget = (
        f"The study's budget matched {CURRENCY_NAMES[matched]} (read from the runs: every arm spent its seed's reference "
        "run's budget in that currency within 1%)."
        if matched
        else "The study's budget matched no single currency within 1% (read from the runs)."
    )
    text = [
        f"{budget} Each contrast is compared at equal tokens, equal model FLOPs and equal wall-clock (the runs' own seconds "
        "of optimizer steps on the study's hardware), paired by seed: at the budget both runs of a seed reached, the arm "
        "that spent more is read earlier on its own eval curve (interpolated, never extrapolated, anchored on its final "
        "pass; `read` says where). Δ = variant − against (nats/token), 95% paired t interval, p raw and Holm-adjusted "
        "over every test this report prints. The decomposition splits the equal-FLOP (and equal-wall-clock) Δ into quality "
        "per token (the equal-token Δ) and cost per token (the rest: the tokens the arm's extra cost per token took away)."
    ]
    if not len(ct):
        return Section("Verdicts in every currency", [*text, "None: no contrast has runs of both arms."])
    table = pd.DataFrame(
        {
            "scale": ct["scale"],
            "variant": ct["variant"],
            "against": ct["against"],
            "currency": [CURRENCY_NAMES[c] + (" (budget)" if m else "") for c, m in zip(ct["currency"], ct["matched"])],
            "seed pairs": ct["n_pairs"],
            "Δ loss (nats)": [_ci(m, lo, hi, "+.4f") for m, lo, hi in zip(ct["paired_dloss"], ct["paired_low"], ct["paired_high"])],
            "p": ct["p_value"].map(lambda p: fmt(p, ".3f")),
            "p (Holm)": ct["p_holm"].map(lambda p: fmt(p, ".3f")),
            "verdict": ct["verdict"],
            "read": ct["read"],
            "note": ct["note"].fillna(""),
        }
    )
    for r in dec.itertuples():
        if pd.notna(r.dloss_flops) and pd.notna(r.dloss_tokens):
            text.append(
                f"`{r.variant}` vs `{r.against}` at {r.scale}: {fmt(r.cost_ratio_flops, '.4f')}x the FLOPs per token; at equal "
                f"FLOPs Δ {fmt(r.dloss_flops, '+.4f')} nats = quality per token {fmt(r.dloss_tokens, '+.4f')} + cost per token "
                f"{fmt(r.cost_part_flops, '+.4f')}"
                + (
                    f"; at equal wall-clock Δ {fmt(r.dloss_wall_s, '+.4f')} (cost per token {fmt(r.cost_part_wall_s, '+.4f')})."
                    if pd.notna(r.dloss_wall_s)
                    else "."
                )
            )
    return Section("Verdicts in every currency", text, table)


def paper_claims(tables: dict[str, pd.DataFrame]) -> Section:
    cl = tables["claims"]
    text = [
        "Each paper claim is decided by its interval: *reproduces* when the interval lies on the paper's side of the null "
        "(0 for a loss difference, 1 for a ratio) and excludes it; *contradicts* when it excludes the paper's value (a "
        "claim without a value: when it lies on the other side of the null); *cannot tell* otherwise. Loss differences "
        "are paired t intervals (nats; the paper's perplexity ratio as its log); the seed-std claim is a variance-ratio F "
        "interval; an interval end marked ∞ is open. On MQAR the paper's perplexity numbers do not apply: its recall "
        "claim is coupled's final accuracy (a t interval over seeds) against 99%, and its sample efficiency the seed-paired "
        "token ratio at 90% accuracy (a t interval on the log ratios; a bound gives no verdict)."
    ]
    if not len(cl):
        return Section("Paper claims decided by intervals", [*text, "None: the study has no variant pair the paper's claims name."])

    def num(x):
        return "∞" if x == float("inf") else "-∞" if x == float("-inf") else fmt(x, ".4g")

    table = pd.DataFrame(
        {
            "claim": cl["claim"],
            "scale": cl["scale"],
            "test": cl["test"],
            "estimate [95% interval]": [f"{num(e)} [{num(lo)}, {num(hi)}]" for e, lo, hi in zip(cl["estimate"], cl["low"], cl["high"])],
            "paper": cl["paper_value"].map(lambda v: "direction only" if v is None or pd.isna(v) else num(v)),
            "p": cl["p_value"].map(lambda p: fmt(p, ".3f")),
            "p (Holm)": cl["p_holm"].map(lambda p: fmt(p, ".3f")),
            "decision": cl["decision"],
            "note": cl["note"].fillna(""),
        }
    )
    return Section("Paper claims decided by intervals", text, table)


def paper() -> Section:
    table = pd.DataFrame(
        [
            {"scale": s, "variant": v, "WikiText-103 ppl": f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"}
            for s, d in PAPER_PPL.items()
            for v, (lo, hi) in d.items()
        ]
    )
    return Section(
        "Paper reference numbers",
        [f"Compute-matched, the paper's standard model needs {PAPER_TOKEN_RATIO}x the tokens to match coupled."],
        table,
    )


def _coverage_text() -> str:
    inside = [v for (_, _, truth), v in COVERAGE.items() if truth <= 3.0]
    return (
        f" Its measured coverage on synthetic studies with a known ratio inside the extend range (3 and 5 seeds, seed "
        f"noise 0.03 to 0.1 nats): {min(inside):.1%} to {max(inside):.1%} (tests/orchestrator/report/test_coverage.py)."
    )


def token_ratio(summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
    ref, rt = summary["reference"], tables["token_ratio"]
    text = [
        f"Tokens `{ref}` needs to reach each variant's final perplexity, divided by that variant's tokens: monotone "
        "(PCHIP) interpolation of log perplexity vs log tokens across the reference's extend runs. The 95% interval is the "
        "set of token counts where a seed-paired t-test (each seed's variant run against the same seed's reference "
        "curve) does not reject equal loss, its standard error taken at the estimate; unpaired (Welch) where the seeds "
        f"do not pair, as the method column says.{_coverage_text()} A target outside the extend range is censored and "
        "shown as a bound, never extrapolated: `>B` means the reference's longest run never reached it (B = that run's "
        "tokens / the variant's tokens), `<B` means the reference was already better at x1 (B = the reference's x1 "
        "tokens / the variant's tokens; below 1 when the variant trained on more tokens); an interval end with a mark "
        "continues beyond the measured range. The single-run curve estimate reads the reference's longest eval curve "
        "instead, at points before its learning rate has decayed; `curve vs extend` flags a row where it lies on the "
        "other side of 1x or outside the interval. FLOP and wall-clock ratios compare cost at equal perplexity. "
        f"Paper: {PAPER_TOKEN_RATIO}x."
    ]
    if not len(rt):  # one variant only: the method text stays, the empty table goes
        return Section(
            "Token ratio at equal perplexity",
            [f"The study has only `{ref}`: no non-reference variant: no token ratio.", *text],
            None,
            ["token_ratio.png"],
        )
    cols = {
        "token_ratio": "token ratio",
        "interval_95": "95% interval",
        "interval_method": "interval method",
        "single_run_estimate": "single-run curve estimate",
        "single_run_flag": "curve vs extend",
        "flop_ratio": "FLOP ratio",
        "wall_ratio": "wall-clock ratio",
        "reference_extends": "reference runs",
        "note": "note",
    }
    table = rt[["scale", "variant", *cols]].rename(columns=cols)
    # "agrees" only where both estimates exist: a row with either n/a has nothing to agree on
    both = (rt["single_run_estimate"] != "n/a") & (rt["token_ratio"] != "n/a")
    table["curve vs extend"] = [
        (f"disagrees: {f}" if f else "agrees") if ok else "—" for f, ok in zip(table["curve vs extend"].fillna(""), both)
    ]
    return Section("Token ratio at equal perplexity", text, table, ["token_ratio.png"])


def accuracy(tables: dict[str, pd.DataFrame]) -> Section:
    at = tables["accuracy"]
    table = pd.DataFrame(
        {
            "scale": at["scale"],
            "variant": at["variant"],
            # percent with two decimals: near 100% a fraction's three decimals hide 99.96 vs 99.88
            "accuracy (%)": [_pm(100 * m, 100 * s, ".2f") for m, s in zip(at["mean"], at["std"])],
            "seeds": at["n_seeds"],
        }
    )
    text = [
        "Final `final/val_accuracy` of the planned runs: the percentage of labelled (query) positions "
        "whose argmax prediction is the target, mean ± std over seeds (the paper: perfect on "
        "easy and medium settings)."
    ]
    if recall.CROSSINGS in tables:
        table = _with_crossings(table, tables[recall.CROSSINGS], tables[recall.RATIOS])
        text.append(
            "Tokens to an accuracy: per seed, where the seed's `val/accuracy` curve first reaches it, "
            "interpolated linearly between evaluations; `>D` where it never did by its last evaluation D. "
            f"Token ratio at {recall.RATIO_AT:.0%}: the reference's tokens to it over the variant's, "
            f"paired by seed (above 1x: the variant got there sooner), geometric mean with the "
            f"{recall.LEVEL:.0%} t interval on the log ratios; a censored seed makes it a bound without "
            "an interval (orchestrator/report/stats/recall.py)."
        )
    return Section("MQAR accuracy", text, table, ["accuracy_vs_tokens.png"])


def _with_crossings(table: pd.DataFrame, cross: pd.DataFrame, ratios: pd.DataFrame) -> pd.DataFrame:
    """The accuracy table plus, per (scale, variant), each seed's tokens to each threshold and
    the token ratio at recall.RATIO_AT."""
    out = table.copy()
    for th in recall.THRESHOLDS:
        per = recall.seed_crossings(cross, th)
        out[f"tokens to {th:.0%} (per seed)"] = [per.get((s, v), "—") for s, v in zip(out["scale"], out["variant"])]
    by = {(r["scale"], r["variant"]): recall.display_ratio(r) for r in ratios.to_dict("records")}
    out[f"token ratio at {recall.RATIO_AT:.0%} [95%]"] = [by.get((s, v), "reference") for s, v in zip(out["scale"], out["variant"])]
    return out


def scaling(summary: dict) -> Section:
    sc, ref = summary["scaling"], summary["reference"]
    rows = []
    for v, d in sc["fits"].items():
        for axis, label in (("N", "N (non-emb.)"), ("flops", "training FLOPs")):
            f, why = d[axis]["fit"], d[axis]["reason"]
            rows.append(
                {
                    "variant": v,
                    "x": label,
                    "scales": d["n_scales"],
                    "fit": "refused: " + why if why else "fitted",
                    "E (nats)": fmt(f and f["E"], ".4f"),
                    "A": fmt(f and f["A"], ".4g"),
                    "alpha": fmt(f and f["alpha"], ".3f"),
                    "x0": fmt(f and f["x0"], ".3g"),
                    "rmse (nats)": fmt(f and f["rmse"], ".2g"),
                }
            )
    fixed = f" with the exponent fixed at alpha = {sc['fixed_alpha']:g} (not fitted)" if sc.get("fixed_alpha") is not None else ""
    text = [
        f"L = E + A (x/x0)^-alpha fitted to final val loss (nats/token, = ln perplexity){fixed}, x0 the geometric mean of "
        "x. A fit needs at least two more distinct scales than the law has parameters (5 for 3) and a seed-mean loss "
        "that falls with x from every scale to the next; a fit on a parameter bound is refused too. Refused fits are not "
        f"drawn. {_coverage_sentence()}",
        *_prediction_lines(sc["fits"]),
        "Backtest: the law fitted without the largest scale predicts it (the fit's reach, measured), vs N and vs training FLOPs:",
        *_backtest_lines(sc["fits"], 2 if sc.get("fixed_alpha") is not None else 3),
        f"Crossover: the N where a variant's perplexity advantage over `{ref}` reaches zero, from two accepted fits, with "
        f"a 95% bootstrap interval over seeds (paired where the seeds match); beyond the largest measured N it is an "
        f"extrapolation, beyond {CROSSOVER_LIMIT:g}x it is refused:",
        *_crossover_lines(sc["crossover"]),
    ]
    return Section("Scaling", text, pd.DataFrame(rows), ["scaling.png"])


def _coverage_sentence() -> str:
    cov = ", ".join(f"{v:.1%} ({where}, {n} seeds)" for (where, n), v in sorted(PI_COVERAGE.items()))
    return (
        "Prediction intervals (95%) are of a scale's seed-mean loss, from a parametric bootstrap of the fit; their "
        f"coverage, simulated on 5-scale laws with known parameters: {cov}."
    )


def _prediction_lines(fits: dict) -> list[str]:
    out = []
    for v, d in fits.items():
        pred = d["N"].get("prediction")
        if not pred:
            continue
        cells = "; ".join(
            f"{p['scale']} {p['predicted']:.4f} [{fmt(p['low'], '.4f')}, {fmt(p['high'], '.4f')}] observed {p['observed']:.4f}"
            for p in pred
        )
        out.append(f"`{v}` vs N, predicted [95% interval] and observed seed-mean loss (nats): {cells}.")
    return out


def _backtest_lines(fits: dict, n_par: int) -> list[str]:
    out = []
    for v, d in fits.items():
        for key, x in (("backtest", "N"), ("backtest_flops", "FLOPs")):
            if key in d:
                out.append(_backtest_line(f"`{v}` vs {x}", x, d[key], n_par))
    return out


def _backtest_line(who: str, x: str, b: dict, n_par: int) -> str:
    if b.get("predicted") is None:
        return f"{who}: no backtest: {b.get('reason') or 'no fit'}."
    inside = {True: "inside its interval", False: "OUTSIDE its interval", None: "no interval"}[b["covered"]]
    return (
        f"{who}: fitted to {b['n_fit_scales']} scales, predicts {b['held_out']} ({x} = {b['n_params']:.3g}) at "
        f"{b['predicted']:.4f} nats [{fmt(b['low'], '.4f')}, {fmt(b['high'], '.4f')}]; observed {b['observed']:.4f} "
        f"over {b['n_seeds']} seeds: error {b['error']:+.4f} nats, {inside}."
        + (" Fitted with one spare scale only." if b["n_fit_scales"] < n_par + SPARE_SCALES else "")
    )


def _crossover_lines(cross: dict) -> list[str]:
    if not cross:
        return ["None: no non-reference variant to compare."]
    out = []
    for v, d in cross.items():
        if d["n"] is None:
            out.append(f"`{v}`: {d['note'] or 'no estimate'}.")
            continue
        ci = d.get("ci")
        ci_s = "" if not ci else f" (95% bootstrap interval {fmt(ci[0], '.3g')} to {fmt(ci[1], '.3g', 'beyond the searched span')})"
        out.append(f"`{v}`: advantage reaches zero at N ≈ {d['n']:.3g}{ci_s}. {d['note'] or ''}".strip())
    return out


def stability(tables: dict[str, pd.DataFrame]) -> Section:
    ss = tables["seed_std"]
    table = pd.DataFrame(
        {
            "scale": ss["scale"],
            "variant": ss["variant"],
            "mean ppl": ss["mean"].map(lambda v: fmt(v, ".3f")),
            "seed std": ss["std"].map(lambda v: fmt(v, ".3f", "— (one seed)")),
            "seeds": ss["n_seeds"],
        }
    )
    return Section(
        "Stability over seeds",
        [
            "Seed standard deviation of final perplexity; paper: "
            + ", ".join(f"{k} {v}" for k, v in PAPER_SEED_STD.items())
            + ". One seed gives no std."
        ],
        table,
        ["seed_std.png", "attention.png"],
    )


def cost(summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
    ct, at = tables["cost"], tables["attention"].set_index(["scale", "variant"])
    rows = []
    for r in ct.itertuples():
        a = at.loc[(r.scale, r.variant)] if (r.scale, r.variant) in at.index else None
        rows.append(
            {
                "scale": r.scale,
                "variant": r.variant,
                "train wall-clock (s)": fmt(r.wall_s, ".1f"),
                "wall-clock vs reference": _pm(r.wall_ratio, r.wall_ratio_std, ".3f"),
                "time/token vs reference": _pm(r.time_per_token_ratio, r.time_per_token_ratio_std, ".3f"),
                "effective rank": "—" if a is None else _pm(a["effective_rank"], a["effective_rank_std"], ".2f"),
                "attention entropy (nats)": "—" if a is None else _pm(a["entropy"], a["entropy_std"], ".3f"),
                "seeds": int(r.n_pairs),
            }
        )
    text = [
        f"Per planned (x1) run, paired by seed with `{summary['reference']}`'s run of the same scale: training wall-clock "
        "(seconds of optimizer steps, evals excluded) and its ratio, seconds per token and its ratio (mean ± std over "
        "seeds); in a FLOP-matched study the wall-clock ratio is at equal FLOPs. Effective rank and entropy of the "
        "attention maps at the last eval (model.diagnostics; mean over layers and heads); the paper finds coupling "
        "raises the effective rank."
    ]
    return Section("Cost and attention at the planned budget", text, pd.DataFrame(rows) if rows else None)


def problems(summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
    issues = tables["issues"]
    text = (
        f"Missing runs are judged against the {summary['runs']['expected_from']}." if len(issues) else "None: every expected run finished."
    )
    return Section("Failed, incomplete and missing runs", [text], issues if len(issues) else None)


def missing_inputs(summary: dict) -> Section:
    found = [g["text"] for g in summary.get("gaps", [])]
    return Section("Missing inputs", found or ["None: every run has every input the report reads."])


def run_links_section(summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
    """ "Runs in MLflow": a link to every run of the report."""
    return Section("Runs in MLflow", run_links.section_text(summary), run_links.display(summary, tables[run_links.TABLE]))


Draw = Callable[[dict, dict[str, pd.DataFrame]], Section | None]

# The core sections in reading order: (name, draw(summary, tables)); None: not in this report.
CORE: list[tuple[str, Draw]] = [
    ("intro", lambda s, t: intro(s)),
    ("final_ppl", final_ppl),
    ("paired", paired),
    ("every_currency", every_currency),
    ("paper", lambda s, t: paper()),
    ("paper_claims", lambda s, t: paper_claims(t)),
    ("token_ratio", token_ratio),
    ("accuracy", lambda s, t: accuracy(t) if "accuracy" in t else None),
    ("scaling", lambda s, t: scaling(s)),
    ("stability", lambda s, t: stability(t)),
    ("cost", cost),
    ("problems", problems),
    ("missing_inputs", lambda s, t: missing_inputs(s)),
    ("run_links", lambda s, t: run_links_section(s, t) if run_links.TABLE in t else None),
]


def reading_order(parts: list[Part]) -> list[tuple[str, Draw]]:
    """CORE with each part's section right after the section its ``after`` names, behind the
    parts placed there before it (in ``parts`` order); ValueError for a part whose ``after``
    names no section."""
    order = list(CORE)
    anchor_of: dict[str, str] = {}
    left = list(parts)
    while left:
        ready = [p for p in left if p.after in [name for name, _ in order]]
        if not ready:
            raise ValueError(f"report parts placed after no known section: {[(p.name, p.after) for p in left]}")
        for p in ready:
            at = [name for name, _ in order].index(p.after)
            while at + 1 < len(order) and anchor_of.get(order[at + 1][0]) == p.after:
                at += 1
            order.insert(at + 1, (p.name, p.section))
            anchor_of[p.name] = p.after
        left = [p for p in left if p not in ready]
    return order


def sections(summary: dict, tables: dict[str, pd.DataFrame]) -> list[Section]:
    """The report's content in reading order; figures not drawn are dropped from it."""
    out = [s for _, draw in reading_order(PARTS) if (s := draw(summary, tables)) is not None]
    figs = set(summary.get("figures", []))
    for s in out:
        s.figures = [f for f in s.figures if f in figs]
    return out
