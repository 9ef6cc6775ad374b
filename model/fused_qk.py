"""Fast paths of the learned-dynamics QK transforms (`model.coupled`), and which one runs.

The eager transforms are a chain of small kernels per integration step (two axpys, f's two
GEMMs with biases, SiLU) that autograd doubles in backward with its own products, broadcast
reductions for dt's gradient, accumulations and copies: memory-bound passes over [B, T, H, D]
tensors that do not shrink with more threads. Three implementations compute the same
function; `QK_IMPLS` names them:

* "eager": the reference (`model.coupled.coupled_flow` / `uncoupled_flow`) under autograd.
* "fused": the autograd Functions below, whose backward is written out: one pass per needed
  product, dt's gradient accumulated over all steps in one buffer and reduced once, f's
  weight gradients as GEMMs, no autograd bookkeeping between ops (about 17 tensor-sized
  kernels per Euler step, forward and backward, against about 25). Same math as eager, so
  equal to float tolerance (tests/model/test_fused_qk.py; `torch.autograd.gradcheck` in float64).
* "compile": `torch.compile` of the eager function (inductor fuses the elementwise work into
  six kernels around f's GEMMs; on CUDA, Triton). One compiled function serves every layer
  (parameters are arguments, not module state): a process compiles once per integrator,
  step count and shape.
* "auto" (default) picks: eager when no gradient is being recorded (evaluation: nothing to
  fuse in a backward); compile on CUDA when it can build there (`model.toolchain`: Triton, a C
  compiler and Python.h; without them it logs why once and goes on below); eager under autocast
  elsewhere (the fused Functions run in their inputs' dtypes, autocast's casts would not
  reach their backward); fused otherwise, i.e. CPU training. Measured at cpu-s on 2 shared
  cores, one thread (BENCHMARKS.md, 2026-12-01 11:54): step-time ratio to standard eager
  1.049, fused 1.049, compile 1.045 for a FLOP ratio of 1.018. On CPU the fewer kernels
  do not show at this size (GEMMs dominate the step); compiling costs seconds per process
  (not timed in BENCHMARKS.md), more than it could save, so CPU does not compile unless asked
  (`GPT.set_qk_impl("compile")`). The GPU figures come from scripts/gpu_check.sh.

Shapes: q, k [B, T, H, head_dim]; dt [H, 1]; f's weights w1 [G, hidden, head_dim],
b1 [G, hidden], w2 [G, head_dim, hidden], b2 [G, head_dim] with G = 1 (shared by the
layer's heads) or H (one f per head). Inside, tensors are [N, H, head_dim] with N = B * T,
and f runs on [G, M, head_dim] groups (G = 1: M = N * H rows, one GEMM; G = H: M = N).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from model.toolchain import compile_unavailable

QK_IMPLS = ("auto", "eager", "fused", "compile")
Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # w1, b1, w2, b2


def check_impl(impl: str) -> str:
    """impl if it is one of `QK_IMPLS`; ValueError naming the allowed values otherwise."""
    if impl not in QK_IMPLS:
        raise ValueError(f"unknown QK transform implementation {impl!r}; allowed: {', '.join(QK_IMPLS)}")
    return impl


def resolve_impl(impl: str, x: torch.Tensor) -> str:
    """The implementation that runs for input x: impl itself, or what "auto" picks (module
    docstring).

    Raises:
        RuntimeError: "fused" under autocast (unsupported, see above); "compile" where
            torch.compile cannot build (`model.toolchain.compile_unavailable` names what is missing).
    """
    autocast = torch.is_autocast_enabled(x.device.type)
    if impl == "auto":
        if not torch.is_grad_enabled():
            return "eager"
        if x.device.type == "cuda":
            why = compile_unavailable("cuda")
            if why is None:
                return "compile"
            _warn_no_compile(why)
        return "eager" if autocast else "fused"
    if impl == "fused" and autocast:
        raise RuntimeError("the fused QK transform does not run under autocast; use 'compile' or 'eager'")
    if impl == "compile" and (why := compile_unavailable(x.device.type)):
        raise RuntimeError(f"the QK transform cannot compile: {why}; use 'eager' or 'fused', or install them")
    return impl


@functools.cache
def _warn_no_compile(why: str) -> None:
    """Said once per process and reason: the fallback changes the arm's speed, never its math."""
    logging.getLogger(__name__).warning("QK transform: %s; running it uncompiled (eager or fused) instead", why)


_COMPILED: dict[Callable, Callable] = {}


def compiled(fn: Callable) -> Callable:
    """torch.compile(fn), built on first use and kept for the process (one per function)."""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, fullgraph=True)
    return _COMPILED[fn]


# -- f on groups: forward, and backward by hand ------------------------------------------
def _to_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, H, D] -> [G, M, D]: G = 1 -> [1, N*H, D] (a copy if x is strided); G = H -> [H, N, D] (a view)."""
    return x.reshape(1, -1, x.shape[-1]) if groups == 1 else x.transpose(0, 1)


def _from_groups(y: torch.Tensor, n_head: int) -> torch.Tensor:
    """[G, M, D] -> [N, H, D] (a view)."""
    return y.view(-1, n_head, y.shape[-1]) if y.shape[0] == 1 else y.transpose(0, 1)


def _f_forward(x: torch.Tensor, w: Weights) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """f(x) for x [N, H, D] -> ([N, H, D], what `_f_backward` needs: input groups, pre-activation, hidden)."""
    w1, b1, w2, b2 = w
    xg = _to_groups(x, w1.shape[0])
    pre = torch.baddbmm(b1.unsqueeze(1), xg, w1.transpose(1, 2))
    h = F.silu(pre)
    return _from_groups(torch.baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2)), x.shape[1]), (xg, pre, h)


def _f_backward(g: torch.Tensor, saved: tuple[torch.Tensor, ...], w: Weights, grads: list[torch.Tensor | None]) -> torch.Tensor:
    """Gradient of f's input for output gradient g [N, H, D]; adds f's weight gradients
    (w1, b1, w2, b2 order) into grads."""
    w1, _, w2, _ = w
    xg, pre, h = saved
    gg = _to_groups(g, w1.shape[0])
    gpre = torch.ops.aten.silu_backward(torch.bmm(gg, w2), pre)
    for i, gw in enumerate((torch.bmm(gpre.transpose(1, 2), xg), gpre.sum(1), torch.bmm(gg.transpose(1, 2), h), gg.sum(1))):
        acc = grads[i]
        grads[i] = gw if acc is None else acc.add_(gw)
    return _from_groups(torch.bmm(gpre, w1), g.shape[1])


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1])  # [B, T, H, D] -> [N, H, D], a view for split() outputs


def _per_channel(dt: torch.Tensor, head_dim: int) -> torch.Tensor:
    """dt [H, 1] -> [H, head_dim], contiguous: broadcast over [N, H, D] the updates then run
    on H*D-long rows (a [H, 1] broadcast leaves head_dim-long inner loops)."""
    return dt.expand(-1, head_dim).contiguous()


def _addprod(buf: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, value: float = 1.0) -> torch.Tensor:
    """buf + value * a * b, in place into buf (None: a new tensor)."""
    if buf is None:
        return torch.mul(a, b) if value == 1.0 else torch.mul(a, b).mul_(value)
    return buf.addcmul_(a, b, value=value)


def _dt_grad(buf: torch.Tensor | None) -> torch.Tensor:
    """dt's gradient [H, 1] from the per-element products buf [N, H, D] summed over steps."""
    assert buf is not None  # n_steps >= 1
    return buf.sum(0).sum(1, keepdim=True)


class _Saved:
    """Tensors a Function keeps for backward, in named lists (saved through
    ctx.save_for_backward, so autograd checks they were not modified in place)."""

    @staticmethod
    def save(ctx: Any, **lists: list[torch.Tensor]) -> None:
        ctx.names, ctx.sizes = list(lists), [len(v) for v in lists.values()]
        ctx.save_for_backward(*(t for v in lists.values() for t in v))

    @staticmethod
    def load(ctx: Any) -> dict[str, list[torch.Tensor]]:
        flat, out, i = ctx.saved_tensors, {}, 0
        for name, n in zip(ctx.names, ctx.sizes):
            out[name], i = list(flat[i : i + n]), i + n
        return out


def _backward_state(ctx: Any) -> tuple[dict[str, list[torch.Tensor]], Weights, list[torch.Tensor | None]]:
    """The saved lists, f's weights as `_f_backward` reads them (biases unread), and empty
    gradient slots for (w1, b1, w2, b2)."""
    s = _Saved.load(ctx)
    w1, w2 = s["w"][0], s["w"][1]
    return s, (w1, w1, w2, w2), [None, None, None, None]


def _saved_f(s: dict[str, list[torch.Tensor]], j: int) -> tuple[torch.Tensor, ...]:
    return s["xg"][j], s["pre"][j], s["h"][j]


def _evaluate(x: torch.Tensor, w: Weights, keep: dict[str, list[torch.Tensor]]) -> torch.Tensor:
    """f(x), recording its saved activations and output in keep."""
    y, (xg, pre, h) = _f_forward(x, w)
    for name, t in (("xg", xg), ("pre", pre), ("h", h), ("fq", y)):
        keep[name].append(t)
    return y


def _new_keep(*extra: str) -> dict[str, list[torch.Tensor]]:
    return {name: [] for name in ("xg", "pre", "h", "fq", *extra)}


# -- the integrators as autograd Functions ----------------------------------------------
# Notation of the backward passes: gq, gk are the gradients of the current (q, k); buf
# collects the per-element products whose sum is dt's gradient (`_dt_grad`).
class _Euler(torch.autograd.Function):
    """q' = q + dt k ; k' = k + dt f(q), n_steps times (see `model.coupled`)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        dt: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
        n_steps: int,
    ) -> tuple[torch.Tensor, ...]:
        ctx.shape, ctx.n_steps, w = q.shape, n_steps, (w1, b1, w2, b2)
        q, k, dtc = _flat(q), _flat(k), _per_channel(dt, q.shape[-1])
        keep = _new_keep("k")
        for _ in range(n_steps):
            fq = _evaluate(q, w, keep)
            keep["k"].append(k)
            q, k = torch.addcmul(q, dtc, k), torch.addcmul(k, dtc, fq)
        _Saved.save(ctx, w=[w1, w2, dtc], **keep)
        return q.view(ctx.shape), k.view(ctx.shape)

    @staticmethod
    def backward(ctx: Any, gq: torch.Tensor, gk: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        s, w, grads = _backward_state(ctx)
        dtc = s["w"][2]
        gq, gk = _flat(gq), _flat(gk)
        buf = None
        for j in reversed(range(ctx.n_steps)):
            buf = _addprod(_addprod(buf, gq, s["k"][j]), gk, s["fq"][j])
            g_f = gk * dtc
            gk = torch.addcmul(gk, dtc, gq)  # q' = q + dt k
            gq = _f_backward(g_f, _saved_f(s, j), w, grads).add_(gq)  # k' = k + dt f(q)
        return gq.reshape(ctx.shape), gk.reshape(ctx.shape), _dt_grad(buf), *grads, None


class _Leapfrog(torch.autograd.Function):
    """Stormer-Verlet with the last f(q') reused as the next first half-kick (`model.coupled`).

    Backward: a = gradient of the half-step key kh_j; fq_j kicks k twice for 0 < j < n (the
    second half-kick of step j-1 and the first of step j, gradient dt * a_j) and once at the
    ends (dt/2 times the gradient of the key it kicks)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        dt: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
        n_steps: int,
    ) -> tuple[torch.Tensor, ...]:
        ctx.shape, ctx.n_steps, w = q.shape, n_steps, (w1, b1, w2, b2)
        q, k, dtc = _flat(q), _flat(k), _per_channel(dt, q.shape[-1])
        half, keep = 0.5 * dtc, _new_keep("kh")
        fq = _evaluate(q, w, keep)
        for _ in range(n_steps):
            kh = torch.addcmul(k, half, fq)
            q = torch.addcmul(q, dtc, kh)
            fq = _evaluate(q, w, keep)
            k = torch.addcmul(kh, half, fq)
            keep["kh"].append(kh)
        _Saved.save(ctx, w=[w1, w2, dtc, half], **keep)
        return q.view(ctx.shape), k.view(ctx.shape)

    @staticmethod
    def backward(ctx: Any, gq: torch.Tensor, gk: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (s, w, grads), n = _backward_state(ctx), ctx.n_steps
        dtc, half = s["w"][2:]
        gq, gk = _flat(gq), _flat(gk)
        g_f, buf = gk * half, None  # g_f: gradient of fq_n (the last half-kick)
        for j in reversed(range(n)):
            gq = _f_backward(g_f, _saved_f(s, j + 1), w, grads).add_(gq)  # all of q_{j+1}'s gradient
            a = torch.addcmul(gk, dtc, gq)  # kh_j feeds q_{j+1} (times dt) and k_{j+1}
            buf = _addprod(_addprod(buf, gq, s["kh"][j]), gk, s["fq"][j + 1], 0.5 if j == n - 1 else 1.0)
            g_f, gk = a * (dtc if j > 0 else half), a
        gq = _f_backward(g_f, _saved_f(s, 0), w, grads).add_(gq)
        buf = _addprod(buf, gk, s["fq"][0], 0.5)
        return gq.reshape(ctx.shape), gk.reshape(ctx.shape), _dt_grad(buf), *grads, None


class _Uncoupled(torch.autograd.Function):
    """q' = q + dt f(q), n_steps times; k is not an input (it passes unchanged)."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, dt: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, n_steps: int
    ) -> torch.Tensor:
        ctx.shape, ctx.n_steps, w = q.shape, n_steps, (w1, b1, w2, b2)
        q, dtc = _flat(q), _per_channel(dt, q.shape[-1])
        keep = _new_keep()
        for _ in range(n_steps):
            q = torch.addcmul(q, dtc, _evaluate(q, w, keep))
        _Saved.save(ctx, w=[w1, w2, dtc], **keep)
        return q.view(ctx.shape)

    @staticmethod
    def backward(ctx: Any, gq: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        s, w, grads = _backward_state(ctx)
        dtc = s["w"][2]
        gq, buf = _flat(gq), None
        for j in reversed(range(ctx.n_steps)):
            buf = _addprod(buf, gq, s["fq"][j])
            gq = _f_backward(gq * dtc, _saved_f(s, j), w, grads).add_(gq)
        return gq.reshape(ctx.shape), _dt_grad(buf), *grads, None


def fused_coupled(
    q: torch.Tensor, k: torch.Tensor, dt: torch.Tensor, w: Weights, integrator: str, n_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused `model.coupled.coupled_flow`: same arguments, same result to float tolerance."""
    fn = _Leapfrog if integrator == "leapfrog" else _Euler
    return fn.apply(q, k, dt, *w, n_steps)


def fused_uncoupled(q: torch.Tensor, dt: torch.Tensor, w: Weights, n_steps: int) -> torch.Tensor:
    """The fused `model.coupled.uncoupled_flow`: same arguments, same result to float tolerance."""
    return _Uncoupled.apply(q, dt, *w, n_steps)
