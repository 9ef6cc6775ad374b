"""What the store does not hold, as sentences: which runs lack which input, and what that costs.

A store can be partial: runs of an older version without the final pass or the N /
FLOPs-per-token params, a writer that crashed, runs logged by another tool that follows
the documented names (README "Conventions the numbers depend on"). The report still says
everything the rest supports; each missing input becomes one sentence naming the runs, what
is missing and which numbers or figures it removes, and each figure that could not be drawn
says why.
"""

from __future__ import annotations

import pandas as pd

MAX_NAMES = 8

# (param column, what is missing, what that removes)
_PARAM_GAPS = (
    (
        "n_params",
        "the n_params param (N, non-embedding parameters)",
        "N is shown as —, and the scaling fits and crossover vs N leave them out",
    ),
    ("flops_per_token", "the flops_per_token param", "no FLOP ratio and no FLOPs axis (ppl_vs_flops.png, scaling vs FLOPs) for them"),
    ("planned_tokens", "the planned_tokens param", "their tokens are taken from the last logged step"),
)
_METRIC_GAPS = (
    ("val/ppl", "val/ppl (the eval curve)", "no curve is drawn for them and no single-run curve estimate reads them"),
    ("time/wall_s", "time/wall_s", "no wall-clock ratio or wall-clock curve for them"),
)
FIGURE_NEEDS = {
    "ppl_vs_tokens.png": "finished runs with val/ppl points",
    "ppl_vs_flops.png": "finished runs with val/ppl points and the flops_per_token param",
    "ppl_vs_wallclock.png": "finished runs with val/ppl and time/wall_s points",
    "paired_dloss_vs_tokens.png": "a non-reference variant and the reference: finished planned runs of a shared seed and val/ppl points",
    "token_ratio.png": "a token ratio: a finished non-reference run and reference runs at two or more lengths",
    "scaling.png": "finished planned runs with a final perplexity",
    "seed_std.png": "two or more finished seeds of one variant at one scale",
    "attention.png": "attn/* diagnostics (attn/entropy, attn/effective_rank, attn/spectral_gap)",
}


def names(runs: pd.DataFrame) -> str:
    """Run names for a sentence: the first MAX_NAMES, then how many more."""
    got = [str(n) if n else str(u)[:8] for n, u in zip(runs["run_name"], runs["run_uuid"])]
    more = len(got) - MAX_NAMES
    return ", ".join(got[:MAX_NAMES]) + (f" and {more} more" if more > 0 else "")


def _sentence(runs: pd.DataFrame, missing: str, effect: str) -> dict:
    n = len(runs)
    return {
        "missing": missing,
        "runs": list(runs["run_name"]),
        "text": f"{n} run{'s' if n != 1 else ''} ({names(runs)}) lack{'s' if n == 1 else ''} {missing}: {effect}.",
    }


def untagged(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """Runs that carry both the variant and the scale tag, and a sentence for the others."""
    bad = runs["variant"].isna() | runs["scale"].isna()
    out = [_sentence(runs[bad], "the variant or scale tag", "they cannot be placed in the study and are left out")] if bad.any() else []
    return runs[~bad], out


def input_gaps(finals: pd.DataFrame, metrics: pd.DataFrame) -> list[dict]:
    """One {"missing", "runs", "text"} per missing input (curves.run_finals rows, metric points)."""
    out = []
    done = finals["status"] == "finished"
    no_final = finals[done & ~finals["complete"]]
    if len(no_final):
        out.append(
            _sentence(
                no_final,
                "final/val_ppl (the full validation pass at the planned tokens)",
                "they are left out of the final-perplexity tables, verdicts, token ratio and scaling fits",
            )
        )
    no_seed = finals[finals["seed"].isna()]
    if len(no_seed):
        out.append(_sentence(no_seed, "the seed tag", "they are not paired with any run"))
    for col, missing, effect in _PARAM_GAPS:
        lack = finals[finals[col].isna()]
        if len(lack):
            out.append(_sentence(lack, missing, effect))
    for key, missing, effect in _METRIC_GAPS:
        has = set(metrics.loc[metrics["key"] == key, "run_uuid"])
        lack = finals[done & ~finals["run_uuid"].isin(has)]
        if len(lack):
            out.append(_sentence(lack, missing, effect))
    return out


def figure_gaps(drawn: list[str]) -> list[dict]:
    """A sentence for each standard figure that was not drawn, with what it needs."""
    return [
        {"missing": f, "runs": [], "text": f"{f} is not drawn: it needs {need}, which the store does not have."}
        for f, need in FIGURE_NEEDS.items()
        if f not in drawn
    ]
