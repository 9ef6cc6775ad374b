"""`gated_qk`: an example plug-in variant, a learned gate on each head's queries.

q' = q * (1 + tanh(g_h)), k' = k, with one scalar g per head and layer, zero at init (so the
first forward is standard attention's). Importing this module registers the variant; qkstudy
imports it through the ``qkstudy.variants`` entry point (when installed) or a spec's
``plugins: [qkstudy_gated_qk]`` (when the folder lies beside the spec).

Counts: n_layer * n_head parameters; no model FLOPs (the gate is elementwise, and the model-FLOP
convention counts matmuls only).
"""

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from model import Variant, register
from model.stage_counts import Contributions


class GateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gate_init: float = Field(default=0.0, ge=-3, le=3)  # g at init; 0 is standard attention


class QueryGate(nn.Module):
    """(q, k) [B, T, n_head, head_dim] -> (q * (1 + tanh(g)), k), g [n_head]."""

    def __init__(self, n_head: int, gate_init: float):
        super().__init__()
        self.gate_init = gate_init
        self.g = nn.Parameter(torch.empty(n_head))
        self.reset_parameters()

    def reset_parameters(self, generator=None):
        with torch.no_grad():
            self.g.fill_(self.gate_init)

    def forward(self, q, k):
        return q * (1 + torch.tanh(self.g))[:, None], k

    def num_flops_per_token(self, seq_len):
        return 0


def query_gate(cfg):
    return QueryGate(cfg.n_head, GateOptions(**cfg.options).gate_init)


register(
    Variant(
        "gated_qk",
        "example plug-in: q scaled by 1 + tanh(g) per head, then SDPA",
        GateOptions,
        qk_transform=query_gate,
        counts=lambda cfg: Contributions(cfg.n_layer * cfg.n_head, 0, 0),
    )
)
