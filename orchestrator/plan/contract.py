"""The plan's contract: what a plan is made of and how a run is named, for the planner and
every module that reads or makes runs (the ladder, branches, tuning, the runner, the report).

``RunSpec`` (one planned run, JSON round-trippable) with its ``TrainRecipe``, ``PlanError``
(a study that validates but cannot be planned), and the identity: ``run_identity`` (the hash
of a run's identity payload) and ``IDENTITY_VERSION`` (in every payload). What the payload
holds is the planner's (``orchestrator.plan.planner``, "Run identity"); changing a default
here or moving code never changes an id. Pure: pydantic and the spec only.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.plan.spec import ResourcesSpec

__all__ = ["IDENTITY_VERSION", "PlanError", "RunSpec", "TrainRecipe", "run_identity"]

# Bump when a code change alters what an unchanged config computes, so old runs re-train.
# 2: the corpus's content hash joined the identity; one eval subset per run (curve and final).
IDENTITY_VERSION = 2


class PlanError(ValueError):
    """The study validates but cannot be planned (e.g. a budget below one optimizer step)."""


class TrainRecipe(BaseModel):
    """The resolved optimizer and schedule of one run (no defaults left open)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_len: int
    global_batch: int
    micro_batch: int
    lr: float
    schedule: str
    warmup_steps: int
    decay_fraction: float
    min_lr_ratio: float
    weight_decay: float
    betas: tuple[float, float]
    grad_clip: float
    log_every_steps: int

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: global_batch sequences x seq_len tokens."""
        return self.global_batch * self.seq_len


class RunSpec(BaseModel):
    """One planned training run: everything a worker needs, JSON round-trippable.

    Units: ``tokens`` (training tokens), ``flops_per_token`` (training FLOPs per token,
    3 x forward), ``total_flops`` = tokens x flops_per_token. ``n_params`` is N, the
    non-embedding parameter count; ``n_params_total`` includes embeddings. ``data_hash``:
    the corpus's content hash the run was planned with (None: planned without one, e.g. an
    older run file). ``calibration`` (wallclock budgets only): where the tokens/s came from
    (``source``: spec or calibration), ``digest`` (of the whole table) and this scale's
    ``tokens_per_s`` per variant, recorded with the run.
    """

    model_config = ConfigDict(extra="forbid")

    study: str
    run_id: str
    corpus_name: str
    variant: str
    model_variant: str
    options: dict[str, Any]
    scale: str
    seed: int
    extend: float
    model: dict[str, Any]
    n_params: int
    n_params_total: int
    flops_per_token: int
    steps: int
    tokens: int
    total_flops: int
    train: TrainRecipe
    eval_every_steps: int
    eval_max_windows: int
    final_max_windows: int | None
    diagnostics: bool
    checkpoint_every_evals: int
    corpus: dict[str, Any]
    tokenizer: dict[str, Any]
    resources: ResourcesSpec
    data_hash: str | None = None
    calibration: dict[str, Any] | None = None
    kind: str = "train"  # or "tune" (orchestrator.plan.tune_plan); in the identity only when not train
    # protocol: branches (orchestrator.plan.branch_runs). A branch starts from the checkpoint
    # its trunk (``trunk``: the trunk's run_id) saved after ``branch_step`` optimizer steps;
    # the trunk (``trunk`` None, ``branch_step`` its own decay start) saves one at each of its
    # ``branch_points``.
    trunk: str | None = None
    branch_step: int | None = None
    branch_points: list[int] = Field(default_factory=list)
    # A plug-in variant's module (``model.plugins.Plugin``): module, version, source_hash (in
    # the identity) and path (its file or folder, sent to the workers as a py_module).
    plugin: dict[str, Any] | None = None

    @property
    def run_name(self) -> str:
        """Human-readable MLflow run name, e.g. ``coupled-cpu-s-s0-x1`` (``@corpus`` appended
        when the study has several corpora)."""
        name = f"{self.variant}-{self.scale}-s{self.seed}-x{_fmt_extend(self.extend)}"
        if self.kind != "train":  # a tuning run: its LR names it, e.g. tune-coupled-cpu-s-lr0.003-s0
            name = f"{self.kind}-{self.variant}-{self.scale}-lr{self.train.lr:g}-s{self.seed}"
        return name if self.corpus_name == self.corpus.get("source") else f"{name}@{self.corpus_name}"

    @property
    def extend_tag(self) -> str:
        """The extend multiplier as MLflow's ``extend`` tag writes it (``1``, ``2.4``)."""
        return _fmt_extend(self.extend)


def _fmt_extend(e: float) -> str:
    return str(int(e)) if float(e).is_integer() else f"{e:g}"


def run_identity(payload: dict[str, Any]) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of ``payload``."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
