"""The unigram baseline beside a corpus's final perplexities.

Why: a final perplexity is only evidence of learnt context if it lies well below what token
frequencies alone give. The driver records each corpus's unigram perplexity (add-one
smoothed, fit on the train split, scored on the whole val split: ``data_pipeline.unigram``)
as experiment tags (``orchestrator.track.tracking.set_unigram_tags``); here it is read
back and each (scale, variant)'s seed-mean final perplexity is divided by it. A store
written before the tags existed says "unigram perplexity not recorded" and gets no table,
so its other tables are unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from orchestrator.report.parts.base import PartInput, Section
from orchestrator.track.tracking import unigram_from_tags

TABLE = "unigram"
NOT_RECORDED = "unigram perplexity not recorded"
COLUMNS = ["scale", "variant", "final_ppl", "worst_seed_ppl", "unigram_ppl", "ppl_over_unigram", "worst_seed_over_unigram", "n_seeds"]


def recorded(experiment_tags: dict[str, str], corpus: str | None) -> dict[str, Any] | None:
    """``{"val_ppl", "val_tokens"}`` of ``corpus`` from the experiment's tags, or None (no
    corpus tag on the runs, or a store from before the tags)."""
    if corpus is None:
        return None
    return unigram_from_tags(experiment_tags).get(corpus)


def unigram_table(final: pd.DataFrame, runs: pd.DataFrame, unigram_ppl: float) -> pd.DataFrame:
    """One row per (scale, variant) of the final table (``tables.final_table``, same order):
    the seed-mean final perplexity, the worst (largest) seed's among the planned x1 runs of
    ``runs`` (the report's run table), the unigram perplexity and both divided by it
    (dimensionless; below 1: better than token frequencies alone)."""
    done = runs[(runs["extend"] == 1.0) & np.isfinite(runs["final_ppl"].astype(float))]
    worst = done.groupby(["scale", "variant"])["final_ppl"].max()
    rows = []
    for r in final.itertuples():
        w = worst.get((r.scale, r.variant), np.nan)
        rows.append(
            {
                "scale": r.scale,
                "variant": r.variant,
                "final_ppl": r.mean_ppl,
                "worst_seed_ppl": w,
                "unigram_ppl": unigram_ppl,
                "ppl_over_unigram": r.mean_ppl / unigram_ppl,
                "worst_seed_over_unigram": w / unigram_ppl,
                "n_seeds": int(r.n_seeds),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def summary_entry(corpus: str | None, stat: dict[str, Any] | None, table: pd.DataFrame | None) -> dict[str, Any]:
    """summary.json's ``unigram``: recorded (bool), corpus, val_ppl, val_tokens, the per
    (scale, variant) ratios and ``all_at_most_half`` (every seed-mean final <= unigram / 2);
    only corpus, recorded and note when the tag is missing."""
    if stat is None or table is None:
        return {"recorded": False, "corpus": corpus, "note": NOT_RECORDED}
    rows = table[["scale", "variant", "final_ppl", "ppl_over_unigram", "worst_seed_over_unigram"]].to_dict(orient="records")
    ratios = table["ppl_over_unigram"].dropna()
    return {
        "recorded": True,
        "corpus": corpus,
        "val_ppl": stat["val_ppl"],
        "val_tokens": stat["val_tokens"],
        "ratios": rows,
        "all_at_most_half": bool(len(ratios)) and bool((ratios <= 0.5).all()),
    }


def section_text(entry: dict[str, Any]) -> list[str]:
    """The section's sentences: the baseline, how it is computed, and the arms above half of it."""
    if not entry["recorded"]:
        which = "this study (its runs carry no corpus tag)" if entry["corpus"] is None else f"corpus `{entry['corpus']}`"
        return [
            f"{NOT_RECORDED.capitalize()} for {which} (the store predates it, or the driver "
            "could not find the prepared data): run the study again (`qkstudy run`; finished runs are not "
            "retrained) to record it."
        ]
    n = entry["val_tokens"]
    text = [
        f"Unigram perplexity of corpus `{entry['corpus']}`: {entry['val_ppl']:.2f}, on its whole validation split "
        f"({'?' if n is None else format(n, ',')} tokens) under its tokenizer, from a unigram model of the train "
        "split's token counts with add-one smoothing over the vocabulary (data_pipeline.unigram). The finals are on "
        "the runs' fixed eval windows of the same split. `final / unigram` below 0.5: the model beats token "
        "frequencies alone by at least 2x."
    ]
    above = [f"`{r['variant']}` @ {r['scale']} ({r['ppl_over_unigram']:.3f})" for r in entry["ratios"] if not r["ppl_over_unigram"] <= 0.5]
    text.append(
        "Every arm's seed-mean final perplexity is at most half of it."
        if entry["all_at_most_half"]
        else "Above half of it: " + (", ".join(above) if above else "no finished arm") + "."
    )
    return text


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the report prints it."""

    def f(x: Any, spec: str) -> str:
        return "—" if x is None or pd.isna(x) else format(x, spec)

    return pd.DataFrame(
        {
            "scale": table["scale"],
            "variant": table["variant"],
            "final ppl (seed mean)": table["final_ppl"].map(lambda x: f(x, ".3f")),
            "worst seed": table["worst_seed_ppl"].map(lambda x: f(x, ".3f")),
            "unigram ppl": table["unigram_ppl"].map(lambda x: f(x, ".2f")),
            "final / unigram": table["ppl_over_unigram"].map(lambda x: f(x, ".3f")),
            "worst seed / unigram": table["worst_seed_over_unigram"].map(lambda x: f(x, ".3f")),
            "seeds": table["n_seeds"],
        }
    )


def attach(summary: dict, tabs: dict[str, pd.DataFrame], experiment_tags: dict[str, str], corpus: str | None) -> None:
    """Add the baseline of one corpus's report: ``summary["unigram"]`` (``summary_entry``),
    ``unigram_ppl`` and ``ppl_over_unigram`` {variant: ratio} on every scale entry (None and
    {} when not recorded), and the ``unigram`` table when recorded."""
    stat = recorded(experiment_tags, corpus)
    table = None if stat is None else unigram_table(tabs["final_ppl"], tabs["runs"], stat["val_ppl"])
    summary["unigram"] = summary_entry(corpus, stat, table)
    for s_ in summary["scales"]:
        rows = [] if table is None else [r for r in table.itertuples() if r.scale == s_["scale"]]
        s_["unigram_ppl"] = None if stat is None else stat["val_ppl"]
        s_["ppl_over_unigram"] = {r.variant: r.ppl_over_unigram for r in rows}
    if table is not None:
        tabs[TABLE] = table


class UnigramPart:
    """The corpus's unigram bar beside the finals (``attach``), read after the final perplexities."""

    name, after = TABLE, "final_ppl"

    def build(self, given: PartInput) -> None:
        """Add the baseline of the report's corpus (``attach``)."""
        attach(given.summary, given.tables, given.data.experiment_tags, given.unigram_corpus)

    def section(self, summary: dict, tables: dict[str, pd.DataFrame]) -> Section:
        """ "Unigram baseline": the bar and the arms above half of it, or that it is not recorded."""
        entry = summary.get("unigram") or {"recorded": False, "corpus": summary.get("corpus")}
        return Section("Unigram baseline", section_text(entry), display(tables[TABLE]) if TABLE in tables else None)


PART = UnigramPart()
