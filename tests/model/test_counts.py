"""The torch-free counts (`model.counts.count_model`, what the planner uses) equal the counts
of the built torch model (`model.counts.count_instantiated`) for every preset, every variant and
the options that change them, and importing them loads no torch (the light CLI commands rely on it)."""

import itertools
import subprocess
import sys

import pytest

from model import PRESETS, VARIANTS, build_config, count_model
from model.counts import count_instantiated
from model.gpt import GPT
from model.stage_counts import matched_bottleneck

OPTION_GRID = {
    "coupled": [
        dict(integrator=i, n_steps=n, coupling_hidden=h, coupling_sharing=s)
        for i, n, h, s in itertools.product(("euler", "leapfrog"), (1, 3), (None, 48), ("layer", "head"))
    ],
    "uncoupled_mlp": [
        dict(n_steps=n, coupling_hidden=h, coupling_sharing=s) for n, h, s in itertools.product((1, 2), (None, 16), ("layer", "head"))
    ],
}
OPTION_GRID["coupled_differential"] = OPTION_GRID["coupled"]
OPTION_GRID["nonlinear_q"] = [dict(bottleneck=r) for r in (None, 1, 33, 256)]


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_analytic_counts_equal_the_built_model(preset, variant):
    cfg = build_config(preset, variant)
    assert count_model(cfg) == count_instantiated(cfg)


@pytest.mark.parametrize("variant", sorted(OPTION_GRID))
def test_analytic_counts_follow_every_option(variant):
    for options in OPTION_GRID[variant]:
        cfg = build_config("cpu-s", variant, vocab_size=100, seq_len=64, **options)
        assert count_model(cfg) == count_instantiated(cfg), options


def test_analytic_counts_equal_a_real_models_parameters():
    cfg = build_config("cpu-xs", "coupled_differential", vocab_size=300, coupling_sharing="head", n_steps=2)
    counts = count_model(cfg)
    model = GPT(cfg, seed=0)
    assert counts.n_params_total == sum(p.numel() for p in model.parameters())
    assert counts.flops_per_token == 3 * model.num_flops_per_token()


def test_a_wrong_formula_is_caught(monkeypatch):
    # negative control: the equality is sharp enough to see one dt per head go missing
    import dataclasses

    from model.registry import REGISTRY
    from model.stage_counts import coupled_counts

    cfg = build_config("cpu-xs", "coupled")

    def wrong(c):
        right = coupled_counts(c)
        return right._replace(n_params=right.n_params - c.n_layer * c.n_head)

    monkeypatch.setitem(REGISTRY, "coupled", dataclasses.replace(REGISTRY["coupled"], counts=wrong))
    assert count_model(cfg) != count_instantiated(cfg)
    assert count_model(cfg).n_params == count_instantiated(cfg).n_params - cfg.n_layer * cfg.n_head


def test_a_variant_without_counts_is_counted_on_its_built_stages(monkeypatch):
    """The fallback adds the variant's own stages (built on meta) to the backbone's formula;
    it builds no whole model: with `GPT` unbuildable it still counts, and equals the reference."""
    import dataclasses

    import model.gpt
    from model.registry import REGISTRY

    monkeypatch.setitem(REGISTRY, "coupled", dataclasses.replace(REGISTRY["coupled"], counts=None))
    for variant, options in (("coupled", {}), ("coupled", {"coupling_sharing": "head", "n_steps": 2})):
        cfg = build_config("cpu-xs", variant, **options)
        expected = count_instantiated(cfg)
        with monkeypatch.context() as m:
            m.setattr(model.gpt.GPT, "__init__", _unbuildable)
            assert count_model(cfg) == expected


def _unbuildable(*args, **kwargs):
    raise AssertionError("count_model built the whole model")


def test_counting_imports_no_torch():
    code = (
        "import sys\nfrom model import PRESETS, VARIANTS, build_config, count_model\n"
        "[count_model(build_config(p, v)) for p in PRESETS for v in VARIANTS]\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("preset", list(PRESETS))
def test_nonlinear_q_is_parameter_matched_to_coupled_by_default(preset):
    """The default bottleneck r puts nonlinear_q's parameters within half a step of r (2d + 1
    per layer) of what coupled adds at its defaults; r = 8 at 60m (d 512)."""
    std, cpl, nlq = (count_model(build_config(preset, v, vocab_size=512)).n_params for v in ("standard", "coupled", "nonlinear_q"))
    L, d, r = PRESETS[preset].n_layer, PRESETS[preset].d_model, matched_bottleneck(build_config(preset, "nonlinear_q"))
    assert abs((nlq - std) - (cpl - std)) <= L * (2 * d + 1) / 2
    assert nlq - std == L * (2 * d * r + r + d)
    if preset == "60m":
        assert r == 8
