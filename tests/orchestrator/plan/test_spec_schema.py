"""`qkstudy schema` accepts every shipped spec (what an editor's YAML language server checks
as a spec is typed), and still refuses a broken one."""

import json

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.helpers import REPO

JOBS = REPO / "jobs"
SPECS = sorted(p for p in JOBS.glob("*.yaml"))
BASES = sorted((JOBS / "base").glob("*.yaml"))


@pytest.fixture(scope="module")
def schema() -> dict:
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _errors(schema: dict, doc: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_schema_names_its_dialect_and_id(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["$id"] == "urn:qkstudy:study-spec"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_shipped_spec_validates_against_the_schema(schema, path):
    assert _errors(schema, yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize("path", BASES, ids=lambda p: p.name)
def test_a_base_matches_the_schemas_properties(schema, path):
    fragment = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
    assert _errors(fragment, yaml.safe_load(path.read_text())) == []


def test_the_loosened_forms_are_accepted_and_broken_specs_refused(schema):
    ok = {
        "name": "s",
        "scales": [{"ladder": {"targets": ["400k", 8e5, "1.6M"], "head_dim": 16, "aspect_ratio": 40}}],
        "variants": ["standard", {"name": "coupled"}],
        "budget": {"tokens": 40960},
        "tune": {"lr": ["1e-3", 3e-3], "tokens": 0.25},
    }
    assert _errors(schema, ok) == []
    assert _errors(schema, {"extends": "base.yaml", "name": "t"}) == []  # the base gives the rest
    # negative controls: each one broken field is named
    assert _errors(schema, {k: v for k, v in ok.items() if k != "budget"}) == ["[]: 'budget' is a required property"]
    assert _errors(schema, ok | {"budgte": {}}) and any("budgte" in e for e in _errors(schema, ok | {"budgte": {}}))
    bad_lr = ok | {"tune": {"lr": ["fast"], "tokens": 0.25}}
    assert any(e.startswith("['tune']") for e in _errors(schema, bad_lr))
    bad_target = ok | {"scales": [{"ladder": {"targets": ["lots"], "head_dim": 16, "aspect_ratio": 40}}]}
    assert any(e.startswith("['scales', 0]") for e in _errors(schema, bad_target))
    assert any(e.startswith("['variants', 0]") for e in _errors(schema, ok | {"variants": [3]}))
