"""A learning rate tuned per variant and scale: the tuning grid, its runs, and the choice.

Why: one recipe LR for every arm measures the recipe as much as the method (a variant that
spikes at the reference's LR loses for a reason that has nothing to do with attention). The
field's practice is to tune each arm (Wen et al. 2025, "Fantastic Pretraining Optimizers";
Porian et al. 2024). A spec's ``tune: {lr: [...], tokens: ..., seeds: [...]}`` adds, before
the main runs, one short run per (variant, scale, lr, seed); each (variant, scale) then
trains at the grid's argmin of tuning val loss (`choose_lr`).

* `TuneSpec`: the grid, validated (a non-positive or repeated LR, an empty grid, a fraction
  outside (0, 1] are refused naming the field).
* `tuning_runs`: the runs' descriptors (kind ``tune``, their own identity fields, steps and
  FLOPs); their compute is reported apart from the main budget (`tuning_flops`).
* `choose_lr`: per (variant, scale) the argmin over the grid of the mean tuning val loss
  over the tuning seeds; a failed or diverged run counts as +inf; a best LR at the edge of
  the grid is flagged (the optimum may lie outside it).

Pure: no Ray, no MLflow. Statuses are the strings of ``orchestrator.track.tracking``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.plan.ladder import whole_steps
from orchestrator.plan.specfile import Loc

KIND = "tune"
FINISHED, FAILED, DIVERGED = "finished", "failed", "diverged"


class TuneSpec(BaseModel):
    """The ``tune:`` section.

    Fields: lr (the grid of peak learning rates, each > 0; sorted, no repeats); tokens (an
    integer: training tokens of every tuning run; a non-integer number such as 0.25 or 1.0: a
    fraction in (0, 1] of the run's planned x1 budget); seeds (default: the study's first).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: list[float] = Field(min_length=1)
    tokens: int | float
    seeds: list[int] | None = Field(default=None, min_length=1)

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

    @field_validator("seeds")
    @classmethod
    def _seeds_ok(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(set(v)) != len(v) or any(s < 0 for s in v)):
            raise ValueError("seeds must be distinct non-negative integers")
        return v


class Arm(NamedTuple):
    """A (variant, scale) of the main plan, as tuning needs it: the planned x1 run's steps,
    tokens per optimizer step and training FLOPs per token (3 x forward)."""

    variant: str
    scale: str
    planned_steps: int
    tokens_per_step: int
    flops_per_token: int


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
    arm's planned tokens, rounded to whole steps. FieldError at ``loc`` below one step."""
    tokens = tune.tokens if isinstance(tune.tokens, int) else tune.tokens * arm.planned_steps * arm.tokens_per_step
    return whole_steps(tokens, arm.tokens_per_step, loc)


def tuning_runs(tune: TuneSpec, arms: Iterable[Arm], default_seeds: Sequence[int]) -> list[TuningRun]:
    """Every tuning run: per arm, per LR (ascending), per seed (``tune.seeds``, else the first
    of ``default_seeds``, the study's seeds). Raises FieldError (``tune.tokens``) for a budget
    below one optimizer step."""
    seeds = tune.seeds or list(default_seeds[:1])
    runs: list[TuningRun] = []
    for arm in arms:
        steps = tuning_steps(tune, arm)
        runs.extend(
            TuningRun(arm.variant, arm.scale, lr, seed, steps, arm.tokens_per_step, arm.flops_per_token) for lr in tune.lr for seed in seeds
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
    """A tuning run's outcome: final val loss (nats/token) and status (``finished``,
    ``failed``, ``diverged``; anything else, e.g. ``running``, is not a result yet)."""

    variant: str
    scale: str
    lr: float
    seed: int
    val_loss: float | None
    status: str


@dataclass(frozen=True)
class LrChoice:
    """The chosen LR of one (variant, scale).

    table: grid LR -> mean tuning val loss over seeds (+inf if any seed failed or diverged;
    NaN if no seed has a result). lr: the argmin (ties: the smaller LR), None if every LR
    is +inf or missing. edge: ``lowest`` / ``highest`` when the best LR is an end of a grid of
    2+ values, ``only`` for a 1-value grid, else None. missing: (lr, seed) without a result.
    """

    variant: str
    scale: str
    lr: float | None
    val_loss: float
    table: dict[float, float]
    edge: str | None
    missing: tuple[tuple[float, int], ...]

    @property
    def complete(self) -> bool:
        """Every tuning run of the arm has a result (the main run may be planned)."""
        return not self.missing


def _loss(r: TuningResult) -> float:
    if r.status == FINISHED and r.val_loss is not None and math.isfinite(r.val_loss):
        return float(r.val_loss)
    return math.inf  # failed, diverged, or finished with a non-finite loss


def _grid_lr(lr: float, grid: Sequence[float]) -> float | None:
    """The grid value ``lr`` is (MLflow params round-trip through strings)."""
    return next((g for g in grid if math.isclose(lr, g, rel_tol=1e-9)), None)


def choose_lr(results: Iterable[TuningResult], grid: Sequence[float], seeds: Sequence[int]) -> dict[tuple[str, str], LrChoice]:
    """Per (variant, scale) with results: the grid argmin of mean tuning val loss (`LrChoice`).

    results: tuning outcomes (others' LRs or seeds are ignored); grid: ``TuneSpec.lr``;
    seeds: the tuning seeds. The mean over seeds of a grid point with a failed or diverged
    seed is +inf; a point with some seeds still missing is averaged over those present and
    the choice is marked incomplete.
    """
    grid = sorted(grid)
    losses: dict[tuple[str, str], dict[float, dict[int, float]]] = {}
    for r in results:
        g = _grid_lr(r.lr, grid)
        if g is None or r.seed not in seeds or r.status not in (FINISHED, FAILED, DIVERGED):
            continue
        losses.setdefault((r.variant, r.scale), {}).setdefault(g, {})[r.seed] = _loss(r)
    out = {}
    for (variant, scale), by_lr in losses.items():
        table = {g: (math.fsum(by_lr[g].values()) / len(by_lr[g]) if by_lr.get(g) else math.nan) for g in grid}
        finite = [g for g in grid if math.isfinite(table[g])]
        best = min(finite, key=lambda g: table[g]) if finite else None  # min keeps the first (smaller) on ties
        edge = (
            None if best is None else "only" if len(grid) == 1 else "lowest" if best == grid[0] else "highest" if best == grid[-1] else None
        )
        missing = tuple((g, s) for g in grid for s in seeds if s not in by_lr.get(g, {}))
        out[variant, scale] = LrChoice(variant, scale, best, table[best] if best is not None else math.inf, table, edge, missing)
    return out
