"""One base for a spec's corpus paths (issue 51): relative ``paths`` name files beside the spec,
as ``extends`` and ``plugins`` do, so a spec plans the same run ids from any folder; the folder
is where the files are, never what they hold, so it enters neither the content hash nor a run's
identity (a spec planned from its own folder keeps the ids it had before this rule)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from data_pipeline import CorpusConfig, TokenizerConfig, prepare
from orchestrator.plan.inputs import plan_study
from orchestrator.plan.paths import data_problems
from orchestrator.plan.spec import load_spec, parse_spec
from tests.helpers import tiny_spec

TEXT = "".join(f"def function_{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """tmp/specs/study.yaml over tmp/specs/data/{a,b}.txt, named relatively; returns the spec."""
    data = tmp_path / "specs" / "data"
    data.mkdir(parents=True)
    for name in ("a", "b"):
        (data / f"{name}.txt").write_text(TEXT.replace("function", f"{name}_function"))
    spec = tmp_path / "specs" / "study.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec("rel", corpus={"source": "text", "paths": ["data/*.txt"]}, tokenizer={"vocab_size": 300})))
    return spec


def _ids(spec: Path) -> dict[str, str | None]:
    return {r.run_id: r.data_hash for r in plan_study(load_spec(spec), strict=False)}


def test_a_spec_plans_the_same_ids_from_any_folder(project, monkeypatch):
    monkeypatch.chdir(project.parent.parent)
    from_above = _ids(Path("specs/study.yaml"))
    monkeypatch.chdir(project.parent)
    beside = _ids(Path("study.yaml"))
    monkeypatch.chdir("/")
    assert from_above == beside == _ids(project)
    assert None not in from_above.values()  # the files were read: their content is in the ids
    # and the folder is not: the same mapping read from the spec's folder with no base (the rule
    # before) gives the same ids, as the published stores' runs need
    monkeypatch.chdir(project.parent)
    assert {r.run_id for r in plan_study(parse_spec(yaml.safe_load(project.read_text())), strict=False)} == set(beside)
    # negative control: the same mapping without a base, read from elsewhere, cannot see the files
    monkeypatch.chdir(project.parent.parent)
    blind = {r.run_id: r.data_hash for r in plan_study(parse_spec(yaml.safe_load(project.read_text())), strict=False)}
    assert set(blind.values()) == {None} and set(blind) != set(beside)


def test_the_data_gate_reads_beside_the_spec_and_names_the_base_it_used(project, monkeypatch):
    monkeypatch.chdir("/")
    assert data_problems(load_spec(project)) == []
    project.write_text(project.read_text().replace("data/*.txt", "missing/*.txt"))
    ((field, message),) = data_problems(load_spec(project))
    assert field == "corpus.paths[0]" and f"relative to {project.parent}" in message


def test_prepare_reads_a_relative_path_against_the_root_it_is_given(project, tmp_path, monkeypatch):
    """What the driver hands the preparation task: the corpus as dumped (no root) plus the
    run's ``corpus_root``; a mixture's component takes its mixture's root."""
    monkeypatch.chdir("/")
    (run,) = plan_study(load_spec(project), strict=False)[:1]
    assert run.corpus_root == str(project.parent) and "root" not in run.corpus
    corpus = CorpusConfig.model_validate({**run.corpus, "root": run.corpus_root}).with_root(run.corpus_root)
    prepared = prepare(corpus, TokenizerConfig(vocab_size=300), tmp_path / "cache", num_proc=1, progress=False)
    assert prepared.content_hash == run.data_hash
    mixture = CorpusConfig.model_validate({"source": "mixture", "components": [{"weight": 1.0, "corpus": run.corpus}]})
    assert mixture.with_root(run.corpus_root).components[0].corpus.root == str(project.parent)


def test_a_file_or_folder_named_with_glob_characters_names_itself(project, monkeypatch):
    """`validate` and `plan` read "[draft].txt" and "[old]/" as the file and the folder they name
    (they refused the one and hashed the other, or the reverse, by globbing them)."""
    data = project.parent / "data"
    (data / "[draft].txt").write_text(TEXT)
    (project.parent / "[old]").mkdir()
    (project.parent / "[old]" / "c.txt").write_text(TEXT.replace("function", "c_function"))
    monkeypatch.chdir("/")
    for path in ("data/[draft].txt", "[old]"):
        spec = yaml.safe_load(project.read_text())
        project.write_text(yaml.safe_dump({**spec, "corpus": {**spec["corpus"], "paths": [path]}}))
        study = load_spec(project)
        assert data_problems(study) == [], path
        assert plan_study(study, strict=False)[0].data_hash is not None, path
