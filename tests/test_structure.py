"""The import structure README's layout table promises, read from the source with ``ast``.

Stages, lowest first: ``model`` and ``data_pipeline`` (no orchestrator, Ray, DeepSpeed or
MLflow), ``orchestrator.plan`` (pure: spec -> runs), ``orchestrator.track`` (MLflow
conventions), then ``orchestrator.run`` and ``orchestrator.report`` (neither imports the other),
and the front doors (``cli*.py``, ``bench.py``) on top. Lazy imports inside functions count:
they are imports all the same. Each check has a negative control on a synthetic module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "data_pipeline", "orchestrator")
THIRD_PARTY = ("ray", "deepspeed", "mlflow")

# What each stage may import (besides itself, the standard library and other libraries).
ALLOWED = {
    "model": set(),
    "data_pipeline": set(),
    "orchestrator.plan": {"model", "data_pipeline"},
    "orchestrator.track": {"model", "data_pipeline", "orchestrator.plan", "mlflow"},
    "orchestrator.run": {"model", "data_pipeline", "orchestrator.plan", "orchestrator.track", "ray", "deepspeed",
                         "mlflow"},
    "orchestrator.report": {"model", "data_pipeline", "orchestrator.plan", "orchestrator.track", "mlflow"},
}


def stage(module: str) -> str:
    """The stage a dotted module name belongs to ('orchestrator' for the front doors)."""
    parts = module.split(".")
    if parts[0] == "orchestrator" and len(parts) > 1 and parts[1] in ("plan", "run", "track", "report"):
        return ".".join(parts[:2])
    return parts[0]


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` / ``if typing.TYPE_CHECKING:``: imports for the type checker only."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_modules(source: str, module: str, is_package: bool = False,
                     known: Iterable[str] = ()) -> list[tuple[str, bool]]:
    """(absolute module name, run at import time) for every import in ``source``: relative
    imports resolved against ``module``; ``from pkg import name`` names pkg.name when that is
    one of the ``known`` modules, else pkg; "at import time" = not inside a function (module
    level, class bodies, ``if``/``try`` blocks)."""
    known = set(known)
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, not in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base[: len(base) - child.level + (1 if is_package else 0)]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                for a in child.names:
                    sub = f"{name}.{a.name}"
                    found.append((sub if sub in known else name, not in_function))
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for n in child.orelse:  # the body never runs
                    visit(ast.Module(body=[n], type_ignores=[]), in_function)
                continue
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` (its ``source``) that its stage may not make."""
    own = stage(module)
    if own == "orchestrator":
        return []
    bad = []
    for name, _ in imported_modules(source, module, is_package):
        other = stage(name)
        if other == own or other not in (*PACKAGES, *THIRD_PARTY, *ALLOWED):
            continue
        if other not in ALLOWED[own]:
            bad.append(f"{module} imports {name}")
    return bad


def product_modules() -> dict[str, tuple[str, bool]]:
    """Dotted name -> (source, is a package __init__) for every product module."""
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            mods[".".join(parts)] = (path.read_text(), is_package)
    return mods


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (module -> modules it imports) as a path, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def module_graph(mods: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Imports run at import time between product modules (``imported_modules``)."""
    return {name: {m for m, at_import in imported_modules(src, name, is_package, mods)
                   if at_import and m in mods and m != name}
            for name, (src, is_package) in mods.items()}


def test_no_stage_imports_a_later_one():
    bad = [v for name, (src, pkg) in product_modules().items() for v in violations(src, name, pkg)]
    assert bad == []


@pytest.mark.parametrize("module,source", [
    ("orchestrator.plan.planner", "from orchestrator.run.calibrate import throughput_table\n"),
    ("orchestrator.plan.planner", "def f():\n    from orchestrator.track import tracking\n"),
    ("orchestrator.report.build", "import orchestrator.run.worker\n"),
    ("model.gpt", "import mlflow\n"),
    ("data_pipeline.build", "from orchestrator.plan.spec import Study\n"),
    ("orchestrator.track.status", "from ..report import query\n"),
])
def test_a_forbidden_import_is_caught(module, source):
    """Negative controls: each of these imports crosses a stage the wrong way, one lazily and one
    relative."""
    assert len(violations(source, module)) == 1


def test_allowed_imports_pass():
    assert violations("import torch\nfrom orchestrator.plan.spec import Study\nimport mlflow\n",
                      "orchestrator.track.status") == []


def test_no_module_level_import_circle():
    assert import_cycle(module_graph(product_modules())) is None


@pytest.mark.parametrize("mods", [
    # the planner <-> calibrate circle this layout removed
    {"orchestrator.plan.planner": ("from orchestrator.run.calibrate import x\n", False),
     "orchestrator.run.calibrate": ("from orchestrator.plan.planner import resolve_train\n", False)},
    # relative imports, as data_pipeline writes them, one of them in a try block
    {"data_pipeline.a": ("from .b import f\n", False),
     "data_pipeline.b": ("try:\n    from . import a\nexcept ImportError:\n    a = None\n", False)},
])
def test_a_circle_is_found(mods):
    """Negative controls: each pair imports the other at import time."""
    cycle = import_cycle(module_graph(mods))
    assert cycle is not None and set(cycle) == set(mods)


def test_an_import_inside_a_function_is_no_circle():
    mods = {"data_pipeline.a": ("from .b import f\n", False),
            "data_pipeline.b": ("def g():\n    from . import a\n", False)}
    assert import_cycle(module_graph(mods)) is None


def test_relative_imports_are_in_the_graph():
    graph = module_graph(product_modules())
    assert {"data_pipeline.storage", "data_pipeline.errors"} <= graph["data_pipeline.loader"]  # `from . import storage`


def test_type_checking_imports_are_no_circle():
    mods = {"model.a": ("from model.b import f\n", False),
            "model.b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from model.a import A\n", False)}
    assert import_cycle(module_graph(mods)) is None


MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(source: str, name: str) -> list[str]:
    """``name`` (a module's source) over ``MAX_FILE_LINES``, and each function in it over
    ``MAX_FUNCTION_LINES`` (decorators excluded, docstring included)."""
    found = []
    if len(source.splitlines()) > MAX_FILE_LINES:
        found.append(f"{name}: {len(source.splitlines())} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}.{node.name}: {length} lines")
    return found


def test_no_product_file_or_function_is_oversized():
    assert [o for name, (src, _) in product_modules().items() for o in oversized(src, name)] == []


def test_an_oversized_function_is_caught():
    """Negative control: a 61-line function and a 401-line file."""
    body = "def f():\n" + "    x = 1\n" * 60
    assert oversized(body, "m") == ["m.f: 61 lines"]
    assert oversized("x = 1\n" * 401, "m") == ["m: 401 lines"]
