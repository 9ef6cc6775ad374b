import math

import pytest
import torch

from model import VARIANTS
from model.diagnostics import _map_stats, attention_diagnostics


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


def test_zero_queries_give_uniform_causal_attention(make_model):
    model = make_model("standard")
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
    d = attention_diagnostics(model, torch.randint(0, 97, (2, T)))
    L = model.cfg.n_layer
    names = ("entropy", "effective_rank", "spectral_gap")
    assert set(d) == {f"attn/{n}" for n in names} | {f"attn/{n}/layer_{i}" for n in names for i in range(L)}
    assert model.training  # mode restored
    for n in names:
        assert d[f"attn/{n}"] == pytest.approx(sum(d[f"attn/{n}/layer_{i}"] for i in range(L)) / L)
    assert 0 < d["attn/entropy"] <= math.log(T)
    assert 1 <= d["attn/effective_rank"] <= T
    assert 0 <= d["attn/spectral_gap"] <= 1


def test_coupling_changes_effective_rank(make_model):
    idx = torch.randint(0, 97, (2, 32))
    std = attention_diagnostics(make_model("coupled", dt_init=0.0), idx)
    cpl = attention_diagnostics(make_model("coupled", dt_init=1.0), idx)
    assert cpl["attn/effective_rank"] != pytest.approx(std["attn/effective_rank"], rel=1e-4)


def test_probe_batch_must_have_two_tokens(make_model):
    with pytest.raises(ValueError, match="T >= 2"):
        attention_diagnostics(make_model("standard"), torch.zeros(2, 1, dtype=torch.long))
