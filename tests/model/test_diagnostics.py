import math

import pytest
import torch

from model import VARIANTS
from model.diagnostics import (
    PROBE_WINDOWS,
    _map_stats,
    attention_diagnostics,
    lambda_parameters,
    layer_lambdas,
    rank_and_gap,
    singular_values,
)


def test_map_stats_on_known_matrices():
    T = 8
    ent, rank, gap = _map_stats(torch.eye(T).view(1, 1, T, T))  # attend to self: T orthogonal rows
    assert (ent, rank, gap) == (pytest.approx(0.0), pytest.approx(T), pytest.approx(0.0))
    first = torch.zeros(1, 1, T, T)
    first[..., 0] = 1.0  # every query attends to token 0: rank one
    ent, rank, gap = _map_stats(first)
    assert (ent, rank, gap) == (pytest.approx(0.0), pytest.approx(1.0), pytest.approx(1.0))
    uniform = torch.ones(T, T).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True)).view(1, 1, T, T)
    ent, _, _ = _map_stats(uniform)
    assert ent == pytest.approx(sum(math.log(i + 1) for i in range(T)) / T)


def test_the_gram_spectrum_agrees_with_the_svd_and_a_float32_one_would_not():
    """The singular values come from A Aᵀ: effective rank and spectral gap
    within 1e-3 of float64 SVDs on causal softmax maps (sharp and flat), a rank-one sink, a
    signed differential-like map and the identity. Negative control: the same route in float32
    misses the bound on the same maps, so the check can fail."""
    T, g = 256, torch.Generator().manual_seed(0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def softmax(scale: float) -> torch.Tensor:
        scores = torch.randn(2, 2, T, T, generator=g, dtype=torch.float64) * scale
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)

    sink = torch.zeros(1, 1, T, T, dtype=torch.float64)
    sink[..., 0] = 1.0
    maps = [softmax(3.0), softmax(0.3), sink, softmax(2.0) - 0.8 * softmax(2.0), torch.eye(T, dtype=torch.float64).view(1, 1, T, T)]
    float32_miss = 0.0
    for a in maps:
        rank, gap = rank_and_gap(torch.linalg.svdvals(a))
        fast_rank, fast_gap = rank_and_gap(singular_values(a))
        assert float((fast_rank - rank).abs().max()) < 1e-3 and float((fast_gap - gap).abs().max()) < 1e-3
        a32 = a.float()
        s32 = torch.linalg.eigvalsh(a32 @ a32.transpose(-1, -2)).flip(-1).clamp_min(0).sqrt().double()
        float32_miss = max(float32_miss, float((rank_and_gap(s32)[0] - rank).abs().max()))
    assert float32_miss > 1e-2


@pytest.mark.parametrize("variant", ["standard", "uncoupled_mlp"])
def test_zero_queries_give_uniform_causal_attention(make_model, variant):
    """q = 0: every score is equal. The uncoupled control starts from q' = q + dt * f(q) with
    f(0) = 0 (zero-bias init), so it too attends uniformly: no constant shift of the queries."""
    model = make_model(variant)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: model.cfg.d_model].zero_()  # q = 0: every score equal
    T = 16
    d = attention_diagnostics(model, torch.randint(0, 97, (2, T)))
    expected = sum(math.log(i + 1) for i in range(T)) / T
    for i in range(model.cfg.n_layer):
        assert d[f"attn/entropy/layer_{i}"] == pytest.approx(expected)
    assert d["attn/entropy"] == pytest.approx(expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_diagnostics_keys_and_ranges(make_model, variant):
    model = make_model(variant).train()
    T = 24
    d = attention_diagnostics(model, torch.randint(0, 97, (3, T)))
    L = model.cfg.n_layer
    names = ("entropy", "effective_rank", "spectral_gap")
    assert set(d) == (
        {f"attn/{n}" for n in names}
        | {f"attn/{n}/std" for n in names}
        | {f"attn/{n}/layer_{i}" for n in names for i in range(L)}
        | {"attn/probe_windows"}
    )
    assert model.training  # mode restored
    assert d["attn/probe_windows"] == 3
    for n in names:
        assert d[f"attn/{n}"] == pytest.approx(sum(d[f"attn/{n}/layer_{i}"] for i in range(L)) / L)
        assert d[f"attn/{n}/std"] > 0
    assert 0 < d["attn/entropy"] <= math.log(T)
    assert 1 <= d["attn/effective_rank"] <= T
    assert 0 <= d["attn/spectral_gap"] <= 1


def test_probe_of_many_windows_gives_mean_and_spread_over_windows(make_model):
    """The mean and std are over windows (checked window by window), chunking changes nothing,
    and a probe of identical windows has zero spread."""
    model = make_model("coupled_differential")
    idx = torch.randint(0, 97, (PROBE_WINDOWS, 16), generator=torch.Generator().manual_seed(2))
    d = attention_diagnostics(model, idx, batch_size=5)
    singles = [attention_diagnostics(model, idx[i : i + 1]) for i in range(PROBE_WINDOWS)]
    for n in ("entropy", "effective_rank", "spectral_gap"):
        values = torch.tensor([s[f"attn/{n}"] for s in singles], dtype=torch.float64)
        assert d[f"attn/{n}"] == pytest.approx(values.mean().item(), rel=1e-9)
        assert d[f"attn/{n}/std"] == pytest.approx(values.std(correction=1).item(), rel=1e-6)
        assert singles[0][f"attn/{n}/std"] == 0.0
    assert attention_diagnostics(model, idx, batch_size=PROBE_WINDOWS) == pytest.approx(d, rel=1e-9)
    same = attention_diagnostics(model, idx[:1].repeat(4, 1))
    assert same["attn/entropy/std"] == pytest.approx(0.0, abs=1e-12)


def _partition(params):
    """What ZeRO-3 leaves on a rank between forwards: each parameter's data is an empty tensor."""
    full = [p.data for p in params]
    for p in params:
        p.data = torch.empty(0, dtype=p.dtype)
    return full


def test_lambdas_are_read_through_one_gather_and_partitioned_ones_raise(make_model):
    """Unit level (the real ZeRO-3 run is test_diagnostics_zero3.py): the diagnostics read
    every lambda vector inside one gather, and refuse partitioned ones instead of using
    lambda_init."""
    model = make_model("differential", scale="cpu-s")
    with torch.no_grad():
        for p in lambda_parameters(model):
            p.mul_(6.0)  # lambda far from lambda_init
    assert len(lambda_parameters(model)) == 4 * model.cfg.n_layer
    assert lambda_parameters(make_model("coupled")) == []
    lams = layer_lambdas(model)
    assert all(abs(lam - b.attn.scoring.lambda_init) > 1e-3 for lam, b in zip(lams, model.blocks))
    params = lambda_parameters(model)
    full = _partition(params)
    with pytest.raises(RuntimeError, match="partitioned .*GatheredParameters"):
        attention_diagnostics(model, torch.randint(0, 97, (2, 16)))
    gathered = []

    class Gather:  # restores the data inside, re-partitions on exit
        def __init__(self, ps):
            self.ps = ps
            gathered.append(len(ps))

        def __enter__(self):
            for p, data in zip(self.ps, full):
                p.data = data

        def __exit__(self, *exc):
            _partition(self.ps)

    assert layer_lambdas(model, gather=Gather) == pytest.approx(lams, rel=1e-12)
    assert gathered == [len(params)]  # one gather of every lambda vector
    assert all(p.numel() == 0 for p in params)  # left partitioned, as found


def test_coupling_changes_effective_rank(make_model):
    idx = torch.randint(0, 97, (2, 32))
    std = attention_diagnostics(make_model("coupled", dt_init=0.0), idx)
    cpl = attention_diagnostics(make_model("coupled", dt_init=1.0), idx)
    assert cpl["attn/effective_rank"] != pytest.approx(std["attn/effective_rank"], rel=1e-4)


def test_probe_batch_must_have_two_tokens(make_model):
    with pytest.raises(ValueError, match="T >= 2"):
        attention_diagnostics(make_model("standard"), torch.zeros(2, 1, dtype=torch.long))


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_sharded_pieces_add_up_to_the_whole_probe(make_model, world):
    """What a run's ranks log (each computes every world-th window, the pieces are summed) is
    the one-rank diagnostics of the whole probe; 7 ranks on 5 windows pad the empty shares."""
    from model.diagnostics import sharded_stats, summarize, window_stats

    model = make_model("coupled")
    idx = torch.randint(0, 97, (5, 12), generator=torch.Generator().manual_seed(1))
    pieces = [sharded_stats(model, idx, r, world) for r in range(world)]
    assert all(p.shape == (model.cfg.n_layer, 3, 5) for p in pieces)
    for r, p in enumerate(pieces):  # each rank fills only its own windows
        assert [w for w in range(5) if p[..., w].abs().sum() > 0] == list(range(r, 5, world))
    whole = torch.stack(pieces).sum(0)
    # float32 forwards of a different batch size may take another BLAS path: equal to a few
    # float32 ulps (seen: 1.2e-8 relative for one-window batches), not bit for bit
    assert torch.allclose(whole, window_stats(model, idx), rtol=1e-6, atol=0)
    got, want = summarize(whole), attention_diagnostics(model, idx)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], rel=1e-6) for k in want)
    # negative control: a piece missing (a rank's windows not added) changes the numbers
    if world > 1:
        assert summarize(whole - pieces[0])["attn/entropy"] != pytest.approx(want["attn/entropy"], rel=1e-6)
    with pytest.raises(ValueError, match="rank 3 outside a world of 3"):
        sharded_stats(model, idx, 3, 3)
