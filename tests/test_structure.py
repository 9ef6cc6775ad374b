"""The import structure README's layout table promises, read from the source with ``ast``.

Stages, lowest first: ``model`` and ``data_pipeline`` (no orchestrator, Ray, DeepSpeed or
MLflow), ``orchestrator.plan`` (pure: spec -> runs), ``orchestrator.track`` (MLflow
conventions), then ``orchestrator.run`` and ``orchestrator.report`` (neither imports the other),
and the front doors (``cli*.py``, ``bench.py``) on top. Lazy imports inside functions count:
they are imports all the same. Each check has a negative control on a synthetic module.
"""

from __future__ import annotations

import ast
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


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[str, bool]]:
    """(absolute module name, at module level) for every import in ``source``; relative imports
    are resolved against ``module``."""
    found = []
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((name, id(node) in top))
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
    """Module-level imports between product modules (``from pkg import name`` counts as the
    submodule pkg.name when that is a module, else as pkg)."""
    graph: dict[str, set[str]] = {}
    for name, (src, _) in mods.items():
        deps = set()
        tree = ast.parse(src)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    deps.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


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


def test_a_circle_is_found():
    """Negative control: the planner <-> calibrate circle this layout removed."""
    mods = {"orchestrator.plan.planner": ("from orchestrator.run.calibrate import x\n", False),
            "orchestrator.run.calibrate": ("from orchestrator.plan.planner import resolve_train\n", False)}
    cycle = import_cycle(module_graph(mods))
    assert cycle is not None and set(cycle) == set(mods)


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
