"""The fast QK-transform paths (`model.fused_qk`) against the eager reference.

Fused: its hand-written backward is checked by `torch.autograd.gradcheck` (float64, against
finite differences, independent of eager) and, in whole models, forward and every gradient
against eager for each learned-transform variant, both integrators, both f sharings and
several steps. Compiled: the transform against eager per integrator (inductor on CPU).
Negative controls: the same comparisons fail for a dropped dt gradient and a perturbed dt.
"""

import pytest
import torch

import model.fused_qk
from model import GPT, build_config
from model.coupled import CoupledQK, UncoupledQK
from model.fused_qk import fused_coupled, fused_uncoupled, resolve_impl

B, T, H, D, HIDDEN = 2, 3, 2, 4, 3  # gradcheck sizes


def _inputs(groups: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    return r(B, T, 3 * H * D), r(H, 1), (r(groups, HIDDEN, D), r(groups, HIDDEN), r(groups, D, HIDDEN), r(groups, D))


@pytest.mark.parametrize("groups", [1, H])
@pytest.mark.parametrize(
    "flow, n_steps", [("euler", 1), ("euler", 3), ("leapfrog", 1), ("leapfrog", 3), ("uncoupled", 1), ("uncoupled", 2)]
)
def test_fused_backward_passes_gradcheck(flow, n_steps, groups):
    qkv, dt, w = _inputs(groups)

    def fn(qkv, dt, *w):  # q, k as the strided views attention passes (split of the QKV output)
        q, k, _ = (t.view(B, T, H, D) for t in qkv.split(H * D, dim=2))
        if flow == "uncoupled":
            return fused_uncoupled(q, dt, w, n_steps)
        return fused_coupled(q, k, dt, w, flow, n_steps)

    assert torch.autograd.gradcheck(fn, (qkv, dt, *w))


def _loss_and_grads(m: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    m.zero_grad(set_to_none=True)
    _, loss = m(idx, targets=idx)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


IDX = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))


def _assert_same(got: tuple, want: tuple) -> None:
    """Loss and every parameter gradient equal to float32 tolerance: rtol 1e-5, atol 1e-6 of
    the tensor's largest entry (a fixed atol would pass the small gradients of f whatever they were)."""
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert got[1].keys() == want[1].keys() and any(".qk_transform.dt" in n for n in got[1])
    for name, w in want[1].items():
        torch.testing.assert_close(got[1][name], w, rtol=1e-5, atol=1e-6 * w.abs().max().item(), msg=name)


def _compare(variant: str, impl: str, **options) -> None:
    """Loss and gradients of `impl` equal eager's, in float32."""
    m = GPT(build_config("cpu-xs", variant, vocab_size=97, seq_len=16, dt_init=0.5, **options), seed=0)
    m.set_qk_impl("eager")
    want = _loss_and_grads(m, IDX)
    m.set_qk_impl(impl)
    _assert_same(_loss_and_grads(m, IDX), want)


CASES = [
    ("coupled", {}),
    ("coupled", {"integrator": "leapfrog"}),
    ("coupled", {"n_steps": 3, "coupling_sharing": "head"}),
    ("coupled", {"integrator": "leapfrog", "n_steps": 2, "coupling_sharing": "head", "coupling_hidden": 24}),
    ("uncoupled_mlp", {}),
    ("uncoupled_mlp", {"n_steps": 2, "coupling_sharing": "head"}),
    ("coupled_differential", {}),
    ("coupled_differential", {"integrator": "leapfrog", "n_steps": 2}),
]


@pytest.mark.parametrize("variant, options", CASES)
def test_fused_model_equals_eager_forward_and_gradients(variant, options):
    _compare(variant, "fused", **options)


def test_comparison_catches_a_wrong_dt_gradient(monkeypatch):
    """Negative control: fused with dt's gradient dropped must fail the same comparison."""
    monkeypatch.setattr(model.fused_qk, "_dt_grad", lambda buf: torch.zeros(buf.shape[1], 1, dtype=buf.dtype))
    with pytest.raises(AssertionError, match="qk_transform.dt"):
        _compare("coupled", "fused")


def test_tolerance_catches_a_small_perturbation():
    """Negative control: eager against eager with one layer's dt moved by 1e-4 (0.02%) fails
    the comparison used above."""
    cfg = build_config("cpu-xs", "coupled", vocab_size=97, seq_len=16, dt_init=0.5)
    a, b = GPT(cfg, seed=0, qk_impl="eager"), GPT(cfg, seed=0, qk_impl="eager")
    _assert_same(_loss_and_grads(b, IDX), _loss_and_grads(a, IDX))  # identical models pass
    with torch.no_grad():
        b.blocks[0].attn.qk_transform.dt.add_(1e-4)
    with pytest.raises(AssertionError):
        _assert_same(_loss_and_grads(b, IDX), _loss_and_grads(a, IDX))


def _transform(flow: str, impl: str, n_steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    args = dict(n_head=H, head_dim=8, hidden=8, sharing="layer", n_steps=n_steps, dt_init=0.5)
    tr = UncoupledQK(**args) if flow == "uncoupled" else CoupledQK(**args, integrator=flow)
    tr.impl = impl
    return tr


@pytest.mark.parametrize("flow, n_steps", [("euler", 2), ("leapfrog", 1), ("uncoupled", 1)])
def test_compiled_transform_equals_eager(flow, n_steps):
    eager, comp = _transform(flow, "eager", n_steps), _transform(flow, "compile", n_steps)
    x = torch.randn(2, 8, 3 * H * 8, generator=torch.Generator().manual_seed(2))
    outs = []
    for tr in (eager, comp):
        xi = x.clone().requires_grad_()
        q, k, _ = (t.view(2, 8, H, 8) for t in xi.split(H * 8, dim=2))
        q2, k2 = tr(q, k)
        (q2.square().sum() + (k2 * q2).sum()).backward()
        outs.append([q2.detach(), k2.detach(), xi.grad, *(p.grad for p in tr.parameters())])
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want)


def test_auto_picks_fused_for_cpu_training_and_eager_otherwise():
    x = torch.zeros(1)
    assert resolve_impl("auto", x) == "fused"
    with torch.no_grad():
        assert resolve_impl("auto", x) == "eager"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert resolve_impl("auto", x) == "eager"
        with pytest.raises(RuntimeError, match="autocast"):
            resolve_impl("fused", x)
        assert resolve_impl("compile", x) == "compile"


def test_qk_impl_is_validated_and_set_on_every_layer():
    cfg = build_config("cpu-xs", "coupled", vocab_size=97, seq_len=16)
    with pytest.raises(ValueError, match="allowed: auto, eager, fused, compile"):
        GPT(cfg, seed=0, qk_impl="triton")
    m = GPT(cfg, seed=0)
    assert [b.attn.qk_transform.impl for b in m.blocks] == ["auto"] * cfg.n_layer
    m.set_qk_impl("eager")
    assert [b.attn.qk_transform.impl for b in m.blocks] == ["eager"] * cfg.n_layer
    GPT(build_config("cpu-xs", "standard", vocab_size=97, seq_len=16), seed=0, qk_impl="fused")  # no transform: fine
