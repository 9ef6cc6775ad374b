"""The plan's contract: what a plan is made of and how a run is named, for the planner and
every module that reads or makes runs (the ladder, branches, tuning, the runner, the report).

``RunSpec`` (one planned run, JSON round-trippable) with its ``TrainRecipe`` and
``ResourcesSpec`` (also the spec's ``resources:`` section), ``PlanError`` (a study that
validates but cannot be planned), and the identity: ``run_identity`` (the hash of a run's
identity payload) and ``IDENTITY_VERSION`` (in every payload). What the payload holds is the
planner's (``orchestrator.plan.planner``, "Run identity"); changing a default here or moving
code never changes an id. Pure: pydantic only, no other module of the package, so the spec
and every plan module can import it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

__all__ = ["IDENTITY_VERSION", "PlanError", "ResourcesSpec", "RunSpec", "TrainRecipe", "run_identity"]

# Bump when a code change alters what an unchanged config computes, so old runs re-train.
# 2: the corpus's content hash joined the identity; one eval subset per run (curve and final).
IDENTITY_VERSION = 2


class PlanError(ValueError):
    """The study validates but cannot be planned (e.g. a budget below one optimizer step);
    ``field``: the spec field to fix (``budget.tokens``), None when no one field is at fault."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


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


class ResourcesSpec(BaseModel):
    """Per-run resources: Ray Train workers and what each takes; DeepSpeed ZeRO stage."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(default=1, gt=0)
    cpus_per_worker: float = Field(default=1.0, gt=0)
    # 0 (CPU) or 1: a worker is one rank driving one device (DeepSpeed's LOCAL_RANK device).
    gpus_per_worker: float = 0.0
    # Unset: 1 with GPUs, 2 on CPU. With GPUs (bf16) only stage 1 is accepted: it is the one
    # stage where DeepSpeed accumulates gradients in fp32 (run.worker.optim.deepspeed_config).
    zero_stage: Literal[0, 1, 2, 3] = 2
    max_retries: int = Field(default=1, ge=0)
    # Runs trained back to back by one Ray Train worker group. Starting a group (controller,
    # worker processes, process group, imports, DeepSpeed engine) costs 10-25 s on 2 CPUs, each
    # further run of a group 0.5-0.7 s (BENCHMARKS.md), which dominates runs of a minute or two.
    # auto: one group per slot the cluster has at the start (run.driver.packing); a number:
    # fixed groups of that many consecutive runs. Either way a run keeps the group it was first
    # launched in, so a resubmit finds its checkpoints.
    runs_per_trainer: int | Literal["auto"] = "auto"
    # torch.compile the model in each worker (nn.Module.compile: in place, same state-dict
    # keys, so checkpoints are unchanged). Off by default: on 2 CPU cores it made cpu-xs and
    # cpu-s steps 2-6% slower and cost 16-22 s before the first step (BENCHMARKS.md). Not in
    # the run id: the same run, computed another way.
    compile: bool = False
    # Memory of one device (GiB); `validate`/`run` refuse a run whose estimate
    # (orchestrator.plan.memory) exceeds it. None: not checked.
    device_memory_gb: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _default_stage_by_device(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("zero_stage") is None:
            return {**data, "zero_stage": 1 if data.get("gpus_per_worker") else 2}
        return data

    @field_validator("workers", "max_retries", mode="before")
    @classmethod
    def _counts_not_flags_text_or_fractions(cls, v: Any) -> Any:
        # no coercion (as data_pipeline.config.NumbersStrict, which this leaf cannot import):
        # true, "2" and 2.0 are typos, not counts
        if isinstance(v, bool | str | float):
            raise ValueError(f"must be an integer, not {v!r}")
        return v

    @field_validator("zero_stage", "gpus_per_worker", mode="before")
    @classmethod
    def _numbers_not_flags_or_text(cls, v: Any) -> Any:
        # no coercion: true and "1" are typos, not a stage or a GPU count
        if isinstance(v, bool | str):
            raise ValueError(f"must be a number (got {v!r})")
        return v

    @field_validator("zero_stage")
    @classmethod
    def _fp32_accumulation_on_gpu(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("gpus_per_worker") and v != 1:
            raise ValueError(
                f"must be 1 with GPUs (got {v}): only ZeRO stage 1 accumulates bf16 gradients in fp32 in DeepSpeed "
                "(stage 0 refuses fp32 accumulation, stages 2 and 3 accumulate in bf16)"
            )
        return v

    @field_validator("gpus_per_worker")
    @classmethod
    def _one_device_per_worker(cls, v: float) -> float:
        # A fraction packs two ranks on one GPU, which NCCL refuses; more than one leaves Ray's
        # devices and the one DeepSpeed drives (LOCAL_RANK) disagreeing: more workers instead.
        if v not in (0, 1):
            raise ValueError(f"must be 0 (CPU) or 1 (got {v!r}): a worker drives one GPU; for more GPUs per run, use more workers")
        return v

    @field_validator("runs_per_trainer", mode="before")
    @classmethod
    def _runs_per_trainer_ok(cls, v: Any) -> Any:
        # one message for both forms; no coercion (true, "2" and 2.0 are typos, not counts)
        if v == "auto" and isinstance(v, str) or isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v
        raise ValueError(f"must be an integer >= 1 or 'auto' (got {v!r})")


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
    diagnostics_every_evals: int = 1  # attention diagnostics at every n-th evaluation and the last
    corpus: dict[str, Any]
    tokenizer: dict[str, Any]
    resources: ResourcesSpec
    # The folder the corpus's relative paths name files in (the spec's; data_pipeline's
    # CorpusConfig.root): where to read, not what is read, so never in the identity.
    corpus_root: str | None = None
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
