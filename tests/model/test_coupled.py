"""The QK transforms on their own: integrator algebra, invertibility, volume, f evaluations.

Each property is checked for the eager reference and the fused path (`model.fused_qk`)."""

import pytest
import torch
from torch.autograd.functional import jacobian

import model.coupled
import model.fused_qk
from model.coupled import CoupledQK, CouplingMLP, UncoupledQK

IMPLS = ["eager", "fused"]

H, D = 2, 3  # small dimensions: the full Jacobian is 12 x 12


def make(integrator: str, n_steps: int = 1, sharing: str = "head", dt: float = 0.7, impl: str = "fused") -> CoupledQK:
    torch.manual_seed(0)
    tr = CoupledQK(n_head=H, head_dim=D, hidden=5, sharing=sharing, n_steps=n_steps, dt_init=dt, integrator=integrator).double()
    tr.impl = impl
    with torch.no_grad():
        tr.dt.copy_(torch.tensor([[dt], [-0.4]], dtype=torch.float64))  # per-head, one negative
    return tr


def qk(seed: int = 1, shape=(2, 4, H, D)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("impl", IMPLS)
def test_euler_step_matches_its_definition(impl):
    tr = make("euler", impl=impl)
    q, k = qk()
    q1, k1 = tr(q, k)
    torch.testing.assert_close(q1, q + tr.dt * k)
    torch.testing.assert_close(k1, k + tr.dt * tr.f(q))


@pytest.mark.parametrize("impl", IMPLS)
def test_leapfrog_step_matches_stormer_verlet(impl):
    tr = make("leapfrog", impl=impl)
    q, k = qk()
    k_half = k + tr.dt / 2 * tr.f(q)
    q1 = q + tr.dt * k_half
    k1 = k_half + tr.dt / 2 * tr.f(q1)
    out = tr(q, k)
    torch.testing.assert_close(out[0], q1)
    torch.testing.assert_close(out[1], k1)


def leapfrog_inverse(tr: CoupledQK, q: torch.Tensor, k: torch.Tensor):
    for _ in range(tr.n_steps):  # undo the kicks and the drift in reverse order
        k_half = k - tr.dt / 2 * tr.f(q)
        q = q - tr.dt * k_half
        k = k_half - tr.dt / 2 * tr.f(q)
    return q, k


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_steps", [1, 4])
def test_leapfrog_is_exactly_invertible(n_steps, impl):
    tr = make("leapfrog", n_steps=n_steps, dt=1.3, impl=impl)
    q, k = qk()
    q0, k0 = leapfrog_inverse(tr, *tr(q, k))
    torch.testing.assert_close(q0, q, rtol=0, atol=1e-12)
    torch.testing.assert_close(k0, k, rtol=0, atol=1e-12)


def _jacobian_det(tr: CoupledQK) -> float:
    q, k = qk(shape=(1, 1, H, D))

    def flat(z: torch.Tensor) -> torch.Tensor:
        out = tr(z[: H * D].view(1, 1, H, D), z[H * D :].view(1, 1, H, D))
        return torch.cat([out[0].reshape(-1), out[1].reshape(-1)])

    return torch.linalg.det(jacobian(flat, torch.cat([q.reshape(-1), k.reshape(-1)]))).item()


@pytest.mark.parametrize("impl", IMPLS)  # the Jacobian comes from backward: fused's is checked too
@pytest.mark.parametrize("n_steps, sharing", [(1, "head"), (3, "layer")])
def test_leapfrog_preserves_volume_and_euler_does_not(n_steps, sharing, impl):
    assert _jacobian_det(make("leapfrog", n_steps, sharing, impl=impl)) == pytest.approx(1.0, abs=1e-10)
    assert abs(_jacobian_det(make("euler", n_steps, sharing, impl=impl)) - 1.0) > 1e-3


@pytest.mark.parametrize("impl, evaluate", [("eager", "model.coupled.mlp"), ("fused", "model.fused_qk._f_forward")])
@pytest.mark.parametrize("integrator, n_steps, evaluations", [("euler", 1, 1), ("euler", 5, 5), ("leapfrog", 1, 2), ("leapfrog", 7, 8)])
def test_f_evaluations_per_forward(integrator, n_steps, evaluations, impl, evaluate, monkeypatch):
    tr = make(integrator, n_steps, impl=impl)
    calls = []
    module, name = evaluate.rsplit(".", 1)
    inner = getattr(model.coupled if module == "model.coupled" else model.fused_qk, name)
    monkeypatch.setattr(evaluate, lambda *a: calls.append(1) or inner(*a))
    tr(*qk())
    assert len(calls) == evaluations == tr.n_evaluations()
    assert tr.num_flops_per_token(seq_len=16) == evaluations * H * 2 * (2 * D * 5)  # per token: T-free


@pytest.mark.parametrize("impl", IMPLS)
def test_uncoupled_changes_only_q(impl):
    torch.manual_seed(0)
    tr = UncoupledQK(n_head=H, head_dim=D, hidden=5, sharing="layer", n_steps=2, dt_init=0.3).double()
    tr.impl = impl
    q, k = qk()
    q2, k2 = tr(q, k)
    q1 = q + 0.3 * tr.f(q)
    torch.testing.assert_close(q2, q1 + 0.3 * tr.f(q1))
    assert k2 is k


def test_shared_and_per_head_f_agree_when_weights_agree():
    torch.manual_seed(0)
    shared = CouplingMLP(D, 5, H, "layer").double()
    per_head = CouplingMLP(D, 5, H, "head").double()
    with torch.no_grad():
        for name in ("w1", "b1", "w2", "b2"):
            getattr(per_head, name).copy_(getattr(shared, name).expand_as(getattr(per_head, name)))
    x = qk()[0]
    torch.testing.assert_close(per_head(x), shared(x))
    manual = torch.nn.functional.silu(x @ shared.w1[0].T + shared.b1[0]) @ shared.w2[0].T + shared.b2[0]
    torch.testing.assert_close(shared(x), manual)
    assert shared.w1.numel() * H == per_head.w1.numel()


@pytest.mark.parametrize("sharing", ["layer", "head"])
def test_coupling_mlp_has_no_constant_output_at_init(sharing):
    """Zero biases: f(0) = 0, so f adds no input-independent shift (which would bias the
    uncoupled control's scores but cancel in the coupled model's softmax)."""
    f = CouplingMLP(32, 48, 4, sharing)
    assert torch.count_nonzero(f.b1) == 0 and torch.count_nonzero(f.b2) == 0
    assert torch.count_nonzero(f(torch.zeros(2, 3, 4, 32))) == 0
    f.reset_parameters(torch.Generator().manual_seed(1))
    assert torch.count_nonzero(f(torch.zeros(2, 3, 4, 32))) == 0 and torch.count_nonzero(f.w1) > 0


@pytest.mark.parametrize("head_dim, s", [(32, 0.23), (64, 0.45)])  # q's init scale at cpu-xs, 60m
def test_coupling_mlp_init_scale_is_a_sixth_of_the_input(head_dim, s):
    """The docstring's scale: std f(x) ~ std(x) / 6 (not std(x)) for inputs of q's init scale."""
    f = CouplingMLP(head_dim, head_dim, 1, "layer")
    f.reset_parameters(torch.Generator().manual_seed(0))
    x = s * torch.randn(20_000, 1, 1, head_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ratio = (f(x).std() / x.std()).item()
    assert 0.14 < ratio < 0.20, ratio
