"""Behaviour shared by every variant: shapes, loss, causality, determinism, gradients."""

import pytest
import torch
import torch.nn.functional as F

from model import GPT, VARIANTS, build_config

VOCAB = 97  # must equal conftest's vocabulary (conftest is not importable under importlib mode)

OPTION_SETS = [
    ("standard", {}),
    ("coupled", {}),
    ("coupled", dict(integrator="leapfrog", n_steps=3, coupling_sharing="head", coupling_hidden=24)),
    ("uncoupled_mlp", {}),
    ("uncoupled_mlp", dict(n_steps=2, coupling_sharing="head")),
    ("differential", {}),
    ("coupled_differential", dict(integrator="leapfrog", n_steps=2)),
    ("nonlinear_q", dict(bottleneck=16)),
]


@pytest.mark.parametrize("variant, options", OPTION_SETS)
def test_causality_changing_a_later_token_never_changes_earlier_outputs(make_model, variant, options):
    model = make_model(variant, **options)
    torch.manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, 32))
    logits, _ = model(idx)
    for t in (0, 10, 30):
        changed = idx.clone()
        changed[:, t + 1] = (changed[:, t + 1] + 1) % VOCAB
        logits2, _ = model(changed)
        assert torch.equal(logits[:, : t + 1], logits2[:, : t + 1]), (variant, t)
        assert not torch.allclose(logits[:, t + 1], logits2[:, t + 1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_shapes_loss_and_ignore_index(make_model, variant):
    model = make_model(variant)
    idx = torch.randint(0, VOCAB, (3, 20))
    targets = torch.randint(0, VOCAB, (3, 20))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 20, VOCAB)
    assert torch.allclose(loss, F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)))
    assert abs(loss.item() - torch.log(torch.tensor(float(VOCAB))).item()) < 0.5  # near uniform at init
    masked = targets.clone()
    masked[:, :10] = -100
    _, loss_masked = model(idx, masked)
    expected = F.cross_entropy(logits[:, 10:].reshape(-1, VOCAB), targets[:, 10:].reshape(-1))
    assert torch.allclose(loss_masked, expected)
    assert model(idx)[1] is None


def test_too_long_input_is_rejected(make_model):
    with pytest.raises(ValueError, match="exceeds cfg.seq_len=32"):
        make_model("standard")(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("variant", VARIANTS)
def test_init_is_deterministic_given_seed(make_model, variant):
    a, b, c = make_model(variant, seed=3), make_model(variant, seed=3), make_model(variant, seed=4)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


PAIRED = [
    ("coupled", dict(integrator="euler")),
    ("coupled", dict(integrator="leapfrog")),
    ("uncoupled_mlp", {}),
    ("differential", {}),
    ("coupled_differential", {}),
    ("nonlinear_q", {}),
]


def _cfg(variant: str, **options):
    return build_config("cpu-xs", variant, vocab_size=VOCAB, seq_len=32, **options)


@pytest.mark.parametrize("variant, options", PAIRED)
def test_same_seed_gives_every_variant_the_standard_backbone(variant, options):
    """Seed pairing: every standard parameter (the whole backbone: embeddings, LayerNorms,
    QKV and output projections, MLPs, LM head; same names and shapes in every variant,
    differential included) has identical initial values in the variant, built either with
    seed= or after torch.manual_seed; another seed gives other values."""
    std, var, other = GPT(_cfg("standard"), seed=7), GPT(_cfg(variant, **options), seed=7), GPT(_cfg(variant, **options), seed=8)
    torch.manual_seed(3)
    std_global = GPT(_cfg("standard"))
    torch.manual_seed(3)
    var_global = GPT(_cfg(variant, **options))
    shared = dict(std.named_parameters())
    assert set(shared) == set(var.backbone_parameters()) == set(std.backbone_parameters())
    for name, p in shared.items():
        assert var.get_parameter(name).shape == p.shape, name
        assert torch.equal(var.get_parameter(name), p), name
        assert torch.equal(var_global.get_parameter(name), std_global.get_parameter(name)), name
        if p.dim() > 1:  # LayerNorm weights start at 1 whatever the seed
            assert not torch.equal(other.get_parameter(name), p), name
            assert not torch.equal(std_global.get_parameter(name), p), name


def test_variants_sharing_a_stage_share_its_initial_values():
    cpl, unc = GPT(_cfg("coupled"), seed=5), GPT(_cfg("uncoupled_mlp"), seed=5)
    diff, both = GPT(_cfg("differential"), seed=5), GPT(_cfg("coupled_differential"), seed=5)
    names = {n for n, _ in cpl.named_parameters()} - set(cpl.backbone_parameters())
    assert names and all(".qk_transform." in n for n in names)
    for n in names:  # f and dt
        assert torch.equal(cpl.get_parameter(n), unc.get_parameter(n)) and torch.equal(cpl.get_parameter(n), both.get_parameter(n)), n
    lam = {n for n, _ in diff.named_parameters()} - set(diff.backbone_parameters())
    assert any("lambda_q1" in n for n in lam)
    for n in lam:
        assert torch.equal(diff.get_parameter(n), both.get_parameter(n)), n
    assert not torch.equal(GPT(_cfg("differential"), seed=6).blocks[0].attn.scoring.lambda_q1, diff.blocks[0].attn.scoring.lambda_q1)


def _as_standard(model: GPT) -> GPT:
    """A standard model carrying every weight `model` shares with standard attention."""
    std = GPT(model.cfg.model_copy(update=dict(variant="standard"))).eval()
    missing = std.load_state_dict({k: v for k, v in model.state_dict().items() if k in std.state_dict()}, strict=True)
    assert not missing.missing_keys
    return std


@pytest.mark.parametrize(
    "variant, options",
    [
        ("coupled", dict(integrator="euler", n_steps=2)),
        ("coupled", dict(integrator="leapfrog", n_steps=3)),
        ("uncoupled_mlp", dict(n_steps=2, coupling_sharing="head")),
    ],
)
def test_dt_zero_recovers_standard_attention(make_model, variant, options):
    model = make_model(variant, **options)
    idx = torch.randint(0, VOCAB, (2, 32))
    assert not torch.allclose(model(idx)[0], _as_standard(model)(idx)[0], atol=1e-5)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qk_transform.dt.zero_()
    torch.testing.assert_close(model(idx)[0], _as_standard(model)(idx)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "variant, options",
    [
        ("coupled", dict(integrator="euler")),
        ("coupled", dict(integrator="leapfrog", coupling_sharing="head")),
        ("uncoupled_mlp", {}),
        ("coupled_differential", {}),
    ],
)
def test_gradients_reach_dt_and_the_coupling_mlp(make_model, variant, options):
    model = make_model(variant, **options).train()
    idx = torch.randint(0, VOCAB, (2, 32))
    _, loss = model(idx, idx)
    loss.backward()
    for block in model.blocks:
        tr = block.attn.qk_transform
        for name, p in [("dt", tr.dt), ("w1", tr.f.w1), ("b1", tr.f.b1), ("w2", tr.f.w2), ("b2", tr.f.b2)]:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            assert p.grad.shape == p.shape


def test_differential_lambda_and_norm_get_gradients(make_model):
    model = make_model("differential").train()
    idx = torch.randint(0, VOCAB, (2, 32))
    model(idx, idx)[1].backward()
    sc = model.blocks[1].attn.scoring
    for p in (sc.lambda_q1, sc.lambda_k1, sc.lambda_q2, sc.lambda_k2, sc.subln.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_learns_a_fixed_batch(make_model, variant):
    model = make_model(variant).train()
    idx = torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(5))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def _reference_query(attn, x: torch.Tensor) -> torch.Tensor:
    """q' = W_Q (x + f(x)), f(x) = w2 gelu(w1 x + b1) + b2, written out from the definition."""
    f = attn.query_input
    fx = F.gelu(x @ f.w1.T + f.b1) @ f.w2.T + f.b2
    return (x + fx) @ attn.qkv.weight[: attn.d_model].T


def test_nonlinear_q_starts_as_standard_attention_and_computes_its_definition(make_model):
    """f is zero at init, so the first forward is standard attention's at the same seed; with f
    made non-zero (the negative control) it differs, and the queries are W_Q (x + f(x)) while
    keys and values stay W_K x, W_V x."""
    model = make_model("nonlinear_q", seed=4)
    idx = torch.randint(0, VOCAB, (2, 32))
    torch.testing.assert_close(model(idx)[0], _as_standard(model)(idx)[0], rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.query_input.w2.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(model(idx)[0], _as_standard(model)(idx)[0], atol=1e-4)
    attn, x = model.blocks[0].attn, torch.randn(2, 8, model.cfg.d_model, generator=torch.Generator().manual_seed(2))
    q, k, v = attn._qkv(x)
    torch.testing.assert_close(q.reshape(2, 8, -1), _reference_query(attn, x), rtol=1e-5, atol=1e-6)
    d = attn.d_model
    torch.testing.assert_close(torch.cat([k.reshape(2, 8, -1), v], -1), x @ attn.qkv.weight[d:].T, rtol=1e-5, atol=1e-6)


def test_nonlinear_q_output_weight_learns_from_the_first_step(make_model):
    """With w2 = 0 the first backward reaches w2 and b2 (their inputs are non-zero) but not w1,
    b1 (their gradient passes through w2): like a LoRA adapter's zero matrix."""
    model = make_model("nonlinear_q").train()
    idx = torch.randint(0, VOCAB, (2, 32))
    model(idx, idx)[1].backward()
    for block in model.blocks:
        f = block.attn.query_input
        assert f.w2.grad.abs().sum() > 0 and f.b2.grad.abs().sum() > 0
        assert torch.equal(f.w1.grad, torch.zeros_like(f.w1)) and torch.equal(f.b1.grad, torch.zeros_like(f.b1))
