"""Options of the learned-dynamics variants, torch-free (config validation, the planner and
the analytic counts read them without importing torch; `model.coupled` builds from them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DynamicsOptions(BaseModel):
    """Options of the learned-dynamics variants (`uncoupled_mlp`, and with `integrator` the
    coupled ones), with their defaults.

    n_steps: integration steps, 1..7. coupling_hidden: hidden width of f (None: head_dim).
    coupling_sharing: "layer" (one f shared by the layer's heads) or "head" (one f per head).
    dt_init: initial value of the learned per-head step dt.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_steps: int = Field(default=1, ge=1, le=7)
    coupling_hidden: int | None = Field(default=None, gt=0)
    coupling_sharing: Literal["layer", "head"] = "layer"
    dt_init: float = 0.1


class CoupledOptions(DynamicsOptions):
    """`DynamicsOptions` plus integrator: "euler" or "leapfrog"."""

    integrator: Literal["euler", "leapfrog"] = "euler"


class NonlinearQOptions(BaseModel):
    """Options of `nonlinear_q` (`model.query.ResidualQueryMLP`), with their defaults.

    bottleneck: the hidden width r of f (d_model -> r -> d_model). None: the width whose
    parameters come nearest what coupled adds at its default options
    (`model.stage_counts.matched_bottleneck`), so the control costs what coupled costs; the
    paper's own setting is r = d_model / 2 (d^2 + O(d) parameters per layer).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    bottleneck: int | None = Field(default=None, gt=0)
