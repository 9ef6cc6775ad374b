"""QK transforms: the stage between the Q/K projection and the scoring kernel.

Every transform maps (q, k), each shaped [B, T, H, head_dim], to new (q, k) of the same
shape, acting on each token and head independently, so causality and the fused SDPA path
are untouched. Variants (arXiv 2604.01683):

* `IdentityQK` (standard, differential): no change.
* `CoupledQK`: evolve (q, k) jointly for `n_steps` steps of size dt with a coupling MLP f.
    Euler (simultaneous):   q' = q + dt * k ;  k' = k + dt * f(q)
    Leapfrog (Stormer-Verlet):
        k_half = k + dt/2 * f(q) ;  q' = q + dt * k_half ;  k' = k_half + dt/2 * f(q')
  Leapfrog is volume preserving and exactly invertible for any f; Euler is neither.
  Chained leapfrog steps reuse the last evaluation f(q') as the first half-kick of the
  next step, so n steps cost n + 1 evaluations of f (Euler: n evaluations).
* `UncoupledQK` (the paper's "uncoupled MLP" control): q' = q + dt * f(q), k unchanged,
  for n_steps steps (n evaluations of f), with the same f as `CoupledQK`.

dt parametrisation: one unconstrained learned scalar per head (shape [H, 1], broadcast
over tokens and head_dim), initialised to `dt_init` (default 0.1). It is not forced
positive: a negative dt is the time-reversed flow, which keeps leapfrog invertible, and
dt = 0 recovers standard attention exactly.

f is head_dim -> hidden -> head_dim with SiLU (`CouplingMLP`), one per layer shared by all
heads (default, +0.11% parameters at 60M as in the paper) or one per head. Its biases start
at zero, so f(0) = 0: f has no input-independent output at init (see `CouplingMLP`). Shared f runs
all heads and tokens through one matmul on a [B*T*H, head_dim] view; per-head f is one
batched matmul over heads. There are no Python loops over heads; the only loop is over
integration steps, which are sequential by definition.

FLOPs (forward, per token, per layer): each evaluation of f costs
2 * (head_dim * hidden + hidden * head_dim) per head (matmuls only, as everywhere in this
package; the integrator's axpy updates, biases and SiLU are elementwise and not counted).

Implementations: `coupled_flow` / `uncoupled_flow` are the eager reference, pure functions
of (q, k, dt, f's weights); a transform's `impl` ("auto", "eager", "fused", "compile") picks
it, the hand-fused autograd Functions, or torch.compile of it (`model.fused_qk`, where
"auto" is defined). All compute the same function to float tolerance.

Options (`DynamicsOptions`, `CoupledOptions`, defined torch-free in `model.options`) and the factories `coupled_qk` / `uncoupled_qk`
are what `model.registry` names for the variants built from these transforms.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.contract import StageConfig
from model.fused_qk import Weights, compiled, fused_coupled, fused_uncoupled, resolve_impl
from model.init import uniform_
from model.options import CoupledOptions, DynamicsOptions


class CouplingMLP(nn.Module):
    """f: head_dim -> hidden -> head_dim with SiLU, shared per layer (groups=1) or per head.

    Input/output [B, T, H, head_dim]. Weights are stored in nn.Linear layout
    ([groups, out, in]) and drawn like nn.Linear's (uniform, bound 1/sqrt(fan_in), variance
    1/(3 fan_in)); both biases start at zero.

    Scale at init: for inputs whose components have std s (q at init: s = 0.02 * sqrt(d_model),
    0.23 at cpu-xs, 0.45 at 60m), each layer scales the std by 1/sqrt(3) and SiLU by about 1/2
    near 0, so std f(q) ~ s / 6 (measured 0.16 s to 0.18 s for s <= 0.45, head_dim 32 and
    64): a sixth of q's scale, not q's. Zero biases give f(0) = 0, so f has no
    input-independent output. A constant output c would shift every query of `UncoupledQK`
    by dt * c (a per-key score bias, which changes attention) but every key of `CoupledQK`
    by dt * c (a per-query constant, which softmax cancels): it would perturb the control
    and the coupled model differently. With it gone, each starts as standard attention plus
    its own q-dependent term only (uncoupled: dt * f(q); coupled: dt * k into q, dt * f(q)
    into k).
    """

    def __init__(self, head_dim: int, hidden: int, n_head: int, sharing: str):
        super().__init__()
        if sharing not in ("layer", "head"):
            raise ValueError(f"coupling_sharing must be 'layer' or 'head', got {sharing!r}")
        groups = 1 if sharing == "layer" else n_head
        self.head_dim, self.hidden, self.n_head = head_dim, hidden, n_head
        self.w1 = nn.Parameter(torch.empty(groups, hidden, head_dim))
        self.b1 = nn.Parameter(torch.empty(groups, hidden))
        self.w2 = nn.Parameter(torch.empty(groups, head_dim, hidden))
        self.b2 = nn.Parameter(torch.empty(groups, head_dim))
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Redraw w1 then w2 from generator (None: the global RNG); zero both biases."""
        for w, b, fan_in in ((self.w1, self.b1, self.head_dim), (self.w2, self.b2, self.hidden)):
            uniform_(w, 1.0 / math.sqrt(fan_in), generator)
            with torch.no_grad():
                b.zero_()

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w1, b1, w2, b2), the arguments of `mlp`."""
        return self.w1, self.b1, self.w2, self.b2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mlp(x, *self.weights())

    def num_flops_per_token(self) -> int:
        """Forward FLOPs of one evaluation of f for all heads of one token (matmuls only)."""
        return self.n_head * 2 * (2 * self.head_dim * self.hidden)


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """f(x) = w2 silu(w1 x + b1) + b2 for x [B, T, H, D]; weights as `CouplingMLP`'s (groups 1 or H)."""
    if w1.shape[0] == 1:  # shared: one GEMM over every (token, head) row
        return F.linear(F.silu(F.linear(x, w1[0], b1[0])), w2[0], b2[0])
    B, T, H, D = x.shape  # per head: one batched GEMM with heads as the batch
    xh = x.permute(2, 0, 1, 3).reshape(H, B * T, D)
    h = F.silu(torch.baddbmm(b1.unsqueeze(1), xh, w1.transpose(1, 2)))
    y = torch.baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2))
    return y.view(H, B, T, D).permute(1, 2, 0, 3)


def _dt_per_channel(dt: torch.Tensor, head_dim: int) -> torch.Tensor:
    """dt [H, 1] repeated over each head's channels, [H * head_dim]: the integrator's updates
    then run on flat [B, T, H * head_dim] views whose contiguous rows vectorise (a [H, 1] dt
    broadcast over [B, T, H, head_dim] leaves head_dim-long inner loops, ~10x slower)."""
    return dt.expand(-1, head_dim).reshape(-1)


def coupled_flow(
    q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor, w: Weights, integrator: str, n_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager coupled dynamics (module docstring): q, k [B, T, H, D], dt [H, 1], w = f's
    (w1, b1, w2, b2) -> (q', k'). A function of its arguments only, so one torch.compile of
    it serves every layer (`model.fused_qk`)."""
    shape = q.shape
    q, k, dt = q.flatten(2), k.flatten(2), _dt_per_channel(dt, shape[-1])

    def f(x: torch.Tensor) -> torch.Tensor:  # f on flat [B, T, H*hd] views
        return mlp(x.view(shape), *w).flatten(2)

    if integrator == "euler":
        for _ in range(n_steps):
            q, k = torch.addcmul(q, dt, k), torch.addcmul(k, dt, f(q))
        return q.view(shape), k.view(shape)
    half = 0.5 * dt
    fq = f(q)
    for _ in range(n_steps):
        k_half = torch.addcmul(k, half, fq)
        q = torch.addcmul(q, dt, k_half)
        fq = f(q)  # reused as the next step's first half-kick
        k = torch.addcmul(k_half, half, fq)
    return q.view(shape), k.view(shape)


def uncoupled_flow(q: torch.Tensor, dt: torch.Tensor, w: Weights, n_steps: int) -> torch.Tensor:
    """Eager uncoupled control: q' = q + dt f(q), n_steps times; shapes as `coupled_flow`."""
    shape = q.shape
    dt = _dt_per_channel(dt, shape[-1])
    for _ in range(n_steps):
        q = torch.addcmul(q.flatten(2), dt, mlp(q, *w).flatten(2)).view(shape)
    return q


class IdentityQK(nn.Module):
    """No QK transform (standard and differential attention)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def num_flops_per_token(self, seq_len: int) -> int:
        return 0


class DynamicsQK(nn.Module):
    """Shared state of the learned-dynamics transforms: f, per-head dt, step count."""

    def __init__(self, n_head: int, head_dim: int, hidden: int, sharing: str, n_steps: int, dt_init: float):
        super().__init__()
        if not 1 <= n_steps <= 7:
            raise ValueError(f"n_steps must be in 1..7, got {n_steps}")
        self.n_steps = n_steps
        self.dt_init = dt_init
        self.f = CouplingMLP(head_dim, hidden, n_head, sharing)
        self.dt = nn.Parameter(torch.full((n_head, 1), float(dt_init)))
        self.impl = "auto"  # which implementation runs (`model.fused_qk`); `GPT.set_qk_impl` sets it

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Redraw f from generator (None: the global RNG); dt back to dt_init."""
        self.f.reset_parameters(generator)
        with torch.no_grad():
            self.dt.fill_(self.dt_init)

    def n_evaluations(self) -> int:
        return self.n_steps

    def _impl(self, x: torch.Tensor) -> str:
        return resolve_impl(self.impl, x)

    def num_flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs per token: evaluations of f x FLOPs of one evaluation (per-token
        work, so seq_len is ignored)."""
        return self.n_evaluations() * self.f.num_flops_per_token()


class CoupledQK(DynamicsQK):
    """Coupled QK dynamics (Euler or leapfrog), see the module docstring.

    forward(q, k): q, k [B, T, H, head_dim] -> (q', k') of the same shape.
    """

    def __init__(self, n_head: int, head_dim: int, hidden: int, sharing: str, n_steps: int, dt_init: float, integrator: str):
        super().__init__(n_head, head_dim, hidden, sharing, n_steps, dt_init)
        if integrator not in ("euler", "leapfrog"):
            raise ValueError(f"integrator must be 'euler' or 'leapfrog', got {integrator!r}")
        self.integrator = integrator

    def n_evaluations(self) -> int:
        return self.n_steps + 1 if self.integrator == "leapfrog" else self.n_steps

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        impl = self._impl(q)
        fn = fused_coupled if impl == "fused" else compiled(coupled_flow) if impl == "compile" else coupled_flow
        return fn(q, k, self.dt, self.f.weights(), self.integrator, self.n_steps)


class UncoupledQK(DynamicsQK):
    """Uncoupled MLP control: q' = q + dt * f(q) for n_steps steps, k unchanged.

    forward(q, k): q, k [B, T, H, head_dim] -> (q', k).
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        impl = self._impl(q)
        fn = fused_uncoupled if impl == "fused" else compiled(uncoupled_flow) if impl == "compile" else uncoupled_flow
        return fn(q, self.dt, self.f.weights(), self.n_steps), k


def _dynamics_args(cfg: StageConfig, o: DynamicsOptions) -> dict:
    return dict(
        n_head=cfg.n_head,
        head_dim=cfg.head_dim,
        hidden=o.coupling_hidden or cfg.head_dim,
        sharing=o.coupling_sharing,
        n_steps=o.n_steps,
        dt_init=o.dt_init,
    )


def coupled_qk(cfg: StageConfig) -> CoupledQK:
    """The `CoupledQK` of a config whose options are `CoupledOptions`."""
    o = CoupledOptions(**cfg.options)
    return CoupledQK(**_dynamics_args(cfg, o), integrator=o.integrator)


def uncoupled_qk(cfg: StageConfig) -> UncoupledQK:
    """The `UncoupledQK` of a config whose options are `DynamicsOptions`."""
    return UncoupledQK(**_dynamics_args(cfg, DynamicsOptions(**cfg.options)))
