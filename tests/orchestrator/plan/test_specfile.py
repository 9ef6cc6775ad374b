"""Specs that extend a base: merge semantics, errors naming the file that holds the bad field,
cycles and missing bases refused, and the paper specs planning as their flat equivalents."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import SpecError, load_spec, parse_spec
from orchestrator.plan.specfile import Layer, merge_layers, origin, read_layers
from tests.helpers import REPO

JOBS = REPO / "jobs"

BASE = """\
tokenizer: {vocab_size: 1024}
scales: [cpu-xs]
variants: [standard, coupled]
seeds: [0, 1]
budget: {mode: flops, tokens: 40960}
eval: {num_evals: 4, max_windows: 16}
resources: {workers: 1, cpus_per_worker: 1, zero_stage: 2}
"""


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_merge_mappings_merge_lists_and_scalars_replace(tmp_path):
    _write(
        tmp_path,
        {
            "base/root.yaml": BASE,
            "base/mid.yaml": "extends: root.yaml\nseeds: [7]\neval: {num_evals: 2}\n",  # relative to mid.yaml
            "study.yaml": "extends: base/mid.yaml\nname: s\nvariants: [standard]\neval: {max_windows: 8}\n",
        },
    )
    s = load_spec(tmp_path / "study.yaml")
    assert s.name == "s" and s.tokenizer.vocab_size == 1024 and s.scales == ["cpu-xs"]
    assert [v.name for v in s.variants] == ["standard"]  # a list replaces the base's whole
    assert s.seeds == [7]  # the nearer base wins over the root
    assert (s.eval.num_evals, s.eval.max_windows) == (2, 8)  # mappings merge key by key, across files
    assert s.resources.zero_stage == 2


def test_merge_layers_and_origin_on_their_own():
    layers = [
        Layer(Path("s.yaml"), {"extends": "b.yaml", "a": {"x": 1}, "l": [3], "n": None}),
        Layer(Path("b.yaml"), {"a": {"y": 2}, "l": [1, 2], "n": {"k": 1}, "b": 5}),
    ]
    assert merge_layers(layers) == {"a": {"y": 2, "x": 1}, "l": [3], "n": None, "b": 5}
    assert origin(layers, ("a", "x")) == Path("s.yaml") and origin(layers, ("a", "y")) == Path("b.yaml")
    assert origin(layers, ("l", 1)) == Path("s.yaml")  # the list is the study's, whole
    assert origin(layers, ("n", "k")) == Path("s.yaml")  # null in the study hides the base's mapping
    assert origin(layers, ("b",)) == Path("b.yaml")
    assert origin(layers, ("missing",)) == Path("s.yaml")  # a field no file sets belongs to the study


def test_bad_field_in_the_base_names_the_base(tmp_path):
    _write(
        tmp_path,
        {
            "base.yaml": BASE.replace("workers: 1", "workers: 0").replace("seeds: [0, 1]", "seedz: [0]"),
            "study.yaml": "extends: base.yaml\nname: s\ntrain: {lr: -1}\n",
        },
    )
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "study.yaml")
    by_loc = {loc: f for (loc, _), f in zip(e.value.problems, e.value.files)}
    base, study = str(tmp_path / "base.yaml"), str(tmp_path / "study.yaml")
    assert by_loc == {"seedz": base, "train.lr": study, "resources.workers": base}
    text = str(e.value)
    assert f"{base}: resources.workers: Input should be greater than 0 (a base of {study})" in text
    assert f"{base}: seedz: unknown field (did you mean 'seeds'?" in text
    assert f"{study}: train.lr: Input should be greater than 0" in text


def test_bad_variant_option_in_the_base_names_the_base(tmp_path):
    _write(
        tmp_path,
        {
            "base.yaml": BASE.replace("[standard, coupled]", "[standard, {name: coupled, options: {integrator: rk4}}]"),
            "study.yaml": "extends: base.yaml\nname: s\n",
        },
    )
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "study.yaml")
    assert e.value.problems[0][0] == "variants[1].options" and e.value.files == [str(tmp_path / "base.yaml")]
    assert "rk4" in str(e.value)


@pytest.mark.parametrize(
    ("files", "culprit", "message"),
    [
        ({"a.yaml": "extends: b.yaml\nname: s\n", "b.yaml": "extends: a.yaml\n" + BASE}, "b.yaml", "extends: cycle: "),
        ({"a.yaml": "extends: a.yaml\nname: s\n"}, "a.yaml", "extends: cycle: "),
        ({"a.yaml": "extends: base/nope.yaml\nname: s\n"}, "a.yaml", "extends: base spec "),
        ({"a.yaml": "extends: [b.yaml]\nname: s\n"}, "a.yaml", "extends: expected the path of a base spec"),
        ({"a.yaml": "extends: b.yaml\nname: s\n", "b.yaml": "- a list\n"}, "b.yaml", "a base spec must be a YAML mapping"),
        ({"a.yaml": "extends: b.yaml\nname: s\n", "b.yaml": "x: [unclosed\n"}, "b.yaml", "invalid YAML at line"),
    ],
)
def test_broken_extends_exits_2_naming_the_file(tmp_path, monkeypatch, files, culprit, message):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files)
    res = CliRunner().invoke(app, ["validate", str(tmp_path / "a.yaml")])
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / culprit}: {message}" in res.output.replace("\n", ""), res.output
    assert not (tmp_path / "runs").exists()


def test_a_spec_without_extends_reads_one_file(tmp_path):
    (tmp_path / "s.yaml").write_text("name: s\n" + BASE)
    assert [layer.path for layer in read_layers(tmp_path / "s.yaml")] == [tmp_path / "s.yaml"]


BASES = sorted((JOBS / "base").glob("*.yaml"))
STUDIES = sorted(JOBS.glob("*.yaml"))


def test_every_base_is_extended_and_is_not_a_study():
    """jobs/base/ holds bases only; jobs/*.yaml (what the JOBS tests load) are the studies."""
    assert BASES
    extended = {
        (p.parent / yaml.safe_load(p.read_text())["extends"]).resolve() for p in STUDIES if "extends" in yaml.safe_load(p.read_text())
    }
    assert set(BASES) <= extended
    for base in BASES:
        with pytest.raises(SpecError, match="name: Field required"):
            load_spec(base)


@pytest.mark.parametrize("job", [p for p in STUDIES if p.name.startswith("paper-")], ids=lambda p: p.stem)
def test_paper_spec_plans_as_its_flat_equivalent(job, tmp_path):
    """Each paper spec is the merged mapping of its files: written out flat, it plans the same runs."""
    merged = merge_layers(read_layers(job))
    flat = tmp_path / job.name
    flat.write_text(yaml.safe_dump(merged, sort_keys=False))
    assert "extends" not in merged and merged["tokenizer"] == {"vocab_size": 32000, "max_sentences": 2000000}
    # the same runs, read from another folder (corpus_root: where relative corpus paths would be read)
    assert [r.model_dump(exclude={"corpus_root"}) for r in plan(load_spec(job))] == [
        r.model_dump(exclude={"corpus_root"}) for r in plan(load_spec(flat))
    ]


def test_bare_variant_means_its_default_options():
    """`coupled` and the defaults spelled out are one run (same run_id): specs need not repeat them."""
    study = {"name": "s", "scales": ["cpu-xs"], "budget": {"tokens": 40960}}
    bare = plan(parse_spec({**study, "variants": ["standard", "coupled"]}))
    spelled = plan(parse_spec({**study, "variants": ["standard", {"name": "coupled", "options": {"integrator": "euler", "n_steps": 1}}]}))
    other = plan(parse_spec({**study, "variants": ["standard", {"name": "coupled", "options": {"n_steps": 2}}]}))
    assert [r.run_id for r in bare] == [r.run_id for r in spelled]
    assert bare[1].run_id != other[1].run_id  # a non-default option is a different run
