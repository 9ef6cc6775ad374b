"""Planner: a Study becomes a list of compute-matched RunSpecs.

Compute matching (DESIGN.md, "Compute matching"): per scale the reference variant gets the
study's token budget D_ref; in ``flops`` mode the budget is C = D_ref x F_ref (F = training
FLOPs per token, 3 x forward, from ``model.count_model``) and variant v trains C / F_v
tokens; in ``tokens`` mode every variant trains D_ref; in ``wallclock`` mode every variant
trains for the reference's seconds at its own throughput (a table passed in by the caller,
``orchestrator.plan.throughput``; the planner reads no file and measures nothing). ``extend`` adds reference runs of
e x D_ref tokens, each with its own full schedule; under ``protocol: branches`` those
reference runs are one trunk and its cooldown branches (``orchestrator.plan.branch_runs``). Budgets round to whole optimizer steps
(global_batch x seq_len tokens), so matched FLOPs agree within one step's worth of tokens.

Run identity: ``run_id`` is the first 16 hex digits of the SHA-256 of the canonical JSON of
everything that changes what a run computes (variant and options, model config, scale,
seed, token budget and schedule, eval cadence, corpus and tokenizer config, the corpus's
content hash, and ``IDENTITY_VERSION``; both in ``orchestrator.plan.contract``) and nothing that does not (workers, ZeRO stage,
storage, tracking URI, the throughput figures themselves). Same config and same data, same
id: re-submitting a study finds its finished runs by id; editing one corpus file gives its
runs new ids (new MLflow runs, new Ray Train names), and the runner marks the old ones
superseded. The content hash (``orchestrator.plan.inputs.corpus_hashes``: data_pipeline's
cache key, over every input file's sha256 and the corpus and tokenizer configs) is passed
in, like the throughput table, so the planner stays pure.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from model import ModelCounts, count_model
from model.plugins import plugin_of
from orchestrator.plan.branch_runs import BranchFamily, branch_family
from orchestrator.plan.contract import IDENTITY_VERSION, PlanError, RunSpec, TrainRecipe, run_identity
from orchestrator.plan.recipe import BETAS
from orchestrator.plan.spec import Study, VariantSpec
from orchestrator.plan.throughput import ThroughputTable, declared_throughput


def resolve_train(study: Study, scale: str) -> TrainRecipe:
    """Merge the study's train section over the recipe of ``study.scale(scale)``; KeyError for
    a scale the study does not have."""
    rs = study.scale(scale)
    r = rs.recipe
    t = study.train
    global_batch = t.global_batch or r.global_batch
    return TrainRecipe(
        seq_len=t.seq_len or rs.seq_len,
        global_batch=global_batch,
        micro_batch=min(t.micro_batch or r.micro_batch, global_batch),
        lr=t.lr or r.lr,
        schedule=t.schedule,
        warmup_steps=0,  # set per run from its step count
        decay_fraction=t.decay_fraction,
        min_lr_ratio=t.min_lr_ratio,
        weight_decay=t.weight_decay,
        betas=BETAS,
        grad_clip=t.grad_clip,
        log_every_steps=t.log_every_steps,
    )


def _mqar_params(corpus: dict[str, Any]) -> dict[str, Any]:
    from data_pipeline import CorpusConfig

    return CorpusConfig.model_validate(corpus).resolved_mqar().resolved()


def _reference_tokens(study: Study, scale: str, n_params_ref: int) -> int:
    b = study.budget
    if b.tokens_per_param is not None:
        return int(round(b.tokens_per_param * n_params_ref))
    tokens = b.tokens[scale] if isinstance(b.tokens, dict) else b.tokens
    assert tokens is not None  # BudgetSpec validates: exactly one of tokens, tokens_per_param
    return int(tokens)


def _steps_for(tokens: float, tokens_per_step: int) -> int:
    return max(1, int(round(tokens / tokens_per_step)))


def plan(
    study: Study,
    throughput: ThroughputTable | None = None,
    data: dict[str, str | None] | None = None,
    tuned_lr: dict[tuple[str, str], float] | None = None,
) -> list[RunSpec]:
    """Expand a study into runs, ordered by corpus, scale, variant, seed, then extend.

    Args:
        throughput: tokens/s per scale and variant (``orchestrator.plan.throughput``), read
            only in ``wallclock`` mode; the spec's declared ``budget.throughput`` takes
            precedence over it.
        data: corpus name -> content hash (``orchestrator.plan.inputs.corpus_hashes``); it
            enters every run's identity. Without it (or with None for a corpus) the ids cover
            the configs only: every product caller passes it (``plan.inputs.plan_study``).
        tuned_lr: (variant, scale) -> peak LR chosen by tuning (``orchestrator.plan.tune_plan``);
            it replaces the recipe's LR of that arm's runs and so enters their identity.
        Callers load both: the planner itself touches no disk and no hardware.

    Raises:
        PlanError: a budget that rounds to less than one optimizer step, a wallclock study
            without the throughput of every variant, or ``data`` without a hash for a corpus.
    """
    table = declared_throughput(study) or throughput or {}
    runs: list[RunSpec] = []
    for corpus_name, corpus in study.corpus_map.items():
        if data is not None and corpus_name not in data:
            raise PlanError(f"no content hash given for corpus {corpus_name!r} (have {sorted(data)})")
        data_hash = data[corpus_name] if data is not None else None
        runs.extend(_plan_corpus(study, corpus_name, corpus.model_dump(mode="json"), table, data_hash, tuned_lr or {}))
    return runs


def _calibration_record(study: Study, scale: str, table: ThroughputTable) -> dict[str, Any] | None:
    """What a wallclock run records about the throughput its budget came from (RunSpec)."""
    if study.budget.mode != "wallclock":
        return None
    return {
        "source": "spec" if study.budget.throughput else "calibration",
        "digest": run_identity(table),
        "tokens_per_s": dict(table.get(scale) or {}),
    }


def _plan_corpus(
    study: Study,
    corpus_name: str,
    corpus: dict[str, Any],
    table: ThroughputTable,
    data_hash: str | None,
    tuned_lr: dict[tuple[str, str], float],
) -> list[RunSpec]:
    """Every run of one corpus: per scale, the reference budget, then each variant's."""
    runs: list[RunSpec] = []
    # MQAR brings its own vocabulary (no tokenizer); text corpora use the tokenizer's.
    mqar = _mqar_params(corpus) if corpus.get("source") == "mqar" else None
    vocab = mqar["vocab_size"] if mqar else study.tokenizer.vocab_size
    for scale in study.scales:
        base = _scale_recipe(study, scale, mqar)
        tps = base.tokens_per_step
        config = partial(study.scale(scale).model_config, vocab_size=vocab, seq_len=base.seq_len, architecture=study.architecture)
        configs = {v.name: config(v.model_variant, **v.options) for v in study.variants}
        counts = {name: count_model(cfg) for name, cfg in configs.items()}
        ref = counts[study.reference]
        d_ref = _reference_tokens(study, scale, ref.n_params)
        if d_ref < tps:
            raise PlanError(
                f"budget for scale {scale} is {d_ref} tokens, less than one optimizer step "
                f"({base.global_batch} x {base.seq_len} = {tps} tokens)",
                "budget",
            )
        ref_steps = _steps_for(d_ref, tps)
        eval_every = max(1, study.eval.every_tokens // tps) if study.eval.every_tokens else max(1, ref_steps // study.eval.num_evals)
        extra = {"data_hash": data_hash, "calibration": _calibration_record(study, scale, table)}
        for v in study.variants:
            d_v = _variant_tokens(study, scale, v.name, d_ref, ref, counts[v.name], table)
            branched = study.protocol == "branches" and v.name == study.reference
            multipliers = [1.0] + (list(study.extend) if v.name == study.reference and not branched else [])
            lr = tuned_lr.get((v.name, scale)) or v.lr or base.lr
            for seed in study.seeds:
                make = partial(
                    _run_spec,
                    study,
                    corpus_name,
                    corpus,
                    v,
                    scale,
                    seed,
                    model_cfg=configs[v.name].model_dump(),
                    c=counts[v.name],
                    eval_every=eval_every,
                    extra=extra,
                )
                if branched:
                    runs.extend(_branched_runs(branch_family(study, d_v, base.model_copy(update={"lr": lr})), make))
                    continue
                for e in multipliers:
                    steps = _steps_for(d_v * e, tps)
                    train = base.model_copy(update={"warmup_steps": int(round(study.train.warmup_fraction * steps)), "lr": lr})
                    runs.append(make(e=e, steps=steps, train=train))
    return runs


def _branched_runs(family: BranchFamily, make: partial[RunSpec]) -> list[RunSpec]:
    """The RunSpecs of one branched family (``orchestrator.plan.branch_runs``): the trunk first,
    then each branch, which names the trunk's run_id (so it enters the branch's identity)."""
    t = family.trunk
    trunk = make(e=t.multiplier, steps=t.total_steps, train=family.recipe, branch=family.trunk_fields())
    return [
        trunk,
        *(make(e=b.multiplier, steps=b.total_steps, train=family.recipe, branch=family.branch_fields(b, trunk)) for b in family.branches),
    ]


def _scale_recipe(study: Study, scale: str, mqar: dict[str, Any] | None) -> TrainRecipe:
    """The scale's resolved recipe, checked against the workers and an MQAR corpus's windows."""
    base = resolve_train(study, scale)
    if base.global_batch % study.resources.workers:
        raise PlanError(
            f"train.global_batch {base.global_batch} (at scale {scale}) is not divisible by "
            f"resources.workers {study.resources.workers}: every worker takes an equal share",
            "resources.workers",
        )
    if mqar and base.seq_len != mqar["seq_len"]:
        why = f"train.seq_len {base.seq_len} must equal the MQAR corpus's seq_len {mqar['seq_len']} (each example is one window)"
        raise PlanError(why, "train.seq_len")
    return base


def _variant_tokens(
    study: Study, scale: str, variant: str, d_ref: int, ref: ModelCounts, counts: ModelCounts, table: ThroughputTable
) -> float:
    """Variant's token budget before step rounding: D_ref (tokens), D_ref x F_ref / F_v
    (flops) or D_ref x tokens/s_v / tokens/s_ref (wallclock, from ``table``)."""
    mode = study.budget.mode
    if mode == "tokens":
        return d_ref
    if mode == "flops":
        return d_ref * ref.flops_per_token / counts.flops_per_token
    thr = table.get(scale)
    if not thr or variant not in thr or study.reference not in thr:
        raise PlanError(
            f"budget.mode wallclock needs the throughput of every variant at scale {scale}: "
            "declare budget.throughput (tokens/s per variant) or measure it with "
            "`qkstudy calibrate SPEC`",
            "budget.throughput",
        )
    return d_ref * thr[variant] / thr[study.reference]


def _run_spec(
    study: Study,
    corpus_name: str,
    corpus: dict[str, Any],
    v: VariantSpec,
    scale: str,
    seed: int,
    e: float,
    model_cfg: dict[str, Any],
    c: ModelCounts,
    steps: int,
    train: TrainRecipe,
    eval_every: int,
    extra: dict[str, Any],
    branch: dict[str, Any] | None = None,
) -> RunSpec:
    """One RunSpec, its ``run_id`` hashed from what it computes (module docstring); ``extra``
    holds its ``data_hash`` (in the identity) and ``calibration`` record (not in it);
    ``branch`` (protocol: branches only, so independent ids are unchanged) its trunk,
    branch_step and branch_points, which enter the identity."""
    identity = {
        "v": IDENTITY_VERSION,
        "variant": v.name,
        "model_variant": v.model_variant,
        # Options enter through model_cfg, resolved with their defaults: `coupled` and
        # `{name: coupled, options: {integrator: euler, n_steps: 1}}` are one run.
        "model": model_cfg,
        "scale": scale,
        "seed": seed,
        "steps": steps,
        "train": train.model_dump(),
        "eval": [eval_every, study.eval.max_windows, study.eval.final_max_windows, study.eval.diagnostics],
        "corpus": corpus,
        "tokenizer": study.tokenizer.model_dump(mode="json"),
        "data": extra["data_hash"],
    }
    if study.eval.diagnostics and study.eval.diagnostics_every_evals != 1:  # the default keeps earlier ids
        identity["eval"].append({"diagnostics_every_evals": study.eval.diagnostics_every_evals})
    if branch is not None:
        identity["branch"] = {"protocol": "branches", **branch}
    plugin = plugin_of(v.model_variant)
    if plugin is not None:  # changed plug-in code is a new run; built-in ids are unchanged
        identity["plugin"] = plugin.identity()
    tokens = steps * train.tokens_per_step
    return RunSpec(
        study=study.name,
        run_id=run_identity(identity),
        corpus_name=corpus_name,
        variant=v.name,
        model_variant=v.model_variant,
        options=v.options,
        scale=scale,
        seed=seed,
        extend=e,
        model=model_cfg,
        n_params=c.n_params,
        n_params_total=c.n_params_total,
        flops_per_token=c.flops_per_token,
        steps=steps,
        tokens=tokens,
        total_flops=tokens * c.flops_per_token,
        train=train,
        eval_every_steps=eval_every,
        eval_max_windows=study.eval.max_windows,
        final_max_windows=study.eval.final_max_windows,
        diagnostics=study.eval.diagnostics,
        diagnostics_every_evals=study.eval.diagnostics_every_evals,
        checkpoint_every_evals=study.eval.checkpoint_every_evals,
        corpus=corpus,
        corpus_root=study.corpus_map[corpus_name].root,
        tokenizer=study.tokenizer.model_dump(mode="json"),
        resources=study.resources,
        plugin=None if plugin is None else {**plugin.identity(), "path": plugin.path},
        **extra,
        **(branch or {}),
    )
