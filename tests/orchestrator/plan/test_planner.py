"""Planner: compute matching, extend runs, step rounding, run identity."""

import json

import pytest

from model import build_config, count_model
from orchestrator.plan.contract import PlanError
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec

BASE = {
    "name": "p",
    "scales": ["cpu-xs", "cpu-s"],
    "variants": ["standard", {"name": "coupled", "options": {"n_steps": 3}}, "differential"],
    "seeds": [0, 1],
    "budget": {"mode": "flops", "tokens": 1_000_000},
    "extend": [2, 1.5, 3],
}


def _plan(**over):
    return plan(parse_spec({**BASE, **over}))


def test_flops_mode_matches_compute_within_one_step():
    runs = _plan()
    for scale in ("cpu-xs", "cpu-s"):
        base = [r for r in runs if r.scale == scale and r.extend == 1]
        ref = next(r for r in base if r.variant == "standard")
        budget = ref.tokens * ref.flops_per_token
        for r in base:
            tps = r.train.tokens_per_step
            assert abs(r.tokens * r.flops_per_token - budget) <= tps * r.flops_per_token
            assert r.tokens % tps == 0 and r.steps * tps == r.tokens
            assert r.total_flops == r.tokens * r.flops_per_token
        coupled = next(r for r in base if r.variant == "coupled")
        assert coupled.flops_per_token > ref.flops_per_token and coupled.tokens < ref.tokens


def test_counts_come_from_the_model():
    r = next(r for r in _plan() if r.variant == "coupled" and r.scale == "cpu-s")
    c = count_model(build_config("cpu-s", "coupled", vocab_size=4096, seq_len=r.train.seq_len, n_steps=3))
    assert (r.n_params, r.n_params_total, r.flops_per_token) == (c.n_params, c.n_params_total, c.flops_per_token)


def test_extend_runs_only_for_reference_and_multiply_tokens():
    runs = _plan()
    assert len(runs) == 2 * 2 * (4 + 1 + 1)  # scales x seeds x (ref 1+3 extends, coupled, differential)
    for scale in ("cpu-xs", "cpu-s"):
        ref = {r.extend: r.tokens for r in runs if r.scale == scale and r.variant == "standard" and r.seed == 0}
        assert sorted(ref) == [1, 1.5, 2, 3]
        tps = next(r for r in runs if r.scale == scale).train.tokens_per_step
        for e in (1.5, 2, 3):
            assert abs(ref[e] - e * ref[1]) <= tps
    assert {r.extend for r in runs if r.variant != "standard"} == {1.0}


def test_tokens_mode_and_tokens_per_param():
    runs = _plan(budget={"mode": "tokens", "tokens_per_param": 2.0}, extend=[])
    for scale in ("cpu-xs", "cpu-s"):
        same = {r.tokens for r in runs if r.scale == scale}
        assert len(same) == 1
        ref = next(r for r in runs if r.scale == scale and r.variant == "standard")
        assert abs(ref.tokens - 2.0 * ref.n_params) <= ref.train.tokens_per_step


def test_wallclock_mode_uses_declared_throughput():
    runs = _plan(
        budget={"mode": "wallclock", "tokens": 1_000_000, "throughput": {"standard": 1000.0, "coupled": 500.0, "differential": 800.0}},
        extend=[],
    )
    r = {x.variant: x.tokens for x in runs if x.scale == "cpu-xs" and x.seed == 0}
    tps = runs[0].train.tokens_per_step
    assert abs(r["coupled"] - r["standard"] / 2) <= tps and abs(r["differential"] - 0.8 * r["standard"]) <= tps


def test_budget_below_one_step_is_a_plan_error():
    with pytest.raises(PlanError, match="less than one optimizer step"):
        _plan(budget={"mode": "tokens", "tokens": 10})


def test_run_identity_is_stable_and_sensitive():
    a = [r.run_id for r in _plan()]
    assert a == [r.run_id for r in _plan()]
    assert len(set(a)) == len(a)
    # Resources do not change what a run computes: same ids.
    assert a == [r.run_id for r in _plan(resources={"workers": 2, "zero_stage": 3, "compile": True})]
    # Anything that does changes the id.
    for over in (
        {"seeds": [5, 1]},
        {"train": {"lr": 1e-3}},
        {"tokenizer": {"vocab_size": 1024}},
        {"corpus": {"source": "stdlib", "max_documents": 10}},
    ):
        b = [r.run_id for r in _plan(**over)]
        assert set(a) != set(b)


def test_runspec_roundtrips_through_json():
    from orchestrator.plan.contract import RunSpec

    r = _plan()[0]
    assert RunSpec.model_validate(json.loads(r.model_dump_json())) == r


def test_several_corpora_plan_each_with_its_own_identity():
    runs = _plan(corpora={"code": {"source": "stdlib"}, "small": {"source": "stdlib", "max_documents": 50}}, extend=[])
    assert len(runs) == 2 * 2 * 2 * 3  # corpora x scales x seeds x variants
    assert {r.corpus_name for r in runs} == {"code", "small"}
    assert len({r.run_id for r in runs}) == len(runs)
    assert runs[-1].run_name.endswith("@small")
    with pytest.raises(Exception, match="either corpus"):
        _plan(corpus={"source": "stdlib"}, corpora={"a": {"source": "stdlib"}})


def test_bench_study_plans_200_runs():
    from benchmarks.training import STUDY

    runs = plan(parse_spec(STUDY))
    assert len(runs) == 200
    assert {r.resources.gpus_per_worker * r.resources.workers for r in runs} == {8}


WALLCLOCK = {"mode": "wallclock", "tokens": 1_000_000}
TABLE = {
    "cpu-xs": {"standard": 1000.0, "coupled": 250.0, "differential": 800.0},
    "cpu-s": {"standard": 400.0, "coupled": 200.0, "differential": 100.0},
}


def test_wallclock_mode_takes_a_throughput_table_as_input(tmp_path):
    study = parse_spec({**BASE, "budget": WALLCLOCK, "extend": [], "workdir": str(tmp_path)})
    with pytest.raises(PlanError, match="qkstudy calibrate"):
        plan(study)  # no table, none declared: nothing to match wall-clock with
    runs = plan(study, TABLE)
    for scale, thr in TABLE.items():
        r = {x.variant: x for x in runs if x.scale == scale and x.seed == 0}
        tps = r["standard"].train.tokens_per_step
        for v in ("coupled", "differential"):
            assert abs(r[v].tokens - r["standard"].tokens * thr[v] / thr["standard"]) <= tps
    assert list(tmp_path.iterdir()) == []  # planning wrote nothing (and read no calibration file)
    with pytest.raises(PlanError, match="at scale cpu-s"):
        plan(study, {"cpu-xs": TABLE["cpu-xs"]})  # a scale missing from the table


def test_declared_throughput_takes_precedence_over_the_table():
    declared = {"standard": 1000.0, "coupled": 500.0, "differential": 800.0}
    study = parse_spec({**BASE, "budget": {**WALLCLOCK, "throughput": declared}, "extend": []})
    assert [r.tokens for r in plan(study, TABLE)] == [r.tokens for r in plan(study)]
    assert [r.tokens for r in plan(study, TABLE)] != [
        r.tokens for r in plan(parse_spec({**BASE, "budget": WALLCLOCK, "extend": []}), TABLE)
    ]


def test_throughput_table_file_roundtrip(tmp_path):
    from orchestrator.plan.throughput import calibration_path, load_calibration, save_calibration, throughput_table

    study = parse_spec({**BASE, "budget": WALLCLOCK, "workdir": str(tmp_path / "w")})
    assert load_calibration(study) is None and throughput_table(study) is None
    path = save_calibration(study, TABLE, {"repeats": 7})
    assert path == calibration_path(study) and json.loads(path.read_text()) == {"tokens_per_s": TABLE, "repeats": 7}
    assert [p.name for p in path.parent.iterdir()] == ["calibration.json"]  # the temp file was renamed
    assert throughput_table(study) == TABLE
    path.write_text(json.dumps(TABLE))  # a file written by an older version: the bare table
    assert load_calibration(study) == TABLE
    figures = {"standard": 1.0, "coupled": 2.0, "differential": 3.0}
    declared = parse_spec({**BASE, "budget": {**WALLCLOCK, "throughput": figures}, "workdir": str(tmp_path / "w")})
    assert throughput_table(declared) == {"cpu-xs": figures, "cpu-s": figures}  # the spec wins over the file


def test_planning_imports_no_ray_mlflow_or_deepspeed():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import orchestrator.plan.spec, orchestrator.plan.planner, orchestrator.plan.throughput\n"
        "from orchestrator.plan.inputs import plan_study\n"
        "from orchestrator.plan.planner import plan\n"
        "from orchestrator.plan.spec import parse_spec\n"
        f"plan(parse_spec({{**{BASE!r}, 'budget': {WALLCLOCK!r}}}), {TABLE!r})\n"
        f"plan_study(parse_spec({BASE!r}))\n"
        "print(sorted(m for m in ('ray', 'mlflow', 'deepspeed') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _text_study(tmp_path, **over):
    docs = tmp_path / "docs"
    if not docs.exists():
        docs.mkdir()
        for i in range(3):
            (docs / f"d{i}.txt").write_text(f"document {i}\n" * 50)
    # a few hundred tokens, planned (never trained) for their ids: the epoch guard is not the subject
    budget = {**BASE["budget"], "max_epochs": 1e6}
    return parse_spec({**BASE, "corpus": {"source": "text", "paths": [str(docs)]}, "extend": [], "budget": budget, **over})


def test_run_identity_follows_the_corpus_content(tmp_path):
    from orchestrator.plan.inputs import corpus_hashes, plan_study

    study = _text_study(tmp_path)
    h = corpus_hashes(study)
    assert list(h) == ["text"] and len(h["text"]) == 20
    runs = plan_study(study)
    assert all(r.data_hash == h["text"] for r in runs)
    assert [r.run_id for r in runs] == [r.run_id for r in plan_study(study)]  # stable
    assert [r.run_id for r in runs] != [r.run_id for r in plan(study)]  # the hash is in the identity
    (tmp_path / "docs" / "d1.txt").write_text("an edited document\n" * 50)  # one file changes
    changed = plan_study(study)
    assert corpus_hashes(study)["text"] != h["text"]
    assert not {r.run_id for r in changed} & {r.run_id for r in runs}  # every run is a new run
    assert [(r.variant, r.scale, r.seed, r.tokens) for r in changed] == [(r.variant, r.scale, r.seed, r.tokens) for r in runs]


def test_corpus_hash_is_the_prepared_datas_key(tmp_path):
    from data_pipeline import CorpusConfig, TokenizerConfig, prepare
    from orchestrator.plan.inputs import corpus_hashes

    study = parse_spec(
        {
            **BASE,
            "corpus": {"source": "mqar", "mqar": {"preset": "easy", "num_train_examples": 64, "num_val_examples": 16}},
            "train": {"seq_len": 64},
            "extend": [],
        }
    )
    prepared = prepare(
        CorpusConfig.model_validate(study.corpus_map["mqar"].model_dump(mode="json")),
        TokenizerConfig.model_validate(study.tokenizer.model_dump(mode="json")),
        tmp_path,
        progress=False,
    )
    assert corpus_hashes(study) == {"mqar": prepared.content_hash}


def test_unreadable_corpus_and_missing_hash_are_errors(tmp_path):
    from orchestrator.plan.inputs import CorpusError, corpus_hashes

    study = parse_spec({**BASE, "corpus": {"source": "text", "paths": [str(tmp_path / "missing")]}})
    with pytest.raises(CorpusError, match="corpus 'text': "):
        corpus_hashes(study)
    with pytest.raises(PlanError, match="no content hash given for corpus 'stdlib'"):
        plan(parse_spec(BASE), data={"other": "x"})


def test_wallclock_runs_record_their_calibration():
    study = parse_spec({**BASE, "budget": WALLCLOCK, "extend": []})
    runs = plan(study, TABLE)
    r = next(x for x in runs if x.scale == "cpu-s" and x.variant == "coupled")
    assert r.calibration["tokens_per_s"] == TABLE["cpu-s"] and r.calibration["source"] == "calibration"
    other = {"cpu-xs": TABLE["cpu-xs"], "cpu-s": {**TABLE["cpu-s"], "standard": 401.0}}
    assert plan(study, other)[0].calibration["digest"] != runs[0].calibration["digest"]
    assert all(x.calibration is None for x in _plan())  # flops budgets: no calibration
