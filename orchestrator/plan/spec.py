"""Study specs: the YAML files in ``jobs/`` parsed into pydantic models.

A spec names only what the study varies (scales, variants, seeds, budget, corpus); the rest
comes from the recipe (``orchestrator.plan.recipe``), the model presets, and the base spec it
``extends`` (``orchestrator.plan.specfile``: shared cluster and corpus blocks). Validation is
total and happens before anything runs: an unknown variant option fails here, not an hour
into a cluster job. ``load_spec`` collects every error with its file and field path so the
CLI can print them all and exit with code 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from data_pipeline import CorpusConfig, TokenizerConfig
from data_pipeline.config import NumbersStrict
from model.config import Architecture
from model.plugins import PluginError, load_entry_points, load_plugin
from orchestrator.plan import recipe
from orchestrator.plan.branches import Protocol, protocol_problems
from orchestrator.plan.contract import ResourcesSpec
from orchestrator.plan.devices import PEAK_FLOPS, peak_flops_of
from orchestrator.plan.gate import GateSpec
from orchestrator.plan.ladder import LadderRung, ScaleShape
from orchestrator.plan.overrides import apply_overrides, spec_error
from orchestrator.plan.scale import ResolvedScale
from orchestrator.plan.scales import LadderScale, ScaleEntry, dispatch_entries, resolve_scales
from orchestrator.plan.specfile import (
    Layer,
    Loc,
    SpecError,
    loc_str,
    merge_layers,
    origin,
    raise_problems,
    read_layers,
    validation_problems,
)
from orchestrator.plan.tracking_uri import tracking_uri_problem
from orchestrator.plan.tuning import TuneSpec
from orchestrator.plan.uri_secrets import credentials_problem

__all__ = [
    "SpecError",
    "Study",
    "VariantSpec",
    "BudgetSpec",
    "DeclaredMFU",
    "TrainSpec",
    "EvalSpec",
    "ScaleShape",
    "LadderScale",
    "TuneSpec",
    "GateSpec",
    "default_workdir",
    "parse_spec",
    "load_spec",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
STUDY_NAME_RULE = "study names use letters, digits, '_', '.', '-' (at most 64), starting alphanumeric"


def study_name_ok(name: str) -> bool:
    """Whether ``name`` can be a study's name (an MLflow experiment, a folder under runs/)."""
    return _NAME_RE.match(name) is not None


WORKDIR_ROOT = Path("runs")
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit signed seed


def default_workdir(study_name: str) -> Path:
    """Where a study keeps its embedded state unless its spec says ``workdir``: ``runs/<name>``
    under the current folder (absolute)."""
    return (WORKDIR_ROOT / study_name).resolve()


class _Strict(NumbersStrict):
    model_config = ConfigDict(extra="forbid")


class VariantSpec(_Strict):
    """One arm of the study.

    ``name`` is the label that MLflow's ``variant`` tag and the report use; ``kind`` is the
    model variant (``model.VARIANTS``), defaulting to ``name``; ``options`` are passed to
    ``model.build_config`` (e.g. ``integrator: leapfrog``, ``n_steps: 3``). ``lr``
    overrides the peak learning rate for this variant only (e.g. an LR sweep arm).
    """

    name: str
    kind: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    lr: float | None = Field(default=None, gt=0)

    @property
    def model_variant(self) -> str:
        """The ``model.VARIANTS`` name this arm builds: ``kind``, else ``name``."""
        return self.kind or self.name

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("variant names use letters, digits, '_', '.', '-' (at most 64)")
        return v

    @model_validator(mode="after")
    def _kind_known(self) -> VariantSpec:
        from model import VARIANTS
        from model.registry import resolve_options

        if self.model_variant not in VARIANTS:
            field = "kind" if self.kind else "name"
            raise ValueError(f"{field}: unknown variant {self.model_variant!r}; allowed: {', '.join(VARIANTS)}")
        try:  # options do not depend on the scale: checked here, before anything counts parameters with them
            resolve_options(self.model_variant, self.options)
        except ValueError as e:
            raise_problems("VariantSpec", [(("options",), str(e))])
        return self


class DeclaredMFU(_Strict):
    """A declared model FLOPs utilization: the share ``mfu`` of each device's peak dense bf16
    FLOP/s the runs are expected to use, the peak given as ``peak_tflops`` or by ``device``
    name (``orchestrator.plan.devices.PEAK_FLOPS``: H100, H100 PCIe, H100 NVL, H200, H200 NVL, A100, L40S, A10G, L4)."""

    mfu: float = Field(gt=0, le=1)
    peak_tflops: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    device: str | None = None

    @model_validator(mode="after")
    def _one_peak(self) -> DeclaredMFU:
        if (self.peak_tflops is None) == (self.device is None):
            raise ValueError("budget.throughput: give exactly one of peak_tflops or device beside mfu")
        if self.device is not None and peak_flops_of(self.device) is None:
            raise ValueError(
                f"budget.throughput.device: unknown device {self.device!r}; known: {', '.join(PEAK_FLOPS)} (or give peak_tflops)"
            )
        return self

    @property
    def peak_flops(self) -> float:
        """Peak dense bf16 FLOP/s of one device."""
        return self.peak_tflops * 1e12 if self.peak_tflops is not None else peak_flops_of(self.device or "") or 0.0


MAX_TOKENS = 10**15  # a run's token budget: a thousand times the largest public pretraining runs


class BudgetSpec(_Strict):
    """How long each run trains.

    ``mode``: ``tokens`` gives every variant the same tokens; ``flops`` gives every variant
    the reference variant's FLOPs (tokens_v = C / flops_per_token_v); ``wallclock`` gives
    every variant the reference's wall-clock at a measured or declared throughput.
    Size (exactly one): ``tokens`` (an int, or a mapping scale -> int) for the reference
    variant, or ``tokens_per_param`` (D = k * N, N non-embedding, of the reference variant).
    ``throughput``: declared tokens/s per variant name (used by ``wallclock`` and for the
    device-hours estimate of ``qkstudy plan``; measured by calibration when absent), or a
    declared MFU (``{mfu: 0.35, peak_tflops: 989}`` or ``{mfu: 0.35, device: H100}``,
    ``DeclaredMFU``) from which ``qkstudy plan`` estimates device-hours without calibrating.
    ``max_epochs``: the most passes over its corpus's unique train tokens a run may make
    (``orchestrator.plan.epochs``); ``validate`` and ``run`` refuse a run over it.
    """

    mode: Literal["tokens", "flops", "wallclock"] = "flops"
    tokens: int | dict[str, int] | None = None
    tokens_per_param: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
    throughput: DeclaredMFU | dict[str, float] | None = None
    max_epochs: float = Field(default=4.0, gt=0, le=1e6, allow_inf_nan=False)

    @field_validator("throughput", mode="before")
    @classmethod
    def _mfu_form(cls, v: Any) -> Any:
        # a mapping with `mfu` is a declared MFU; any other mapping is tokens/s per variant
        return DeclaredMFU.model_validate(v) if isinstance(v, dict) and "mfu" in v else v

    @field_validator("tokens")
    @classmethod
    def _tokens_positive(cls, v: int | dict[str, int] | None) -> int | dict[str, int] | None:
        for scale, n in v.items() if isinstance(v, dict) else [(None, v)]:
            if n is not None and n <= 0:
                raise ValueError(f"budget tokens{'' if scale is None else f' of {scale}'} must be positive, got {n}")
            if n is not None and n > MAX_TOKENS:  # past it, FLOP counts leave float range: a typo, not a study
                raise ValueError(f"budget tokens{'' if scale is None else f' of {scale}'} must be at most {MAX_TOKENS:.0e}, got {n}")
        return v

    @model_validator(mode="after")
    def _one_size(self) -> BudgetSpec:
        if (self.tokens is None) == (self.tokens_per_param is None):
            raise ValueError("give exactly one of budget.tokens or budget.tokens_per_param")
        for k, v in (self.throughput if isinstance(self.throughput, dict) else {}).items():
            if not v > 0:
                raise ValueError(f"budget.throughput[{k}] must be positive tokens/s, got {v}")
        return self


class TrainSpec(_Strict):
    """Optimizer and schedule. ``None`` fields come from the scale's recipe.

    ``global_batch`` is in sequences per optimizer step (all workers); ``micro_batch`` is the
    per-worker ceiling; gradient accumulation is derived (see ``orchestrator.batching``).
    ``schedule``: ``cosine`` (linear warmup, cosine to ``min_lr_ratio`` x peak) or ``wsd``
    (warmup, stable, then linear decay over the last ``decay_fraction`` of steps).
    """

    seq_len: int | None = Field(default=None, gt=0)
    global_batch: int | None = Field(default=None, gt=0)
    micro_batch: int | None = Field(default=None, gt=0)
    lr: float | None = Field(default=None, gt=0)
    schedule: Literal["cosine", "wsd"] = recipe.SCHEDULE
    warmup_fraction: float = Field(default=recipe.WARMUP_FRACTION, ge=0, lt=1)
    decay_fraction: float = Field(default=recipe.DECAY_FRACTION, gt=0, le=1)
    min_lr_ratio: float = Field(default=recipe.MIN_LR_RATIO, ge=0, le=1)
    weight_decay: float = Field(default=recipe.WEIGHT_DECAY, ge=0)
    grad_clip: float = Field(default=recipe.GRAD_CLIP, ge=0)
    log_every_steps: int = Field(default=10, gt=0)


class EvalSpec(_Strict):
    """Evaluation cadence.

    Val loss is measured every ``every_tokens`` tokens (default: ``num_evals`` evenly spaced
    points), on a fixed subset of at most ``max_windows`` validation windows; at the end a
    full validation pass over at most ``final_max_windows`` windows (None: all of them).
    Checkpoints are written at every ``checkpoint_every_evals``-th evaluation. Attention
    diagnostics (``diagnostics``: entropy, effective rank, spectral gap of every head's map on a
    probe of 16 windows, ``model.diagnostics``) are measured at every
    ``diagnostics_every_evals``-th evaluation and at the last one: at T = 1024 they cost more
    than the evaluation itself, so a long GPU run asks for them less often. A value other than
    1 enters the run's identity (what is logged differs); 1 keeps the ids runs had before it.
    """

    every_tokens: int | None = Field(default=None, gt=0)
    num_evals: int = Field(default=10, gt=0)
    max_windows: int = Field(default=64, gt=0)
    final_max_windows: int | None = Field(default=None, gt=0)
    diagnostics: bool = True
    diagnostics_every_evals: int = Field(default=1, gt=0, strict=True)
    checkpoint_every_evals: int = Field(default=1, gt=0)


class Study(_Strict):
    """A whole study: every field of a ``jobs/*.yaml`` file.

    ``scales:`` entries are preset names, inline shapes or ladders (``orchestrator.plan.scales``);
    after validation ``scales`` is the list of scale names (presets, shapes and ladder rungs,
    in spec order), ``scale(name)`` its `ResolvedScale` (shape, recipe, N, model config),
    ``scale_shapes`` maps each custom scale's name to its ``ScaleShape`` (a name not in it is
    a preset), ``ladder_rungs`` each rung's target N and exact N. The
    entries as written are ``scale_entries``. ``protocol``: ``independent`` (every reference
    budget trained from scratch) or ``branches`` (cooldowns of one WSD trunk,
    ``orchestrator.plan.branches``). ``tune``: a per-(variant, scale) LR grid
    (``orchestrator.plan.tuning``); it replaces every fixed peak LR. ``plugins``: modules of
    plug-in variants (``model.plugins``), importable from the spec's folder or installed;
    loaded by ``parse_spec`` before the variants are validated. ``architecture``: the backbone
    layout every variant of the study shares (``model.config.Architecture``: GPT-2's by default;
    RoPE, RMSNorm, SwiGLU, QK-norm, a tied head; ``jobs/base/modern.yaml``).
    """

    name: str
    plugins: list[str] = Field(default_factory=list)
    description: str = ""
    # One corpus, or several by name (a corpus-sensitivity study); default: the CPython stdlib.
    corpus: CorpusConfig | None = None
    corpora: dict[str, CorpusConfig] | None = None
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    scale_entries: list[ScaleEntry] = Field(
        alias="scales",
        min_length=1,
        description="Preset names, inline shapes {name, n_layer, d_model, n_head, seq_len?, lr?, global_batch?} "
        "and ladders {ladder: {targets, head_dim, aspect_ratio, ...}}.",
    )
    variants: list[VariantSpec] = Field(min_length=1)
    architecture: Architecture = Field(default_factory=Architecture)
    reference: str = "standard"
    # Pairs the report compares in every currency beside each variant vs the reference.
    contrasts: list[tuple[str, str]] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    budget: BudgetSpec
    extend: list[float] = Field(default_factory=list)
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    protocol: Protocol = "independent"
    tune: TuneSpec | None = None
    gate: GateSpec | None = None
    workdir: str | None = None
    tracking_uri: str | None = None
    storage_path: str | None = None
    _scales: list[str] = PrivateAttr(default_factory=list)
    _resolved: dict[str, ResolvedScale] = PrivateAttr(default_factory=dict)
    # the command-line overrides merged into this spec (``orchestrator.plan.overrides``)
    _overrides: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(STUDY_NAME_RULE)
        return v

    @field_validator("variants", mode="before")
    @classmethod
    def _short_variants(cls, v: Any) -> Any:
        # `- standard` is shorthand for `- {name: standard}`.
        if isinstance(v, list):
            return [{"name": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("variants")
    @classmethod
    def _variant_names_unique(cls, v: list[VariantSpec]) -> list[VariantSpec]:
        names = [x.name for x in v]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names repeat: {names}")
        return v

    @field_validator("contrasts")
    @classmethod
    def _contrasts_ok(cls, v: list[tuple[str, str]], info: ValidationInfo) -> list[tuple[str, str]]:
        names = [x.name for x in info.data.get("variants") or []]
        for i, (a, b) in enumerate(v):
            unknown = [x for x in (a, b) if x not in names]
            if unknown or a == b:
                why = f"names {unknown} not among the variants {names}" if unknown else "compares a variant with itself"
                raise ValueError(f"entry {i} [{a}, {b}] {why}")
        return v

    @field_validator("scale_entries", mode="before")
    @classmethod
    def _dispatch_scales(cls, v: Any) -> Any:
        return dispatch_entries(v)

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_are_integers(cls, v: Any) -> Any:
        # no coercion: true, "3" and 2.0 are typos, not seeds
        for i, s in enumerate(v if isinstance(v, list) else []):
            if not isinstance(s, int) or isinstance(s, bool):
                raise ValueError(f"entry {i} ({s!r}) is not an integer seed")
            if s > MAX_SEED:
                raise ValueError(f"entry {i} ({s}) is past the largest seed torch takes ({MAX_SEED})")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds_unique(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or any(s < 0 for s in v):
            raise ValueError("seeds must be distinct non-negative integers")
        return v

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_uri_ok(cls, v: str | None) -> str | None:
        problem = None if v is None else tracking_uri_problem(v) or credentials_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("storage_path")
    @classmethod
    def _storage_path_ok(cls, v: str | None) -> str | None:
        problem = None if v is None else credentials_problem(v)
        if problem:
            raise ValueError(problem)
        if v is not None and "://" in v and not v.split("://", 1)[1].strip("/"):
            scheme = v.split("://", 1)[0]
            raise ValueError(f"{v!r} names no bucket or folder: write {scheme}://BUCKET/PREFIX")
        if v is not None and not v.strip():
            raise ValueError("is empty: leave it out for the study's own folder (runs/<study>/ray)")
        return v

    @field_validator("extend")
    @classmethod
    def _extend_ok(cls, v: list[float]) -> list[float]:
        for e in v:
            if not (math.isfinite(e) and e > 1):
                raise ValueError(f"extend multipliers must be > 1 (the planned run is 1), got {e}")
        return sorted(set(v))

    @property
    def corpus_map(self) -> dict[str, CorpusConfig]:
        """Corpora by name: ``corpora`` as given, or the single ``corpus`` under its source
        name (the default: the CPython stdlib)."""
        if self.corpora:
            return dict(self.corpora)
        c = self.corpus or CorpusConfig()
        return {c.source: c}

    @property
    def scales(self) -> list[str]:
        """Scale names in spec order: presets, inline shapes, ladder rungs."""
        return list(self._scales)

    def scale(self, name: str) -> ResolvedScale:
        """The resolved scale ``name`` (shape, recipe, N, model config: `ResolvedScale`).

        Raises KeyError naming the study's scales for a name that is not one of them.
        """
        try:
            return self._resolved[name]
        except KeyError:
            raise KeyError(f"no scale {name!r} in study {self.name!r}; scales: {self._scales}") from None

    @property
    def scale_shapes(self) -> dict[str, ScaleShape]:
        """Custom scales (inline shapes and ladder rungs) by name; presets are not in it."""
        return {n: r.shape for n, r in self._resolved.items() if r.shape is not None}

    @property
    def overrides(self) -> list[str]:
        """The ``KEY=VALUE`` overrides set over the spec's files, in order (recorded with each run)."""
        return list(self._overrides)

    @property
    def ladder_rungs(self) -> dict[str, LadderRung]:
        """Ladder rungs by scale name: target N, the shape's exact N and its relative error."""
        return {n: r.rung for n, r in self._resolved.items() if r.rung is not None}

    @model_validator(mode="after")
    def _resolve(self) -> Study:
        """Scales resolved against the variants, the protocol's and tuning's field checks, all
        reported at their own field paths."""
        ref = next((v for v in self.variants if v.name == self.reference), self.variants[0])  # unknown: _cross_checks
        resolved = resolve_scales(self.scale_entries, [v.model_variant for v in self.variants], ref.model_variant, ref.options)
        self._scales, self._resolved = resolved.names, resolved.scales
        problems = resolved.problems + protocol_problems(self.protocol, self.train.schedule, self.extend)
        if self.tune is not None:
            problems += self._fixed_lrs()
        raise_problems("Study", problems + self._gate_problems())
        return self

    def _gate_problems(self) -> list[tuple[Loc, str]]:
        """Why ``gate:`` cannot work on this study: one scale (no larger rung to skip) or one seed
        (no paired interval)."""
        if self.gate is None:
            return []
        why = [
            (len(set(self._scales)) < 2, f"a gate stops an arm at larger rungs: it needs two or more scales, got {self._scales}"),
            (len(self.seeds) < 2, f"a gate decides on a paired interval: it needs two or more seeds, got {self.seeds}"),
        ]
        return [(("gate",), msg) for bad, msg in why if bad]

    def _fixed_lrs(self) -> list[tuple[Loc, str]]:
        """Every fixed peak LR a ``tune:`` grid would silently override, as problems."""
        why = "tune: chooses the peak LR of every (variant, scale); remove this lr or the tune section"
        locs: list[Loc] = [("variants", i, "lr") for i, v in enumerate(self.variants) if v.lr is not None]
        locs += [("scales", i, "lr") for i, e in enumerate(self.scale_entries) if isinstance(e, ScaleShape) and e.lr is not None]
        if self.train.lr is not None:
            locs.append(("train", "lr"))
        return [(loc, why) for loc in locs]

    @model_validator(mode="after")
    def _cross_checks(self) -> Study:
        if self.corpus is not None and self.corpora is not None:
            raise ValueError("give either corpus (one) or corpora (name -> corpus), not both")
        for name in self.corpora or {}:
            if not _NAME_RE.match(name):
                raise ValueError(f"corpora: name {name!r} must use letters, digits, '_', '.', '-'")
        names = [v.name for v in self.variants]
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not one of the variants {names}")
        if isinstance(self.budget.tokens, dict):
            missing = [s for s in self.scales if s not in self.budget.tokens]
            if missing:
                raise ValueError(f"budget.tokens has no entry for scales {missing}")
            unknown = [s for s in self.budget.tokens if s not in self.scales]
            if unknown:  # a typo's budget would be dropped in silence
                raise ValueError(f"budget.tokens names scales the study does not have: {unknown} (scales: {self.scales})")
        if isinstance(self.budget.throughput, dict) and (unknown := [n for n in self.budget.throughput if n not in names]):
            raise ValueError(f"budget.throughput names variants the study does not have: {unknown} (variants: {names})")
        if self.budget.mode == "wallclock" and isinstance(self.budget.throughput, DeclaredMFU):
            raise ValueError(
                "budget.throughput: a declared MFU gives every variant the same FLOP/s, so equal wall-clock would be "
                "equal FLOPs; use mode flops, or declare tokens/s per variant"
            )
        if self.budget.mode == "wallclock" and self.budget.throughput is not None:
            missing = [n for n in names if n not in self.budget.throughput]
            if missing:
                raise ValueError(f"budget.throughput has no tokens/s for variants {missing}")
        return self

    @property
    def workdir_path(self) -> Path:
        """Where the study's embedded state lives (MLflow SQLite, Ray storage, calibration):
        the spec's ``workdir``, else ``default_workdir(name)``. The tracking store in it is
        ``orchestrator.track.tracking.study_tracking_uri``."""
        return Path(self.workdir).resolve() if self.workdir else default_workdir(self.name)

    @property
    def resolved_storage_path(self) -> str:
        """Ray Train storage (checkpoints): the spec's path or URI, else ``<workdir>/ray``."""
        return self.storage_path or str(self.workdir_path / "ray")


def _raise(path: str | Path, problems: list[tuple[Loc, str]], layers: list[Layer] | None, overrides: Sequence[str] = ()) -> NoReturn:
    files = [str(origin(layers, loc)) if layers else str(path) for loc, _ in problems]
    raise spec_error(str(path), [(loc_str(loc), msg) for loc, msg in problems], overrides, files)


def parse_spec(data: Any, path: str | Path = "<spec>", layers: list[Layer] | None = None, overrides: Sequence[str] = ()) -> Study:
    """Validate an already-loaded mapping as a Study; raises SpecError with every problem.

    ``layers``: the files ``data`` was merged from (``load_spec``), so that each problem
    names the file holding the bad field; without them every problem names ``path``.
    ``overrides``: ``KEY=VALUE`` texts set over ``data`` first (``orchestrator.plan.overrides``);
    a problem at or below a field one of them set names that override instead of a file.
    """
    data, _ = apply_overrides(data, overrides, str(path))
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
        raise SpecError(path, [("", f"the spec is {kind}; expected a YAML mapping with name, scales, variants, budget")])
    _load_plugins(data, path, layers, overrides)
    try:
        study = Study.model_validate(data)
    except ValidationError as e:
        _raise(path, validation_problems(e, Study), layers, overrides)
    study._overrides = tuple(overrides)
    if str(path) != "<spec>":  # relative corpus paths name files beside the spec, as extends and plugins do
        folder = str(Path(path).parent)
        if study.corpora:
            study.corpora = {name: c.with_root(folder) for name, c in study.corpora.items()}
        elif study.corpus is not None:
            study.corpus = study.corpus.with_root(folder)
    return study


def _load_plugins(data: dict[str, Any], path: str | Path, layers: list[Layer] | None, overrides: Sequence[str]) -> None:
    """Load the installed plug-ins (entry points) and the spec's ``plugins`` (from the spec's
    folder first), so that its variants validate against them; a plug-in that cannot be
    loaded is a problem of the ``plugins`` field (or of the installed package's entry point)."""
    problems: list[tuple[Loc, str]] = []
    try:
        load_entry_points()
    except PluginError as e:
        # not this spec's fault: every command that reads a spec loads the installed plug-ins
        problems.append(((), f"{e}; fix or uninstall it"))
    names = data.get("plugins")
    folder = Path(path).parent if str(path) != "<spec>" else None
    for i, name in enumerate(names if isinstance(names, list) else []):
        if not isinstance(name, str):
            continue  # the field's own validation says so
        try:
            load_plugin(name, folder)
        except PluginError as e:
            problems.append((("plugins", i), str(e)))
    if problems:
        _raise(path, problems, layers, overrides)


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> Study:
    """Read and validate a study spec file, merged over the bases it ``extends``, with the
    command-line ``overrides`` (``KEY=VALUE``, ``orchestrator.plan.overrides``) set over it.

    Raises:
        SpecError: the file or a base is missing, unreadable, not YAML, empty, ``extends``
            forms a cycle, an override is malformed or cannot be set, or the merged spec fails
            validation; the message names the file (or the override) holding each bad field
            and lists the allowed values.
    """
    layers = read_layers(Path(path))
    if len(layers) == 1:
        return parse_spec(layers[0].data, path, overrides=overrides)
    return parse_spec(merge_layers(layers), path, layers, overrides)
