"""Command-line overrides of a spec: ``budget.tokens_per_param=10 seeds=[0,1,2]``.

``validate``, ``plan``, ``run`` and ``submit`` take dotted overrides after the spec. Each is
parsed by OmegaConf's dotlist (the key path, ``a.b.0.c`` or ``a.b[0].c``, and the value as a
YAML value), then set over the spec's merged mapping (after its ``extends`` chain) in the order
given, the later winning. A mapping value merges into the mapping it lands on, anything else
(a list, a scalar, null) replaces it whole, as a file's keys do over its base
(``orchestrator.plan.specfile``); a numeric key inside a list sets that entry. The result is
validated as one spec, so an override is refused for what the same value in the file is: a
problem at or below a field an override set names the override (``override_source``).

Overrides never enter a run's identity themselves: only the config they change does.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.plan.specfile import OVERRIDE_PREFIX, Loc, SpecError, _merge


@dataclass(frozen=True)
class Override:
    """One ``KEY=VALUE`` override: its ``text`` as given, the key ``path`` and the parsed ``value``."""

    text: str
    path: tuple[str, ...]
    value: Any

    @property
    def label(self) -> str:
        """``override 'budget.tokens_per_param=10'``: where the CLI's error lines say a problem is."""
        return _label(self.text)


def _dotlist(text: str) -> dict[str, Any]:
    """OmegaConf's reading of one ``KEY=VALUE`` as a nested mapping (interpolations left as text)."""
    from omegaconf import OmegaConf  # imported here: a spec without overrides never needs it

    return OmegaConf.to_container(OmegaConf.from_dotlist([text]), resolve=False)  # type: ignore[return-value]


def parse_override(text: str, spec_path: str) -> Override:
    """Parse ``KEY=VALUE`` (the value as YAML: ``[0,1,2]`` a list, ``1e-3`` a float, ``null``).

    Raises:
        SpecError: no ``=``, an empty key or key part (``a..b``), or a value that is not
            valid YAML (a duplicate key, an unclosed bracket), naming the override.
    """
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise SpecError(spec_path, [("", "expected KEY=VALUE, e.g. budget.tokens_per_param=10 or seeds=[0,1,2]")], [_label(text)])
    try:
        node: Any = _dotlist(key + "=null")  # the key's path alone, by the same grammar
        parsed: Any = _dotlist(text)
    except Exception as e:  # noqa: BLE001 - OmegaConf's and YAML's errors alike: the override is malformed
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(spec_path, [("", f"cannot parse: {first}")], [_label(text)]) from None
    path: list[str] = []
    while isinstance(node, dict) and len(node) == 1:  # down the key's path, in both readings
        part = next(iter(node))
        node, parsed = node[part], parsed[part]
        path.append(str(part))
    if not path or any(not p.strip() for p in path):
        raise SpecError(spec_path, [("", f"malformed key {key!r}: give dotted field names, e.g. budget.tokens_per_param")], [_label(text)])
    return Override(text, tuple(path), parsed)


def _label(text: str) -> str:
    return f"{OVERRIDE_PREFIX}{text!r}"


def _set(data: dict[str, Any], o: Override, spec_path: str) -> None:
    """Set ``o.value`` at ``o.path`` in ``data`` (in place). Raises SpecError (naming ``o``) for a
    path through a scalar, or a list index that is not an entry of the list."""
    node: Any = data
    for depth, part in enumerate(o.path):
        here = ".".join(o.path[: depth + 1])
        last = depth == len(o.path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                msg = f"{'.'.join(o.path[:depth]) or 'the spec'} is a list of {len(node)}: give an index below {len(node)}"
                raise SpecError(spec_path, [(here, msg)], [o.label])
            key: Any = int(part)
        elif isinstance(node, dict):
            key = part
            if not last and node.get(key) is None:  # absent or null: the override starts the mapping
                node[key] = {}
        else:
            where = ".".join(o.path[:depth])
            raise SpecError(spec_path, [(here, f"{where} is {type(node).__name__} {node!r}, not a mapping or list")], [o.label])
        if last:
            old = node[key] if isinstance(node, list) or key in node else None
            node[key] = _merge(old, o.value) if isinstance(old, dict) and isinstance(o.value, dict) else copy.deepcopy(o.value)
        else:
            node = node[key]


def apply_overrides(data: Any, texts: Sequence[str], spec_path: str) -> tuple[Any, list[Override]]:
    """(``data`` with every override set in order, the parsed overrides); ``data`` is not changed.
    A spec that is not a mapping is returned as is (``parse_spec`` says what is wrong with it).

    Raises:
        SpecError: a malformed override, or one whose path cannot be set (see ``_set``).
    """
    overrides = [parse_override(t, spec_path) for t in texts]
    if not overrides or not isinstance(data, dict):
        return data, overrides
    out = copy.deepcopy(data)
    for o in overrides:
        _set(out, o, spec_path)
    return out, overrides


def _parts(loc: Loc | str) -> tuple[str, ...]:
    """A field path as strings: ``("variants", 1, "options")`` or ``variants[1].options``."""
    if isinstance(loc, str):
        return tuple(re.findall(r"[^.\[\]]+", loc))
    return tuple(str(p) for p in loc)


def override_source(overrides: Sequence[Override], loc: Loc | str) -> Override | None:
    """The last override that set the field at ``loc`` or a field above it; None when no
    override did (the value came from a file)."""
    parts = _parts(loc)
    for o in reversed(overrides):
        if parts[: len(o.path)] == o.path:
            return o
    return None


def spec_error(path: str, problems: list[tuple[str, str]], texts: Sequence[str], files: Sequence[str] | None = None) -> SpecError:
    """A SpecError whose problems at or below a field an override set name that override
    instead of the file (``files``: each problem's file, default ``path``); a problem of a
    field an override set something inside (``budget`` for ``budget.tokens=1``) still names
    its file, with the override appended."""
    overrides = [parse_override(t, path) for t in texts]
    owners = list(files) if files is not None else [path] * len(problems)
    out = []
    for i, (loc, msg) in enumerate(problems):
        if loc and (o := override_source(overrides, loc)) is not None:
            owners[i] = o.label
        elif loc and (below := [o.label for o in overrides if o.path[: len(_parts(loc))] == _parts(loc)]):
            msg = f"{msg} (with {', '.join(below)})"  # a field the override set inside it is part of it
        out.append((loc, msg))
    return SpecError(path, out, list(owners))
