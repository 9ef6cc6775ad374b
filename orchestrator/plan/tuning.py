"""A learning rate tuned per variant and scale: the tuning grid, its runs, and the choice.

Why: one recipe LR for every arm measures the recipe as much as the method (a variant that
spikes at the reference's LR loses for a reason that has nothing to do with attention). The
field's practice is to tune each arm (Wen et al. 2025, "Fantastic Pretraining Optimizers";
Porian et al. 2024). A spec's ``tune: {lr: [...], tokens: ..., seeds: [...]}`` adds, before
the main runs, one short run per (variant, scale, lr, seed); each (variant, scale) then
trains at the grid's argmin of tuning val loss (`choose_lr`). With ``per_corpus: true`` each
(variant, scale, corpus) is an arm of its own (tuned on that corpus); by default the arm is
(variant, scale), tuned on the study's first corpus.

* `TuneSpec`: the grid, validated (a non-positive or repeated LR, an empty grid, a fraction
  outside (0, 1] are refused naming the field).
* `tuning_runs`: the runs' descriptors (kind ``tune``, their own identity fields, steps and
  FLOPs); their compute is reported apart from the main budget (`tuning_flops`). A tuning
  run shorter than ``min_steps`` optimizer steps is refused (``tuning_steps``): a run of a
  dozen steps ranks learning rates by how fast they leave the initial loss, not by where
  they lead.
* `choose_lr`: per arm the argmin over its grid of the mean tuning val loss over the tuning
  seeds; a failed or diverged run counts as +inf; a grid point with a run whose final
  perplexity is above its corpus's unigram perplexity is flagged and never chosen (a model
  that has not beaten token frequencies ranks nothing); a best LR at the edge of the grid is
  flagged (the optimum may lie outside it).
* `extension_lrs`: an arm whose best LR is at an edge gets one more grid point beyond it, at
  the grid's own ratio (``lr / r`` below, ``lr * r`` above), up to ``extend_edges`` per
  side; the driver trains those and chooses again until the best is interior or the bound
  is reached (the choice then says "at the edge after k extensions").

Pure: no Ray, no MLflow. Statuses are the strings of ``orchestrator.track.tracking``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from data_pipeline.config import NumbersStrict
from orchestrator.plan.ladder import FieldError, whole_steps
from orchestrator.plan.specfile import Loc

KIND = "tune"
FINISHED, FAILED, DIVERGED = "finished", "failed", "diverged"


class TuneSpec(NumbersStrict):
    """The ``tune:`` section.

    Fields: lr (the grid of peak learning rates, each > 0; sorted, no repeats); tokens (an
    integer: training tokens of every tuning run; a non-integer number such as 0.25 or 1.0: a
    fraction in (0, 1] of the run's planned x1 budget); seeds (default: the study's first);
    extend_edges (grid points added beyond an edge that holds the best LR, at most this many
    per side; 0: never; a one-point grid has no ratio and never extends); min_steps (the
    fewest optimizer steps a tuning run may have: a shorter one is refused at ``tune.tokens``,
    never silently lengthened); per_corpus (tune each (variant, scale, corpus) on its own
    corpus instead of each (variant, scale) on the first corpus). None of these enters a
    run's identity: a spec that leaves them at their defaults keeps its run ids.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: list[float] = Field(min_length=1)
    tokens: int | float
    seeds: list[int] | None = Field(default=None, min_length=1)
    extend_edges: int = Field(default=2, ge=0)
    min_steps: int = Field(default=50, ge=1)
    per_corpus: bool = False

    @field_validator("lr")
    @classmethod
    def _grid_ok(cls, v: list[float]) -> list[float]:
        for i, x in enumerate(v):
            if not (math.isfinite(x) and x > 0):
                raise ValueError(f"entry {i} ({x}) is not a positive learning rate")
        if len(set(v)) != len(v):
            raise ValueError(f"learning rates repeat: {v}")
        return sorted(v)

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens_ok(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"give an integer (tokens) or a fraction in (0, 1] of the planned budget, got {v!r}")
        if isinstance(v, int) and v < 1:
            raise ValueError(f"an absolute tuning budget must be at least 1 token, got {v}")
        if isinstance(v, float) and not 0 < v <= 1:
            raise ValueError(f"a fraction of the planned budget must be in (0, 1], got {v} (an integer is absolute tokens)")
        return v

    @field_validator("extend_edges")
    @classmethod
    def _extendable(cls, v: int, info: ValidationInfo) -> int:
        # runs only for a value the spec gives: the default on a one-point grid is no extension
        if v and len(info.data.get("lr") or ()) == 1:
            raise ValueError("a one-point grid has no ratio to extend by: give two or more learning rates, or extend_edges: 0")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds_ok(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(set(v)) != len(v) or any(s < 0 for s in v)):
            raise ValueError("seeds must be distinct non-negative integers")
        return v


# An arm's key: (variant, scale), or (variant, scale, corpus) when tuning is per corpus.
ArmKey = tuple[str, ...]


def arm_key(variant: str, scale: str, corpus: str | None) -> ArmKey:
    """The key of an arm: (variant, scale), with the corpus appended when tuning per corpus."""
    return (variant, scale) if corpus is None else (variant, scale, corpus)


class Arm(NamedTuple):
    """An arm of the main plan, as tuning needs it: the planned x1 run's steps, tokens per
    optimizer step and training FLOPs per token (3 x forward); ``corpus`` only when tuning is
    per corpus (it is then part of the arm's key)."""

    variant: str
    scale: str
    planned_steps: int
    tokens_per_step: int
    flops_per_token: int
    corpus: str | None = None

    @property
    def key(self) -> ArmKey:
        """``arm_key`` of the arm."""
        return arm_key(self.variant, self.scale, self.corpus)


@dataclass(frozen=True)
class TuningRun:
    """One tuning run: an arm trained ``steps`` optimizer steps at peak LR ``lr`` (its own full
    schedule over those steps) with ``seed``. ``identity()`` holds what it adds to a main run's
    identity payload (the planner hashes the rest: model, corpus, tokenizer, recipe)."""

    variant: str
    scale: str
    lr: float
    seed: int
    steps: int
    tokens_per_step: int
    flops_per_token: int
    kind: str = field(default=KIND)
    corpus: str | None = None  # per-corpus tuning only; the corpus is in the base run's id already

    @property
    def tokens(self) -> int:
        """Training tokens (whole optimizer steps)."""
        return self.steps * self.tokens_per_step

    @property
    def total_flops(self) -> int:
        """Training FLOPs (tokens x training FLOPs per token)."""
        return self.tokens * self.flops_per_token

    @property
    def run_name(self) -> str:
        """MLflow run name, e.g. ``tune-coupled-cpu-s-lr0.003-s0``."""
        return f"{KIND}-{self.variant}-{self.scale}-lr{self.lr:g}-s{self.seed}"

    def identity(self) -> dict[str, Any]:
        """Identity fields of the tuning run (kind, variant, scale, lr, seed, steps)."""
        return {"kind": self.kind, "variant": self.variant, "scale": self.scale, "lr": self.lr, "seed": self.seed, "steps": self.steps}


def tuning_steps(tune: TuneSpec, arm: Arm, loc: Loc = ("tune", "tokens")) -> int:
    """Optimizer steps of ``arm``'s tuning runs: ``tokens`` (absolute), or the fraction of the
    arm's planned tokens, rounded to whole steps.

    Raises FieldError at ``loc`` below one step, or below ``tune.min_steps`` (the message
    names both fields and the tokens that would reach the minimum)."""
    planned = arm.planned_steps * arm.tokens_per_step
    tokens = tune.tokens if isinstance(tune.tokens, int) else tune.tokens * planned
    steps = whole_steps(tokens, arm.tokens_per_step, loc)
    if steps < tune.min_steps:
        need = tune.min_steps * arm.tokens_per_step
        frac = f" (a fraction >= {need / planned:.3g} of the planned budget)" if need <= planned else ""
        raise FieldError(
            loc,
            f"tuning runs of {arm.variant} @ {arm.scale} would be {steps} optimizer steps, fewer than tune.min_steps "
            f"({tune.min_steps}): give at least {need:,} tokens{frac}, or lower tune.min_steps",
        )
    return steps


def tuning_runs(
    tune: TuneSpec, arms: Iterable[Arm], default_seeds: Sequence[int], extra: Mapping[ArmKey, Iterable[float]] | None = None
) -> list[TuningRun]:
    """Every tuning run: per arm, per LR (ascending: the grid and the arm's ``extra`` LRs, the
    points its edge extensions added, keyed by ``Arm.key``), per seed (``tune.seeds``, else
    the first of ``default_seeds``, the study's seeds). Raises FieldError (``tune.tokens``) for
    a budget below one optimizer step or ``tune.min_steps``."""
    seeds = tune.seeds or list(default_seeds[:1])
    runs: list[TuningRun] = []
    for arm in arms:
        steps = tuning_steps(tune, arm)
        lrs = sorted({*tune.lr, *(extra or {}).get(arm.key, ())})
        runs.extend(
            TuningRun(arm.variant, arm.scale, lr, seed, steps, arm.tokens_per_step, arm.flops_per_token, corpus=arm.corpus)
            for lr in lrs
            for seed in seeds
        )
    return runs


def tuning_flops(runs: Iterable[TuningRun]) -> dict[tuple[str, str], int]:
    """Tuning compute (training FLOPs) per (variant, scale); ``sum(...values())`` is the total,
    which ``qkstudy plan`` prints apart from the main budget."""
    out: dict[tuple[str, str], int] = {}
    for r in runs:
        out[r.variant, r.scale] = out.get((r.variant, r.scale), 0) + r.total_flops
    return out


class TuningResult(NamedTuple):
    """A tuning run's outcome: final val loss (nats/token), status (``finished``, ``failed``,
    ``diverged``; anything else, e.g. ``running``, is not a result yet) and the corpus it
    trained on (its unigram perplexity is the bar it must get below)."""

    variant: str
    scale: str
    lr: float
    seed: int
    val_loss: float | None
    status: str
    corpus: str = ""


@dataclass(frozen=True)
class LrChoice:
    """The chosen LR of one arm.

    table: the arm's grid LR -> mean tuning val loss over seeds (nats/token; +inf if any seed
    failed or diverged; NaN if no seed has a result). lr: the argmin over the points not
    above unigram (ties: the smaller LR), None if every point is +inf, missing or above
    unigram. edge: ``lowest`` / ``highest`` when the best LR is an end of a grid of 2+ values,
    ``only`` for a 1-value grid, else None. missing: (lr, seed) without a result. corpus: the
    arm's corpus under per-corpus tuning, else None. above_unigram: grid LRs with a run whose
    final perplexity exceeded its corpus's unigram perplexity (never chosen). extended: the
    grid points beyond the initial grid, (below, above).
    """

    variant: str
    scale: str
    lr: float | None
    val_loss: float
    table: dict[float, float]
    edge: str | None
    missing: tuple[tuple[float, int], ...]
    corpus: str | None = None
    above_unigram: tuple[float, ...] = ()
    extended: tuple[int, int] = (0, 0)

    @property
    def complete(self) -> bool:
        """Every tuning run of the arm has a result (the main run may be planned)."""
        return not self.missing

    @property
    def extensions(self) -> int:
        """How many times the arm's grid was extended (one point each time)."""
        return sum(self.extended)

    @property
    def note(self) -> str:
        """What the choice says about the grid: ``at the lowest edge after 2 extensions``,
        ``at the highest edge of the grid``, ``interior after 1 extension``, or ''."""
        k = self.extensions
        times = f"{k} extension{'s' if k != 1 else ''}"
        if self.lr is not None and self.edge in ("lowest", "highest"):
            return f"at the {self.edge} edge after {times}" if k else f"at the {self.edge} edge of the grid"
        return f"interior after {times}" if k and self.lr is not None else ""


def _loss(r: TuningResult) -> float:
    if r.status == FINISHED and r.val_loss is not None and math.isfinite(r.val_loss):
        return float(r.val_loss)
    return math.inf  # failed, diverged, or finished with a non-finite loss


def _grid_lr(lr: float, grid: Sequence[float]) -> float | None:
    """The grid value ``lr`` is (MLflow params round-trip through strings)."""
    return next((g for g in grid if math.isclose(lr, g, rel_tol=1e-9)), None)


def _above(r: TuningResult, unigram: Mapping[str, float]) -> bool:
    """The run finished with a final perplexity (exp of its val loss) above its corpus's
    unigram perplexity (False when the corpus has none recorded)."""
    ppl = unigram.get(r.corpus)
    loss = _loss(r)
    return ppl is not None and math.isfinite(loss) and loss > math.log(ppl)


def choose_lr(
    results: Iterable[TuningResult],
    grid: Sequence[float],
    seeds: Sequence[int],
    *,
    unigram: Mapping[str, float] | None = None,
    extra: Mapping[ArmKey, Iterable[float]] | None = None,
    per_corpus: bool = False,
) -> dict[ArmKey, LrChoice]:
    """Per arm with results: the argmin over its grid of mean tuning val loss (`LrChoice`).

    results: tuning outcomes (others' LRs or seeds are ignored); grid: ``TuneSpec.lr`` (the
    initial grid); seeds: the tuning seeds; unigram: corpus -> unigram perplexity per token
    (a grid point with a run above it is flagged and never chosen; None: no bar); extra: per
    arm key the LRs its edge extensions added (`extension_lrs`); per_corpus: arms are
    (variant, scale, corpus) instead of (variant, scale). The mean over seeds of a grid point
    with a failed or diverged seed is +inf; a point with some seeds still missing is averaged
    over those present and the choice is marked incomplete.
    """
    losses: dict[ArmKey, dict[float, dict[int, float]]] = {}
    above: dict[ArmKey, set[float]] = {}
    grids: dict[ArmKey, list[float]] = {}
    for r in results:
        key = arm_key(r.variant, r.scale, r.corpus if per_corpus else None)
        arm_grid = grids.setdefault(key, sorted({*grid, *(extra or {}).get(key, ())}))
        g = _grid_lr(r.lr, arm_grid)
        if g is None or r.seed not in seeds or r.status not in (FINISHED, FAILED, DIVERGED):
            continue
        losses.setdefault(key, {}).setdefault(g, {})[r.seed] = _loss(r)
        if _above(r, unigram or {}):
            above.setdefault(key, set()).add(g)
    return {key: _choice(key, grids[key], by_lr, above.get(key, set()), seeds, min(grid), max(grid)) for key, by_lr in losses.items()}


def _choice(
    key: ArmKey, grid: list[float], by_lr: dict[float, dict[int, float]], above: set[float], seeds: Sequence[int], lo: float, hi: float
) -> LrChoice:
    """One arm's `LrChoice` from its per-LR, per-seed losses; ``lo``/``hi``: the initial grid's ends."""
    table = {g: (math.fsum(by_lr[g].values()) / len(by_lr[g]) if by_lr.get(g) else math.nan) for g in grid}
    usable = [g for g in grid if math.isfinite(table[g]) and g not in above]
    best = min(usable, key=lambda g: table[g]) if usable else None  # min keeps the first (smaller) on ties
    edge = None if best is None else "only" if len(grid) == 1 else "lowest" if best == grid[0] else "highest" if best == grid[-1] else None
    missing = tuple((g, s) for g in grid for s in seeds if s not in by_lr.get(g, {}))
    return LrChoice(
        key[0],
        key[1],
        best,
        table[best] if best is not None else math.inf,
        table,
        edge,
        missing,
        corpus=key[2] if len(key) > 2 else None,
        above_unigram=tuple(g for g in grid if g in above),
        extended=(sum(g < lo for g in grid), sum(g > hi for g in grid)),
    )


def _side(c: LrChoice) -> str | None:
    """The edge an arm's grid should grow at: the best LR's, or when no point is usable (all
    above unigram) the edge of the lowest finite loss; None when interior or nothing finite."""
    if c.lr is not None:
        return c.edge if c.edge in ("lowest", "highest") else None
    grid = sorted(c.table)
    finite = [g for g in grid if math.isfinite(c.table[g])]
    if len(grid) < 2 or not finite:
        return None
    lead = min(finite, key=lambda g: c.table[g])
    return "lowest" if lead == grid[0] else "highest" if lead == grid[-1] else None


def extension_lrs(choices: Mapping[ArmKey, LrChoice], grid: Sequence[float], max_per_side: int) -> dict[ArmKey, float]:
    """Per arm whose best LR is at an edge of its grid (`_side`) and whose tuning runs all
    have a result: the next grid point beyond that edge, at the initial grid's own ratio
    there (``grid[1] / grid[0]`` below, ``grid[-1] / grid[-2]`` above), rounded to 4
    significant digits; none for an arm with ``max_per_side`` points on that side already, a
    one-point grid, or ``max_per_side`` 0. Pure: the driver trains them and chooses again."""
    grid = sorted(grid)
    if len(grid) < 2 or max_per_side < 1:
        return {}
    ratio = {"lowest": grid[0] / grid[1], "highest": grid[-1] / grid[-2]}
    out: dict[ArmKey, float] = {}
    for key, c in choices.items():
        side = _side(c) if c.complete else None
        if side is None or c.extended[side == "highest"] >= max_per_side:
            continue
        end = min(c.table) if side == "lowest" else max(c.table)
        out[key] = float(f"{end * ratio[side]:.4g}")
    return out
