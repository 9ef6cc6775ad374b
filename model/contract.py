"""The stage contract: what a variant's stages are given and what they report.

Attention is query input -> projection -> QK transform -> scoring -> output projection
(`model.attention`); a variant swaps some of these stages (`model.registry.Variant`). A stage
factory reads a `StageConfig` (a `model.config.ModelConfig` satisfies it) and returns a
torch module that keeps these shapes:

* query input: forward(x) -> x_q, both [B, T, d_model]: what W_Q reads (W_K, W_V read x).
* QK transform: forward(q, k) -> (q', k'), all [B, T, n_head, head_dim].
* scoring: forward(q, k, v) -> [B, T, d_model], with q, k [B, T, n_head, head_dim] and
  v [B, T, d_model]; attention_map(q, k, lam=None) -> maps [B, heads, T, T] (diagnostics;
  `ScoringStage`).
* all: num_flops_per_token(seq_len) -> forward model FLOPs per token (matmuls only, the
  definition's, DESIGN.md; `Stage`); optionally executed_flops_per_token(seq_len) where a
  kernel runs more than the definition (a separate number, never in budgets);
  reset_parameters(generator) if the stage has parameters (`GPT` calls it with the stage's
  own generator, `model.init`). The stage's parameters are its parameter contribution
  (counted from the module).
* the registry entry: counts(cfg) -> `Contributions`, the same contributions by arithmetic,
  torch-free (what the planner uses; `model.stage_counts` for the built-ins).

Standard library only (torch is named for the type checker alone), so this file is the whole
contract a plug-in author reads, and every stage module can annotate against it without
importing the config that validates through the registry that builds the stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["Contributions", "ScoringStage", "Stage", "StageConfig"]


class StageConfig(Protocol):
    """The config fields a stage factory or a variant's counts read (read-only).

    seq_len: maximum context length [tokens]; n_layer, d_model, n_head: depth, width, heads;
    head_dim = d_model / n_head; variant: the registered name; options: the variant's options,
    every default filled in (validate them with the variant's options model).
    """

    @property
    def seq_len(self) -> int: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def n_head(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def variant(self) -> str: ...
    @property
    def options(self) -> Mapping[str, Any]: ...


class Stage(Protocol):
    """What every stage reports: forward model FLOPs per token at seq_len (module docstring)."""

    def num_flops_per_token(self, seq_len: int) -> int: ...


class ScoringStage(Stage, Protocol):
    """A scoring kernel's diagnostics entry point: explicit maps [B, heads, T, T] from q, k
    [B, T, n_head, head_dim]; lam overrides a differential kernel's lambda (module docstring)."""

    def attention_map(self, q: torch.Tensor, k: torch.Tensor, lam: float | None = None) -> torch.Tensor: ...


class Contributions(NamedTuple):
    """What a variant adds to standard attention over the whole model (all layers): parameters
    (all of them non-embedding) and forward FLOPs per token, model and executed."""

    n_params: int
    flops_per_token_fwd: int
    executed_flops_per_token_fwd: int
