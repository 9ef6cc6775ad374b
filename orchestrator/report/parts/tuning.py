"""The report's tuning table: tuning val loss per learning rate, per variant and scale.

Why: a study with ``tune:`` trains every (variant, scale) at the grid's argmin of tuning
val loss (``orchestrator.plan.tuning.choose_lr``); the report shows the grid it chose from,
the chosen LR, and flags a best LR at an end of the grid (the optimum may lie outside it).
The choice is recomputed here from the tuning runs MLflow holds (kind ``tune``, read by
``report.query``) with the
same function the runner used, so the table and the trained LRs cannot disagree: a study
whose driver recorded its rule (the experiment tag ``qkstudy.tune``: initial grid, seeds,
per-corpus arms) is chosen by it, with its corpora's unigram perplexities as the bar, and
its table adds the grid points edge extensions added (``extended``), the LRs whose runs
ended above unigram (``above_unigram``) and the choice's ``note`` ("interior after 1
extension", "at the lowest edge after 2 extensions"); a store without the tag (tuned
before the rule) gets the plain grid argmin it trained at, in the columns it always had.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from orchestrator.plan.tuning import ArmKey, LrChoice, TuningResult, arm_key, choose_lr
from orchestrator.report.parts.base import PartInput, Section
from orchestrator.report.query import StudyData
from orchestrator.track.tracking import STATUS_QUEUED, tune_from_tags, unigram_from_tags

TABLE = "tuning"


def tuning_results(runs: pd.DataFrame) -> list[TuningResult]:
    """Every tuning run (``StudyData.tuning``) as a `TuningResult` (lr from its ``lr`` param,
    val loss its latest ``final/val_loss``, status and corpus from its tags)."""
    return [
        TuningResult(
            _text(r["variant"]),
            _text(r["scale"]),
            float(r["params.lr"]),
            0 if pd.isna(r["seed"]) else int(r["seed"]),
            r["final_val_loss"],
            _text(r["status"]) or STATUS_QUEUED,
            _text(r["corpus"]),
        )
        for _, r in runs.iterrows()
    ]


def _text(x: object) -> str:
    """A tag's value, '' for none."""
    return x if isinstance(x, str) else ""


def tuning_table(
    results: list[TuningResult], record: dict[str, Any] | None = None, unigram: dict[str, float] | None = None
) -> pd.DataFrame:
    """One row per (variant, scale): ``lr <g>`` columns with the mean tuning val loss over
    seeds (nats/token; inf: a seed failed or diverged; NaN: no result), ``chosen_lr``,
    ``edge`` (``lowest`` / ``highest`` / ``only`` or empty) and ``seeds``. Empty without results.

    ``record``: the driver's tuning rule (``track.tracking.tune_from_tags``); with it the
    choice is the driver's (`_ruled_table`), ``unigram`` (corpus -> unigram perplexity per
    token) the bar a run must end below."""
    if not results:
        return pd.DataFrame()
    if record is not None:
        return _ruled_table(results, record, unigram or {})
    grid = sorted({r.lr for r in results})
    seeds = sorted({r.seed for r in results})
    rows = []
    for (variant, scale), c in sorted(choose_lr(results, grid, seeds).items()):
        row: dict[str, object] = {"variant": variant, "scale": scale}
        row.update({f"lr {g:g}": c.table[g] for g in grid})
        row.update({"chosen_lr": c.lr, "edge": c.edge or "", "seeds": len(seeds), "missing": len(c.missing)})
        rows.append(row)
    return pd.DataFrame(rows)


def _ruled_table(results: list[TuningResult], record: dict[str, Any], unigram: dict[str, float]) -> pd.DataFrame:
    """`tuning_table` by the recorded rule: per arm (plus ``corpus`` under per-corpus tuning)
    the losses over its own grid, the choice, ``extended`` (the points beyond the initial grid
    and how many below / above), ``above_unigram`` (LRs with a run above it) and ``note``."""
    grid, per_corpus = [float(g) for g in record["grid"]], bool(record.get("per_corpus"))
    extra: dict[ArmKey, set[float]] = {}
    for r in results:
        if not any(math.isclose(r.lr, g, rel_tol=1e-9) for g in grid):
            extra.setdefault(arm_key(r.variant, r.scale, r.corpus if per_corpus else None), set()).add(r.lr)
    choices = choose_lr(results, grid, record["seeds"], unigram=unigram, extra=extra, per_corpus=per_corpus)
    columns = sorted({g for c in choices.values() for g in c.table})
    rows = [_ruled_row(c, columns, len(record["seeds"]), per_corpus) for _, c in sorted(choices.items())]
    return pd.DataFrame(rows)


def _ruled_row(c: LrChoice, columns: list[float], n_seeds: int, per_corpus: bool) -> dict[str, object]:
    """One arm's row of `_ruled_table` (an LR outside the arm's grid: NaN)."""
    row: dict[str, object] = {"variant": c.variant, "scale": c.scale, **({"corpus": c.corpus} if per_corpus else {})}
    row.update({f"lr {g:g}": c.table.get(g, math.nan) for g in columns})
    below, above = c.extended
    grid = sorted(c.table)
    ext = grid[:below] + grid[len(grid) - above :]  # the extensions lie beyond the initial grid's ends
    said = f"{', '.join(f'{g:g}' for g in ext)} ({below} below, {above} above)" if ext else ""
    row.update({"chosen_lr": c.lr, "edge": c.edge or "", "seeds": n_seeds, "missing": len(c.missing)})
    row.update({"extended": said, "above_unigram": ", ".join(f"{g:g}" for g in c.above_unigram), "note": c.note})
    return row


def tuning_tables(data: StudyData) -> dict[str, pd.DataFrame]:
    """``{"tuning": table}`` when the study has tuning runs, else ``{}``; chosen by the
    driver's recorded rule when the experiment holds one (``qkstudy.tune``), with its
    corpora's unigram perplexities as the bar."""
    tags = data.experiment_tags
    unigram = {c: float(u["val_ppl"]) for c, u in unigram_from_tags(tags).items()}
    table = tuning_table(tuning_results(data.tuning), tune_from_tags(tags), unigram) if len(data.tuning) else pd.DataFrame()
    return {TABLE: table} if len(table) else {}


def section_text(table: pd.DataFrame) -> list[str]:
    """The section's sentences: what the numbers are, every arm whose best LR is at an end of
    the grid (after how many extensions, by the recorded rule), whose grid was extended, whose
    runs ended above unigram, or that has runs without a result."""
    text = [
        "Final `final/val_loss` (nats/token) of the short tuning runs, mean over tuning seeds, per peak "
        "learning rate; each (variant, scale) trained its main runs at `chosen_lr`, the grid's argmin "
        "(inf: a seed failed or diverged)."
    ]
    for _, r in table.iterrows():
        text += _rule_sentences(r)
        if r["edge"] in ("lowest", "highest") and not r.get("extended"):
            text.append(
                f"`{r['variant']}` @ {r['scale']}: the best LR {r['chosen_lr']:g} is the {r['edge']} of the grid; "
                "the optimum may lie outside it (widen the grid)."
            )
        if r["missing"]:
            text.append(f"`{r['variant']}` @ {r['scale']}: {r['missing']} tuning run(s) without a result.")
    return text


def _rule_sentences(r: pd.Series) -> list[str]:
    """The sentences of a row chosen by the recorded rule (`_ruled_row`): extensions, the
    unigram bar, no usable LR; [] for a row of a store without the rule."""
    if "note" not in r.index:
        return []
    arm = f"`{r['variant']}` @ {r['scale']}" + (f" on {r['corpus']}" if "corpus" in r.index else "")
    out = []
    if r["extended"]:
        still = "; the optimum may lie beyond it (raise tune.extend_edges)" if "edge after" in r["note"] else ""
        out.append(f"{arm}: the grid was extended at the grid's own ratio to {r['extended']}; the best LR is {r['note']}{still}.")
    if r["above_unigram"]:
        out.append(f"{arm}: the tuning runs at LR {r['above_unigram']} ended above their corpus's unigram perplexity: never chosen.")
    if r["chosen_lr"] is None or r["chosen_lr"] != r["chosen_lr"]:
        out.append(f"{arm}: no usable LR (every point failed, diverged, ended above unigram or has no result).")
    return out


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the report prints it (losses to 4 decimals, '—' for no result)."""

    def f(x: object) -> str:
        return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, ".4f") if isinstance(x, float) else str(x)

    out = table.drop(columns=["missing"]).copy()
    for col in [c for c in out.columns if c.startswith("lr ")]:
        out[col] = out[col].map(f)
    out["chosen_lr"] = out["chosen_lr"].map(lambda x: "—" if x is None or x != x else format(x, "g"))
    return out


class TuningPart:
    """The LR grid each arm was chosen from (``tuning_tables``), read after the accuracy section."""

    name, after = TABLE, "accuracy"

    def build(self, given: PartInput) -> None:
        """Add the ``tuning`` table when the study has tuning runs."""
        given.tables.update(tuning_tables(given.data))

    def section(self, summary: dict, tables: dict[str, pd.DataFrame]) -> Section | None:
        """ "Learning-rate tuning": the grid, the choice and its edges; None without tuning runs."""
        if TABLE not in tables:
            return None
        return Section("Learning-rate tuning", section_text(tables[TABLE]), display(tables[TABLE]))


PART = TuningPart()
