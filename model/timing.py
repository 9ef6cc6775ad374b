"""Timed optimizer steps of a variant at a preset: what throughput calibration measures.

A step is one full optimizer step (forward, backward, AdamW) of a model built with seed 0 on
one fixed random batch of ``batch_size`` x ``seq_len`` tokens. Units: ``timed_steps`` gives
wall-clock and process CPU seconds per step and, on CUDA, the peak memory the steps added in
GiB; ``tokens_per_second`` gives tokens per wall-clock second of one process (one worker).

A variant spec is NAME or NAME:opt=value,opt=value with options of `build_config`, plus
impl=auto|eager|fused|compile (how its QK transform runs, `model.fused_qk`). The step-time
benchmark (`python -m benchmarks.model_steps`) and ``qkstudy calibrate`` time the same steps.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.config import ModelConfig
from model.fused_qk import check_impl
from model.gpt import GPT
from model.presets import build_config


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """'coupled:integrator=leapfrog,n_steps=2' -> ('coupled', {'integrator': 'leapfrog', 'n_steps': 2}).
    Raises ValueError for an option without '='."""
    name, _, rest = spec.partition(":")
    opts: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"variant spec {spec!r}: option {item!r} is not key=value")
        for convert in (int, float):
            try:
                opts[key] = convert(value)
                break
            except ValueError:
                continue
        else:
            opts[key] = None if value == "None" else value
    return name, opts


@dataclass(frozen=True)
class StepOptions:
    """How steps run. impl: QK transform implementation of every spec without its own impl=
    (`model.fused_qk.QK_IMPLS`); amp: "auto" (bf16 autocast on CUDA, none elsewhere), "bf16"
    or "none"; sdpa: "auto" (PyTorch picks the backend) or "flash" (only the flash kernel)."""

    impl: str = "auto"
    amp: str = "auto"
    sdpa: str = "auto"

    def context(self, device: str) -> contextlib.ExitStack:
        """The autocast and SDPA-backend contexts a step runs in (a fresh ExitStack)."""
        stack = contextlib.ExitStack()
        device_type = torch.device(device).type
        if self.amp == "bf16" or (self.amp == "auto" and device_type == "cuda"):
            stack.enter_context(torch.autocast(device_type, dtype=torch.bfloat16))
        if self.sdpa == "flash":
            stack.enter_context(sdpa_kernel(SDPBackend.FLASH_ATTENTION))
        return stack


@dataclass
class StepRun:
    """One variant under timing: its config, model (seed 0), AdamW and fixed batch."""

    spec: str
    cfg: ModelConfig
    model: GPT
    opt: torch.optim.Optimizer
    idx: torch.Tensor  # [batch, seq_len + 1] fixed random tokens
    impl: str  # the model's QK implementation setting


def build_runs(
    preset: str, specs: list[str], batch_size: int, vocab_size: int, seq_len: int | None, device: str, impl: str
) -> list[StepRun]:
    """One model (seed 0), AdamW and fixed batch per spec; 'standard' first. A spec's impl=
    option overrides impl. Raises ValueError for a bad spec or impl."""
    if specs[0] != "standard":
        specs = ["standard", *[s for s in specs if s != "standard"]]
    runs = []
    for spec in specs:
        name, opts = parse_variant(spec)
        run_impl = check_impl(str(opts.pop("impl", impl)))
        cfg = build_config(preset, name, vocab_size=vocab_size, seq_len=seq_len, **opts)
        model = GPT(cfg, seed=0, qk_impl=run_impl).to(device)
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, vocab_size, (batch_size, cfg.seq_len + 1), generator=g).to(device)
        runs.append(StepRun(spec, cfg, model, torch.optim.AdamW(model.parameters(), lr=3e-4), idx, run_impl))
    return runs


def train_step(run: StepRun, options: StepOptions) -> None:
    """One optimizer step (forward, backward, AdamW) on the run's fixed batch."""
    run.opt.zero_grad(set_to_none=True)
    with options.context(str(run.idx.device)):
        _, loss = run.model(run.idx[:, :-1], run.idx[:, 1:])
    cast(torch.Tensor, loss).backward()  # not None: targets were given
    run.opt.step()


def timed_steps(run: StepRun, steps: int, options: StepOptions) -> tuple[float, float, float | None]:
    """(wall seconds, process CPU seconds) per step over ``steps`` steps, and on CUDA the peak
    memory [GiB] the steps added to what was allocated before them (None elsewhere)."""
    cuda = run.idx.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        train_step(run, options)
    if cuda:
        torch.cuda.synchronize()
    wall, cpu = (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps
    return wall, cpu, (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else None


def tokens_per_second(
    preset: str,
    specs: list[str],
    steps: int,
    batch_size: int,
    vocab_size: int,
    seq_len: int | None,
    device: str,
    warmup: int = 1,
    options: StepOptions = StepOptions(),
) -> dict[str, float]:
    """{spec: tokens per wall-clock second} of ``steps`` timed optimizer steps of each spec,
    after ``warmup`` untimed steps each (a compiled transform compiles then); the specs are
    timed one after another in their order, 'standard' first (``build_runs``).
    Raises ValueError for a bad spec (`parse_variant`, `build_config`) or impl."""
    runs = build_runs(preset, specs, batch_size, vocab_size, seq_len, device, options.impl)
    for run in runs:
        for _ in range(warmup):
            train_step(run, options)
    return {run.spec: batch_size * run.cfg.seq_len / timed_steps(run, steps, options)[0] for run in runs}
