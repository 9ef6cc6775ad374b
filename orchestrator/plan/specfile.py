"""Spec files on disk: strict YAML, ``extends`` chains, and errors that name the right file.

A spec may say ``extends: base/paper.yaml`` (a path relative to the spec itself). The base
is read first (it may extend another base), then each file's own keys are merged over it:
mappings merge key by key, anything else (a list, a scalar, null) replaces the base's value
whole, so ``variants: [...]`` in a study is its full list, never appended to the base's. The
merged mapping is validated as one spec (``orchestrator.plan.spec.parse_spec``).

Why the provenance bookkeeping: a shared base is where a typo hurts most, since every study
that extends it fails. So each validation problem is reported against the file that holds
the bad value (``origin``), and a missing base or a cycle is refused naming the file whose
``extends`` points there.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails

EXTENDS = "extends"
Loc = tuple[str | int, ...]
# Where a problem a command-line override caused is said to be (``orchestrator.plan.overrides``).
OVERRIDE_PREFIX = "override "


class SpecError(ValueError):
    """A spec file that cannot be used.

    ``problems`` holds (field path, message) pairs; ``files`` the file each problem is in:
    the spec itself, the base it extends that holds the bad field (default: ``path``), or the
    command-line override that set it (``override 'KEY=VALUE'``, ``OVERRIDE_PREFIX``).
    """

    def __init__(self, path: str | Path, problems: list[tuple[str, str]], files: list[str | Path] | None = None):
        self.path = str(path)
        self.problems = problems
        self.files = [str(f) for f in files] if files is not None else [self.path] * len(problems)
        lines = []
        for file, (loc, msg) in zip(self.files, problems):
            via = "" if file == self.path or file.startswith(OVERRIDE_PREFIX) else f" (a base of {self.path})"
            lines.append(f"{file}: {loc}: {msg}{via}" if loc else f"{file}: {msg}{via}")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Layer:
    """One file of an ``extends`` chain and the mapping it holds (``extends`` included)."""

    path: Path
    data: Any


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML loader that refuses a key given twice in one mapping (YAML says keys are unique;
    PyYAML would silently keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """The YAML document of one file. Raises SpecError (naming ``path``): missing, not a
    regular file, unreadable, not UTF-8, invalid YAML or a duplicate key (with its line)."""
    if not path.is_file():
        raise SpecError(path, [("", "no such file" if not path.exists() else "not a regular file")])
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(path, [("", f"invalid YAML{where}: {getattr(e, 'problem', e)}")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(path, [("", f"cannot read: {e}")]) from None


def read_layers(path: Path) -> list[Layer]:
    """The spec file and the bases it extends, the file itself first, its root base last.

    A file whose document is not a mapping ends the chain (``parse_spec`` says what is wrong
    with a spec; a base must be a mapping).

    Raises:
        SpecError: a file cannot be read (naming it); ``extends`` is not a path, names a file
            that does not exist, or closes a cycle (naming the file that holds it).
    """
    layers: list[Layer] = []
    p = path
    while True:
        data = read_yaml(p)
        if not isinstance(data, dict):
            if not layers:
                return [Layer(p, data)]
            raise SpecError(p, [("", f"a base spec must be a YAML mapping (extended by {layers[-1].path})")])
        layers.append(Layer(p, data))
        ext = data.get(EXTENDS)
        if ext is None:
            return layers
        if not isinstance(ext, str) or not ext.strip():
            raise SpecError(p, [(EXTENDS, f"expected the path of a base spec relative to this file, got {ext!r}")])
        base = p.parent / ext
        if base.resolve() in {layer.path.resolve() for layer in layers}:
            chain = " -> ".join(str(layer.path) for layer in layers)
            raise SpecError(p, [(EXTENDS, f"cycle: {chain} -> {base}")])
        if not base.is_file():
            raise SpecError(p, [(EXTENDS, f"base spec {base} " + ("is not a file" if base.exists() else "does not exist"))])
        p = base


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def merge_layers(layers: list[Layer]) -> dict[str, Any]:
    """Each file's keys over its base's (root base first): mappings merge, the rest replaces;
    the ``extends`` keys themselves are dropped."""
    out: dict[str, Any] = {}
    for layer in reversed(layers):
        out = _merge(out, {k: v for k, v in layer.data.items() if k != EXTENDS})
    return out


def origin(layers: list[Layer], loc: Loc) -> Path:
    """The file holding the merged spec's value at ``loc`` (field path, keys and indices).

    Follows ``loc`` key by key through the files that set it, nearest file first; a file
    that sets a key to anything but a mapping owns everything below it (a list is replaced
    whole). A field that no file sets (a missing required one) belongs to the spec itself.
    """
    nodes = [(layer.path, layer.data) for layer in layers]
    owner = layers[0].path
    for key in loc:
        below = []
        for path, node in nodes:
            if isinstance(node, dict) and key in node:
                below.append((path, node[key]))
                if not isinstance(node[key], dict):
                    break  # replaces whatever the bases below it hold
        if not below:
            return owner
        owner = below[0][0]
        if not isinstance(below[0][1], dict):
            return owner
        nodes = below
    return owner


def loc_str(loc: Loc) -> str:
    """``("variants", 1, "options")`` -> ``variants[1].options``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation such as ``CorpusConfig | None``,
    ``dict[str, X]`` or ``list[str | ScaleShape | LadderScale]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _field(cls: type[BaseModel], key: str) -> Any:
    """The field of ``cls`` that input key ``key`` fills (by alias first, then by name)."""
    for name, f in cls.model_fields.items():
        if f.alias == key or (f.alias is None and name == key):
            return f
    return None


def _unknown_field_message(root: type[BaseModel], loc: Loc) -> str:
    """ "unknown field (did you mean ...? allowed: ...)" from the fields of the models that can
    hold ``loc`` (several where a field is a union of models, e.g. a scale entry)."""
    models = [root]
    for part in loc[:-1]:  # dict keys and list indices are skipped
        fields = [f for m in models if not isinstance(part, int) and (f := _field(m, part)) is not None]
        below = [m for f in fields for m in _models(f.annotation)]
        models = below or models
    allowed = sorted({f.alias or name for m in models for name, f in m.model_fields.items()})
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field ({hint}allowed: {', '.join(allowed)})" if allowed else "unknown field"


def value_error_details(loc: Loc, message: str, value: Any = None) -> InitErrorDetails:
    """A pydantic ``value_error`` at ``loc`` (what a validator's ``ValueError(message)`` gives), for
    validators that report several problems at their own field paths at once (`raise_problems`)."""
    return InitErrorDetails(type="value_error", loc=tuple(loc), input=value, ctx={"error": ValueError(message)})


def error_details(err: ValidationError, prefix: Loc = ()) -> list[InitErrorDetails]:
    """``err``'s errors, their paths under ``prefix``: to re-raise a nested model's errors at the
    path of the entry that holds it."""
    return [
        InitErrorDetails(type=e["type"], loc=(*prefix, *e["loc"]), input=e["input"], **({"ctx": e["ctx"]} if "ctx" in e else {}))  # type: ignore[typeddict-item]
        for e in err.errors(include_url=False)
    ]


def raise_problems(title: str, problems: list[tuple[Loc, str]]) -> None:
    """Raise every (field path, message) problem at once as one ValidationError (a model
    validator's checks that name fields of their own); no-op without problems."""
    if problems:
        raise ValidationError.from_exception_data(title, [value_error_details(loc, msg) for loc, msg in problems])


def validation_problems(err: ValidationError, root: type[BaseModel]) -> list[tuple[Loc, str]]:
    """Pydantic's errors as (field path, message): validator wrappers dropped from the path,
    unknown fields with the allowed ones (and the closest), literal errors with the value."""
    problems = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not str(p).startswith(("function-", "tagged-union")))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = _unknown_field_message(root, loc)
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        problems.append((loc, msg))
    return problems
