"""A study's ``architecture`` (the backbone layout every variant shares): it reaches every
run's model config and identity, the default plans the runs it always planned, and a bad field
is an input error naming it."""

from __future__ import annotations

import pytest
import yaml

from model import ModelConfig, count_model
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import SpecError, load_spec, parse_spec
from tests.helpers import REPO

JOBS = REPO / "jobs"
SPEC = {
    "name": "arch",
    "corpus": {"source": "stdlib", "max_documents": 60},
    "scales": ["cpu-xs"],
    "variants": ["standard", "coupled"],
    "budget": {"mode": "flops", "tokens": 40960},
}
MODERN = {"positions": "rope", "norm": "rmsnorm", "mlp": "swiglu", "qk_norm": True}


def _ids(spec: dict) -> dict[str, str]:
    return {r.variant: r.run_id for r in plan(parse_spec(spec))}


def test_the_default_layout_plans_the_same_runs_and_another_layout_new_ones():
    before = _ids(SPEC)
    assert _ids({**SPEC, "architecture": {}}) == before
    assert _ids({**SPEC, "architecture": {"positions": "learned", "mlp": "gelu"}}) == before  # the defaults spelled out
    modern = _ids({**SPEC, "architecture": MODERN})
    assert set(modern.values()).isdisjoint(before.values())


def test_every_run_of_a_modern_study_builds_the_modern_model_and_is_compute_matched_on_it():
    runs = plan(parse_spec({**SPEC, "architecture": MODERN, "budget": {"mode": "flops", "tokens": 409_600}}))  # 200 steps
    for r in runs:
        cfg = ModelConfig(**r.model)
        assert (cfg.positions, cfg.norm, cfg.mlp, cfg.qk_norm, cfg.tied_head) == ("rope", "rmsnorm", "swiglu", True, False)
        assert r.flops_per_token == count_model(cfg).flops_per_token and r.n_params == count_model(cfg).n_params
    std, coupled = (next(r for r in runs if r.variant == v) for v in ("standard", "coupled"))
    one_step = coupled.flops_per_token * coupled.train.global_batch * coupled.train.seq_len
    assert coupled.tokens < std.tokens and abs(coupled.total_flops - std.total_flops) <= one_step  # FLOP-matched to a step


def test_a_bad_architecture_field_names_the_file_and_field(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**SPEC, "architecture": {"positons": "rope"}}))
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert "s.yaml" in str(e.value) and "architecture.positons" in str(e.value)
    f.write_text(yaml.safe_dump({**SPEC, "architecture": {"rope_at": "before_transform"}}))
    with pytest.raises(SpecError, match='rope_at apply to positions: "rope" only'):
        load_spec(f)


def test_the_modern_base_runs_the_papers_arms_and_the_controls_on_the_modern_recipe():
    study = load_spec(JOBS / "paper-modern.yaml")
    assert [v.name for v in study.variants] == ["standard", "coupled", "uncoupled_mlp", "nonlinear_q", "differential"]
    assert study.architecture.model_dump() == {
        "positions": "rope",
        "rope_base": 10_000.0,
        "rope_at": "after_transform",
        "norm": "rmsnorm",
        "mlp": "swiglu",
        "qk_norm": True,
        "tied_head": False,
    }
    # the paper base's cluster, corpus and budget come along
    assert study.resources.gpus_per_worker == 1 and study.budget.tokens_per_param == 20
