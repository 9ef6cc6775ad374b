"""A gated ladder: only the runs the answer needs.

Why: on a ladder of scales, a variant that is clearly worse than the reference at a small
rung rarely recovers at the next one, and its runs at the large rungs cost most of the study
(Marin's fast_track). A spec's ``gate: {metric: paired_delta_loss, worse_than: 0.02,
currency: tokens}`` trains the study rung by rung (scales ordered by the reference's N,
non-embedding parameters); after each rung every still-training variant is compared with the
reference, paired by seed, and a variant whose paired Δloss (variant - reference, nats/token,
in the gate's currency) is above ``worse_than`` *and* whose paired interval excludes zero
(its low end > 0) is stopped: its runs at the larger rungs are not trained. The reference
(its extend runs too) trains every rung.

* ``GateSpec``: the ``gate:`` section, validated (an unknown metric or currency, a negative
  or non-finite bound, a level outside (0, 1) are refused naming the field).
* ``rungs``: the study's scales as rungs, ordered by the reference's N.
* ``GateEvidence``: one comparison at one rung (the numbers, and whether it stopped the
  arm); ``stops`` is the rule on those numbers. The numbers themselves come from the
  report's paired contrasts (``orchestrator.report.gate``): the driver receives that
  function from the CLI (``run.driver.study``), as the run stage never imports the report.
* ``gate_compute``: ``qkstudy plan``'s worst case (every run trains) and best case (every
  non-reference arm stopped after the first rung).

Pure: no Ray, no MLflow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol

from pydantic import ConfigDict, Field

from data_pipeline.config import NumbersStrict
from orchestrator.plan.contract import RunSpec

CURRENCY_WORDS = {"tokens": "equal tokens", "flops": "equal model FLOPs"}


class GateSpec(NumbersStrict):
    """The ``gate:`` section.

    Fields: metric (``paired_delta_loss``: the seed-paired difference of final val loss,
    variant - reference, nats/token); worse_than (the bound, nats/token, >= 0: a variant
    stops when its paired Δ is above it with its interval excluding zero); currency
    (``tokens`` or ``flops``: the budget both arms of a pair reached, the arm that spent
    more read on its own eval curve, ``orchestrator.report.stats.currencies``); level (the paired
    t interval's coverage, default 0.95).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Literal["paired_delta_loss"] = "paired_delta_loss"
    worse_than: float = Field(ge=0, allow_inf_nan=False)
    currency: Literal["tokens", "flops"] = "tokens"
    level: float = Field(default=0.95, gt=0, lt=1)


@dataclass(frozen=True)
class GateEvidence:
    """One gate comparison: ``variant`` against ``reference`` on ``corpus`` at rung ``rung``
    (1-based) = ``scale``; ``dloss`` its paired mean difference (nats/token, variant -
    reference) in ``currency`` with its ``level`` interval [``low``, ``high``] over
    ``n_pairs`` seed pairs and two-sided ``p_value`` (NaN where there is no verdict, e.g.
    fewer than 2 pairs); ``bound`` the gate's ``worse_than``; ``stopped``: ``stops`` said
    so; ``skipped``: the larger rungs' scales it then does not train at; ``note``: why there
    is no verdict, or how the pair was read."""

    corpus: str
    variant: str
    reference: str
    scale: str
    rung: int
    currency: str
    bound: float
    dloss: float
    low: float
    high: float
    n_pairs: int
    p_value: float
    level: float
    stopped: bool
    skipped: tuple[str, ...] = field(default_factory=tuple)
    note: str = ""

    def sentence(self) -> str:
        """'stopped at rung 1 (cpu-xs): Δ=+0.0500 nats [+0.0300, +0.0700] at equal tokens, 3
        pairs (bound +0.0200)', or the same with 'continues' for an arm that was not stopped."""
        what = f"stopped at rung {self.rung} ({self.scale})" if self.stopped else f"continues after rung {self.rung} ({self.scale})"
        if not math.isfinite(self.dloss):
            return f"{what}: no paired verdict ({self.note or f'{self.n_pairs} pairs'})"
        ci = f" [{self.low:+.4f}, {self.high:+.4f}]" if math.isfinite(self.low) else ""
        return (
            f"{what}: Δ={self.dloss:+.4f} nats{ci} at {CURRENCY_WORDS.get(self.currency, self.currency)}, "
            f"{self.n_pairs} pairs (bound +{self.bound:g})"
        )

    def to_json(self) -> str:
        """The evidence as one JSON object (NaN as null), for an MLflow tag."""
        d = asdict(self)
        return json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()})

    @classmethod
    def from_json(cls, text: str) -> GateEvidence:
        """Inverse of ``to_json``. Raises ValueError (json.JSONDecodeError, KeyError as
        ValueError) on text that is not a recorded evidence."""
        d = json.loads(text)
        try:

            def num(k: str) -> float:
                return float("nan") if d[k] is None else float(d[k])

            return cls(
                corpus=str(d["corpus"]),
                variant=str(d["variant"]),
                reference=str(d["reference"]),
                scale=str(d["scale"]),
                rung=int(d["rung"]),
                currency=str(d["currency"]),
                bound=num("bound"),
                dloss=num("dloss"),
                low=num("low"),
                high=num("high"),
                n_pairs=int(d["n_pairs"]),
                p_value=num("p_value"),
                level=num("level"),
                stopped=bool(d["stopped"]),
                skipped=tuple(d.get("skipped") or ()),
                note=str(d.get("note") or ""),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a gate evidence record: {e}") from None


def stops(gate: GateSpec, dloss: float, low: float) -> bool:
    """The gate's rule: the paired Δ (nats/token) is above ``gate.worse_than`` and the
    interval's low end is above zero; False when either is NaN (no verdict never stops)."""
    return math.isfinite(dloss) and math.isfinite(low) and dloss > gate.worse_than and low > 0


class GateDecider(Protocol):
    """What the gated protocol calls after each rung: the evidence of every (corpus, variant)
    of ``variants`` against ``reference`` at ``scale`` (rung ``rung``, 1-based), read from the
    study's MLflow store (``orchestrator.report.gate.decide`` is the product's)."""

    def __call__(
        self, tracking_uri: str, study: str, reference: str, gate: GateSpec, scale: str, rung: int, variants: Sequence[str]
    ) -> list[GateEvidence]: ...


def rungs(reference: str, runs: list[RunSpec]) -> list[str]:
    """The scales of ``runs`` as rungs: ordered by the reference's N (non-embedding parameters,
    its planned x1 run; a scale without one by the largest N planned there), ties in plan order."""
    n: dict[str, int] = {}
    for r in runs:
        if r.variant == reference and r.extend == 1.0:
            n[r.scale] = r.n_params
    order = list(dict.fromkeys(r.scale for r in runs))
    for s in order:
        n.setdefault(s, max(r.n_params for r in runs if r.scale == s))
    return sorted(order, key=lambda s: (n[s], order.index(s)))


def gate_compute(reference: str, runs: list[RunSpec]) -> tuple[float, float]:
    """(worst case, best case) training FLOPs of ``runs``: every run trains; every non-reference
    arm stopped after the first rung (its runs at the other rungs never train)."""
    ladder = rungs(reference, runs)
    worst = float(sum(r.total_flops for r in runs))
    best = float(sum(r.total_flops for r in runs if r.variant == reference or r.scale == ladder[0]))
    return worst, best


def gate_summary(gate: GateSpec, reference: str, runs: list[RunSpec]) -> str:
    """``qkstudy plan``'s lines on a gated study: the rungs and both compute bounds (FLOPs)."""
    ladder = rungs(reference, runs)
    worst, best = gate_compute(reference, runs)
    return (
        f"gate: a variant with paired Δloss > +{gate.worse_than:g} nats at {CURRENCY_WORDS[gate.currency]} (its "
        f"{gate.level:.0%} interval excluding zero) stops; rungs by N: {' < '.join(ladder)}\n"
        f"gate compute: worst case {worst:.3e} FLOPs (every run trains), best case {best:.3e} FLOPs "
        f"(every non-reference arm stopped after rung 1, {ladder[0]}: {best / worst:.1%} of the worst)"
    )
