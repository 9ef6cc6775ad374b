"""`check_variant`: every guarantee the built-in variants are tested for, run on any variant.

What `qkstudy model check VARIANT` prints, so a plug-in variant's author gets the guarantees
the built-ins have (tests/model/test_variants.py, test_counts.py, test_flops.py hold them to
the same checks). On one config (a preset, the variant's options, a small vocabulary so that
the LM head does not hide the variant's share of the FLOPs):

* stage contract: every layer's query input returns [B, T, d_model] for x [B, T, d_model], its
  QK transform (q', k') shaped like (q, k) [B, T, n_head, head_dim], its scoring [B, T, d_model]
  (`model.registry`'s contract), the logits [B, T, vocab_size];
* forward and backward finite, and every parameter gets a gradient (a parameter left out of
  the graph is a DeepSpeed ZeRO error and a silent no-op otherwise);
* causal: changing the last token changes no earlier logit;
* initial weights a function of the seed: the same seed twice gives the same weights;
* paired by seed: every standard parameter (same name and shape) equals standard's at the same
  seed, so seed-paired comparisons compare the variant, not its draw;
* analytic counts (if the registry entry gives them): parameters, model FLOPs and executed
  FLOPs per token equal what the built stages report (`model.counts.count_instantiated`);
* executed FLOPs measured: the variant-minus-standard training FLOPs per token counted by
  FlopCounterMode equal the analytic executed count (`model.info.check_flop_delta`); the model
  FLOPs (what budgets use) are reported beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from model.config import Architecture, ModelConfig
from model.counts import count_instantiated, count_model
from model.gpt import GPT, STAGES
from model.info import check_flop_delta
from model.presets import PRESETS, build_config
from model.registry import get_variant

__all__ = ["CHECK_VOCAB", "CheckResult", "check_config", "check_variant", "contract_problems"]

CHECK_VOCAB = 256  # small: the LM head is common to every variant and would dominate the FLOPs
BATCH = 2


# what loading a plug-in checks (check names, as check_config lists them)
CONTRACT = (
    "stage contract (shapes)",
    "forward/backward finite, every parameter gets a gradient",
    "analytic parameters and FLOPs equal the built model's",
)
Outcome = tuple[bool | None, str]  # (ok, what was seen) of one check


class CheckResult(NamedTuple):
    """One check: its name, ok (True, False, or None when it does not apply) and what was seen."""

    name: str
    ok: bool | None
    detail: str


def check_variant(
    variant: str,
    preset: str = "cpu-xs",
    seq_len: int | None = None,
    seed: int = 0,
    architecture: Architecture | None = None,
    **options: Any,
) -> list[CheckResult]:
    """Run every check (module docstring) on `variant` at `preset` (vocabulary `CHECK_VOCAB`,
    context seq_len or the preset's, the backbone layout ``architecture``, default GPT-2's)
    with its options.

    Raises ValueError for an unknown preset, variant or option (`model.presets.build_config`).
    Builds the model a few times and runs forward/backward passes on CPU: about a second at
    cpu-xs, tens of seconds at 60m.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    cfg = build_config(preset, variant, vocab_size=CHECK_VOCAB, seq_len=seq_len, architecture=architecture, **options)
    return check_config(cfg, seed)


def check_config(
    cfg: ModelConfig, seed: int = 0, build: Callable[[ModelConfig, int], nn.Module] = GPT, only: tuple[str, ...] | None = None
) -> list[CheckResult]:
    """`check_variant` on a config; build(cfg, seed) makes the model (a GPT); ``only``: the
    names of the checks to run (default all, in the module docstring's order). A check whose
    code raises (a plug-in's stage may raise anything) fails with the exception as its detail."""
    try:
        model = build(cfg, seed)
    except Exception as e:  # noqa: BLE001 - reported, not raised: the table says which variant cannot be built
        return [CheckResult("builds", False, f"{type(e).__name__}: {e}")]
    checks: list[tuple[str, Callable[[], Outcome]]] = [
        ("stage contract (shapes)", lambda: _stage_contract(model, cfg, seed)),
        ("forward/backward finite, every parameter gets a gradient", lambda: _finite_with_gradients(model, cfg, seed)),
        ("causal (the last token changes no earlier logit)", lambda: _causal(model, cfg, seed)),
        ("initial weights a function of the seed", lambda: _seeded(build, cfg, seed)),
        ("shared weights equal standard's at the same seed", lambda: _paired(build, cfg, seed)),
        ("analytic parameters and FLOPs equal the built model's", lambda: _analytic_counts(cfg)),
        ("executed FLOPs measured (FlopCounterMode) equal the analytic ones", lambda: _measured_flops(cfg)),
    ]
    results = []
    for name, check in [c for c in checks if c[0] in only] if only is not None else checks:
        try:
            results.append(CheckResult(name, *check()))
        except Exception as e:  # noqa: BLE001 - as above
            results.append(CheckResult(name, False, f"raised {type(e).__name__}: {e}"))
    return results


def contract_problems(variant: str) -> list[str]:
    """What is wrong with a registered variant's stages at a tiny shape (cpu-xs, T 16, its
    default options): building them, the stage shapes, a finite forward/backward with a
    gradient for every parameter, and its analytic counts if it gives them. Empty when none
    (what loading a plug-in checks, `model.plugins`; `check_variant` is the whole set)."""
    try:
        cfg = build_config("cpu-xs", variant, vocab_size=64, seq_len=16)
    except ValueError as e:  # its default options fail its own validation
        return [str(e)]
    return [f"{r.name}: {r.detail}" for r in check_config(cfg, only=CONTRACT) if r.ok is False]


def _tokens(cfg: ModelConfig, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=g)


@contextmanager
def _recorded(model: nn.Module) -> Iterator[list[tuple[str, tuple, Any]]]:
    """(stage name, input shapes, output) of every stage call while the block runs."""
    seen: list[tuple[str, tuple, Any]] = []

    def hook(name: str) -> Callable[..., None]:
        return lambda _m, args, out: seen.append((name, tuple(tuple(a.shape) for a in args), out))

    handles = [
        getattr(block.attn, stage).register_forward_hook(hook(f"blocks.{i}.attn.{stage}"))
        for i, block in enumerate(cast(nn.ModuleList, model.blocks))
        for stage in STAGES
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _stage_contract(model: nn.Module, cfg: ModelConfig, seed: int) -> Outcome:
    B, T, d, H, hd = BATCH, cfg.seq_len, cfg.d_model, cfg.n_head, cfg.head_dim
    want_in = {"query_input": ((B, T, d),), "qk_transform": ((B, T, H, hd),) * 2, "scoring": ((B, T, H, hd), (B, T, H, hd), (B, T, d))}
    want_out = {"query_input": [(B, T, d)], "qk_transform": [(B, T, H, hd)] * 2, "scoring": [(B, T, d)]}
    crash = None
    with torch.no_grad(), _recorded(model) as seen:
        try:
            logits, _ = model(_tokens(cfg, seed))
        except Exception as e:  # noqa: BLE001 - a wrong shape often crashes a later op: name the stage that made it
            crash, logits = f"{type(e).__name__}: {e}", None
    problems = []
    called = {name for name, _, _ in seen}
    for name, args, out in seen:
        stage = name.rsplit(".", 1)[1]
        got = [tuple(t.shape) for t in (out if isinstance(out, tuple) else (out,))]
        if args != want_in[stage] or got != want_out[stage]:
            problems.append(f"{name}: {list(args)} -> {got}, the contract says {list(want_in[stage])} -> {want_out[stage]}")
    if crash is not None:
        if not problems:
            raise RuntimeError(crash)
        return False, "; ".join(problems[:1]) + f" (then the forward raised {crash})"
    # the identity query input is skipped in forward (one fused QKV matmul): not called is fine for it
    missing = [f"blocks.{i}.attn.{s}" for i in range(cfg.n_layer) for s in STAGES[1:] if f"blocks.{i}.attn.{s}" not in called]
    problems += [f"{name} was never called" for name in missing]
    assert logits is not None  # a crashed forward returned above
    if tuple(logits.shape) != (B, T, cfg.vocab_size):
        problems.append(f"logits {tuple(logits.shape)}, expected {(B, T, cfg.vocab_size)}")
    return (not problems, "; ".join(problems) or f"{len(seen)} stage calls at B={B}, T={T}")


def _finite_with_gradients(model: nn.Module, cfg: ModelConfig, seed: int) -> Outcome:
    model.zero_grad(set_to_none=True)
    idx = _tokens(cfg, seed)
    _, loss = model(idx, targets=idx)
    if loss is None or not torch.isfinite(loss):
        return False, f"loss {loss}"
    loss.backward()
    none = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    problems = [f"no gradient: {', '.join(none)}"] * bool(none) + [f"non-finite gradient: {', '.join(bad)}"] * bool(bad)
    return (not problems, "; ".join(problems) or f"loss {loss.item():.4f}")


def _causal(model: nn.Module, cfg: ModelConfig, seed: int) -> Outcome:
    idx = _tokens(cfg, seed)
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    drift = (a[:, :-1] - b[:, :-1]).abs().max().item()
    return (drift <= 1e-5, f"largest change of an earlier logit {drift:.2e}")


def _differing(a: nn.Module, b: nn.Module, names: list[str]) -> list[str]:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return [n for n in names if n not in pb or pa[n].shape != pb[n].shape or not torch.equal(pa[n], pb[n])]


def _seeded(build: Callable[[ModelConfig, int], nn.Module], cfg: ModelConfig, seed: int) -> Outcome:
    torch.manual_seed(seed + 1)  # another global RNG state: a stage drawing from it shows up
    a = build(cfg, seed)
    torch.manual_seed(seed + 2)
    b = build(cfg, seed)
    bad = _differing(a, b, [n for n, _ in a.named_parameters()])
    return (not bad, f"differ between two builds at seed {seed}: {', '.join(bad)}" if bad else f"seed {seed}, twice")


def _paired(build: Callable[[ModelConfig, int], nn.Module], cfg: ModelConfig, seed: int) -> Outcome:
    std = build(cfg.model_copy(update={"variant": "standard", "options": {}}), seed)
    var = build(cfg, seed)
    names = [n for n, _ in std.named_parameters()]
    bad = _differing(std, var, names)
    detail = f"differ from standard's at seed {seed}: {', '.join(bad)}" if bad else f"{len(names)} standard parameters equal at seed {seed}"
    return not bad, detail


def _analytic_counts(cfg: ModelConfig) -> Outcome:
    if get_variant(cfg.variant).analytic_contributions(cfg) is None:
        return (None, "no analytic counts in the registry entry: counted on the built stages (meta device)")
    analytic, built = count_model(cfg), count_instantiated(cfg)
    fields = ("n_params", "n_params_total", "flops_per_token", "executed_flops_per_token")
    bad = [
        f"{f} {getattr(analytic, f):,} analytic vs {getattr(built, f):,} built" for f in fields if getattr(analytic, f) != getattr(built, f)
    ]
    return (not bad, "; ".join(bad) or f"N {analytic.n_params:,}, training FLOPs/token {analytic.flops_per_token:,}")


def _measured_flops(cfg: ModelConfig) -> Outcome:
    delta = check_flop_delta(cfg)
    std = cfg.model_copy(update={"variant": "standard", "options": {}})
    model_delta = count_model(cfg).flops_per_token - count_model(std).flops_per_token
    detail = (
        f"variant - standard training FLOPs/token: measured {delta.measured:,.0f}, analytic executed {delta.analytic:,}, "
        f"model FLOPs (budgets) {model_delta:,}"
    )
    return delta.ok, detail
