"""The JSON Schema of a spec file, as a YAML language server reads it while a spec is typed.

pydantic's schema describes the validated model; a spec file is what comes before validation,
and the schema must accept every file ``qkstudy validate`` accepts (``tests/orchestrator/plan/
test_spec_schema.py`` checks every ``jobs/*.yaml``). Where the two differ:

- ``extends`` (resolved before validation) is a key of the file; a file that extends a base
  may leave out what the base gives, so the study's required keys bind only without it;
- a variant may be written as its name (``- coupled`` for ``- {name: coupled}``);
- YAML 1.1 reads ``1e-3`` (no dot) as a string that pydantic then parses as a float, so a
  number field also takes a numeric string;
- a ladder's targets may be counts such as ``400k`` or ``2.2M`` (``plan.ladder``).

A base that is only ever extended (``jobs/base/``) is a fragment: it matches the schema's
properties, not its required keys.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from orchestrator.plan.specfile import EXTENDS

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "urn:qkstudy:study-spec"
NUMERIC_STRING = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"
COUNT_STRING = r"^\s*[0-9.]+([eE][-+]?[0-9]+)?\s*[kKmMbB]?\s*$"  # plan.ladder._parse_count's grammar


def file_schema(root: type[BaseModel]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a spec file whose validated form is ``root`` (the Study).

    Returns a dict with ``$schema`` and ``$id``; see the module docstring for how it differs
    from ``root.model_json_schema()``.
    """
    schema = _loosen_numbers(root.model_json_schema())
    extends = {
        "type": "string",
        "title": "Extends",
        "description": "Path (relative to this file) of a base spec merged under this file's keys.",
    }
    schema["properties"] = {EXTENDS: extends, **schema["properties"]}
    if "variants" in schema["properties"]:
        items = schema["properties"]["variants"]["items"]
        schema["properties"]["variants"]["items"] = {"anyOf": [{"type": "string", "description": "a variant's name"}, items]}
    ladder = schema.get("$defs", {}).get("LadderSpec", {}).get("properties", {}).get("targets")
    if ladder is not None:
        ladder["items"] = {"anyOf": [{"type": "number"}, {"type": "string", "pattern": COUNT_STRING}]}
    required = schema.pop("required", [])
    schema.update({"if": {"required": [EXTENDS]}, "then": {}, "else": {"required": required}})
    return {"$schema": SCHEMA_DIALECT, "$id": SCHEMA_ID, **schema}


def _loosen_numbers(node: Any) -> Any:
    """``node`` with every ``{"type": "number", ...}`` also taking a numeric string."""
    if isinstance(node, list):
        return [_loosen_numbers(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _loosen_numbers(v) for k, v in node.items()}
    if out.get("type") == "number":
        keep = {k: out.pop(k) for k in ("title", "description", "default") if k in out}
        return {"anyOf": [out, {"type": "string", "pattern": NUMERIC_STRING}], **keep}
    return out
