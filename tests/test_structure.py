"""The import structure README's layout table promises, read from the source with ``ast``.

Stages, lowest first: ``model`` and ``data_pipeline`` (no orchestrator, Ray, DeepSpeed or
MLflow), ``orchestrator.plan`` (pure: spec -> runs), ``orchestrator.track`` (MLflow
conventions), then ``orchestrator.run`` and ``orchestrator.report`` (neither imports the other),
and the front doors (``cli*.py``) on top; no product module imports ``benchmarks`` or
``tests`` (which import the product, never the other way round). Lazy imports inside functions count:
they are imports all the same, for the stages and for circles (modules that import each other
round a circle of any length, one of them lazily, are still one concept split in several).
Imports under ``if TYPE_CHECKING:`` never run, so the stage rule leaves them out, but they
close circles all the same: a module that names another's types only for the checker still
cannot be read, or moved, without it (so a contract that modules annotate against is a leaf,
``model.contract``, ``orchestrator.plan.contract``). Sizes: one concept per module, so a module
past ``MAX_FILE_LINES`` says why; no function body over ``MAX_FUNCTION_LINES`` (the signature,
which the formatter wraps one parameter a line, is not counted). Each check has a
negative control on a synthetic module.
"""

from __future__ import annotations

import ast
import re
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
    "orchestrator.run": {"model", "data_pipeline", "orchestrator.plan", "orchestrator.track", "ray", "deepspeed", "mlflow"},
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
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_modules(
    source: str, module: str, is_package: bool = False, known: Iterable[str] = (), type_checking: bool = False
) -> list[tuple[str, bool]]:
    """(absolute module name, run at import time) for every import in ``source``: relative
    imports resolved against ``module``; ``from pkg import name`` names pkg.name when that is
    one of the ``known`` modules, else pkg; "at import time" = not inside a function (module
    level, class bodies, ``if``/``try`` blocks). The body of ``if TYPE_CHECKING:`` (which never
    runs) is left out unless ``type_checking``."""
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
                for n in (child.body if type_checking else []) + child.orelse:  # the body never runs
                    visit(ast.Module(body=[n], type_ignores=[]), in_function)
                continue
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


# The process boundary inside orchestrator.run: code that runs in a Ray Train worker never
# imports the driver's (which may import the worker's: a pack task hands the loop to Ray Train).
WORKER, DRIVER = "orchestrator.run.worker", "orchestrator.run.driver"


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_shared_run(module: str) -> bool:
    """A module of ``orchestrator/run/`` itself: what the driver and the workers both use."""
    return _under(module, "orchestrator.run") and not (_under(module, WORKER) or _under(module, DRIVER))


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` (its ``source``) that its stage may not make, a worker-side
    module's imports of the driver side, and a shared ``orchestrator.run`` module's imports of
    either side."""
    own = stage(module)
    if own == "orchestrator":
        return []
    bad = [
        f"{module} imports {name} (worker code never imports the driver's)"
        for name, _ in imported_modules(source, module, is_package)
        if _under(module, WORKER) and _under(name, DRIVER)
    ]
    bad += [
        f"{module} imports {name} (a module both sides use imports neither side)"
        for name, _ in imported_modules(source, module, is_package)
        if _is_shared_run(module) and (_under(name, WORKER) or _under(name, DRIVER))
    ]
    for name, _ in imported_modules(source, module, is_package):
        other = stage(name)
        if other == own or other not in (*PACKAGES, *THIRD_PARTY, *ALLOWED):
            continue
        if other not in ALLOWED[own]:
            bad.append(f"{module} imports {name}")
    return bad


# Folders beside the product that import it: the benchmarks (`make bench`) and the tests' oracles.
NOT_PRODUCT = ("benchmarks", "tests")


def non_product_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``benchmarks`` or ``tests`` in ``module`` (its ``source``), from every
    stage, the front doors included, inside functions and under ``if TYPE_CHECKING:`` too."""
    return [
        f"{module} imports {name}"
        for name, _ in imported_modules(source, module, is_package, type_checking=True)
        if name.split(".")[0] in NOT_PRODUCT
    ]


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


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph`` (module -> modules it imports): each strongly connected set of
    two or more modules (each reaches every other), sorted, in sorted order; [] when none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(n: str) -> None:  # Tarjan's algorithm
        index[n] = low[n] = len(index)
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in stack:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            members = stack[stack.index(n) :]
            del stack[stack.index(n) :]
            if len(members) > 1:
                found.append(sorted(members))

    for n in sorted(graph):
        if n not in index:
            visit(n)
    return sorted(found)


def module_graph(mods: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Every import between product modules (``imported_modules``): at import time, inside a
    function or under ``if TYPE_CHECKING:``."""
    return {
        name: {m for m, _ in imported_modules(src, name, is_package, mods, type_checking=True) if m in mods and m != name}
        for name, (src, is_package) in mods.items()
    }


def test_no_stage_imports_a_later_one():
    bad = [v for name, (src, pkg) in product_modules().items() for v in violations(src, name, pkg)]
    assert bad == []


@pytest.mark.parametrize(
    "module,source",
    [
        ("orchestrator.plan.planner", "from orchestrator.run.driver.calibrate import throughput_table\n"),
        ("orchestrator.plan.planner", "def f():\n    from orchestrator.track import tracking\n"),
        ("orchestrator.report.build", "import orchestrator.run.worker.loop\n"),
        ("model.gpt", "import mlflow\n"),
        ("data_pipeline.build", "from orchestrator.plan.spec import Study\n"),
        ("orchestrator.track.status", "from ..report import query\n"),
        ("orchestrator.run.worker.loop", "def f():\n    from orchestrator.run.driver.runner import run_runs\n"),
    ],
)
def test_a_forbidden_import_is_caught(module, source):
    """Negative controls: each of these imports crosses a stage the wrong way (one lazily, one
    relative) or reaches from worker code into the driver's."""
    assert len(violations(source, module)) == 1


def test_the_driver_may_import_the_worker_side():
    assert violations("from orchestrator.run.worker.loop import train_loop_per_worker\n", "orchestrator.run.driver.packing") == []
    assert violations("from orchestrator.run.checkpoint import CKPT_TAG\n", "orchestrator.run.worker.loop") == []


@pytest.mark.parametrize(
    "module,source",
    [
        ("orchestrator.run.final_weights", "from orchestrator.run.worker.evaluate import eval_sums\n"),
        ("orchestrator.run.checkpoint", "def f():\n    from .driver import packing\n"),
        ("orchestrator.run", "from orchestrator.run.worker import loop\n"),
    ],
)
def test_a_shared_run_module_importing_a_side_is_caught(module, source):
    """Negative controls: a shared module of ``orchestrator/run/`` (one lazily and relatively,
    one the package itself) imports the worker's or the driver's side."""
    assert len(violations(source, module, is_package=module == "orchestrator.run")) == 1


def test_shared_run_modules_may_import_each_other():
    assert violations("from orchestrator.run.evaluate import eval_sums\n", "orchestrator.run.final_weights") == []


def test_allowed_imports_pass():
    assert violations("import torch\nfrom orchestrator.plan.spec import Study\nimport mlflow\n", "orchestrator.track.status") == []


def test_no_product_module_imports_benchmarks_or_tests():
    bad = [v for name, (src, pkg) in product_modules().items() for v in non_product_imports(src, name, pkg)]
    assert bad == []


@pytest.mark.parametrize(
    "module,source",
    [
        ("orchestrator.run.driver.calibrate", "def f():\n    from benchmarks.model_steps import run_bench\n"),
        ("orchestrator.cli", "import benchmarks.cli_latency\n"),
        ("model.timing", "from benchmarks import record\n"),
        ("orchestrator.report.build", "from tests.synthetic_study import SyntheticStudy\n"),
        ("data_pipeline.build", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tests.helpers import TPS\n"),
    ],
)
def test_a_product_import_of_benchmarks_or_tests_is_caught(module, source):
    """Negative controls: a lazy, a front door's, a package's, a test oracle's and a type-only import."""
    assert len(non_product_imports(source, module)) == 1


def test_the_benchmarks_importing_the_product_pass():
    assert non_product_imports("from model.timing import tokens_per_second\nimport testsuite\n", "orchestrator.run.driver.calibrate") == []


def test_no_import_circle():
    """No two product modules import each other, directly or round a longer circle, at import
    time, inside a function or for the type checker only."""
    assert import_cycles(module_graph(product_modules())) == []


@pytest.mark.parametrize("contract", ["model.contract", "orchestrator.plan.contract"])
def test_the_contracts_are_leaves(contract):
    """What the stages and the plan modules annotate against imports no product module, not
    even for the type checker, so it reads (and loads) alone."""
    assert module_graph(product_modules())[contract] == set()


# The report's statistics are pure functions of the run and metric tables: reading MLflow,
# writing files and presenting stay in the rest of orchestrator.report.
STATS, REPORT = "orchestrator.report.stats", "orchestrator.report"


def impure_stats_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of a ``orchestrator.report.stats`` module (its ``source``) of MLflow or of a
    report module outside the package, inside functions and for the type checker too; [] for
    a module outside the package."""
    if not _under(module, STATS):
        return []
    return [
        f"{module} imports {name}"
        for name, _ in imported_modules(source, module, is_package, type_checking=True)
        if name.split(".")[0] == "mlflow" or (_under(name, REPORT) and not _under(name, STATS))
    ]


def test_the_report_statistics_are_pure():
    bad = [v for name, (src, is_package) in product_modules().items() for v in impure_stats_imports(src, name, is_package)]
    assert bad == []


@pytest.mark.parametrize(
    "source",
    [
        "import mlflow\n",
        "def f():\n    from mlflow.tracking import MlflowClient\n",
        "from orchestrator.report.query import StudyData\n",
        "from orchestrator.report import tables\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchestrator.report.build import Numbers\n",
    ],
)
def test_an_impure_statistics_import_is_caught(source):
    """Negative controls: a synthetic stats module reading MLflow or a report module outside
    stats (lazily, or for the type checker only) is named."""
    assert impure_stats_imports(source, "orchestrator.report.stats.synthetic") == [
        f"orchestrator.report.stats.synthetic imports {imported_modules(source, 'x', type_checking=True)[-1][0]}"
    ]


def test_pure_statistics_imports_pass():
    """A stats module may import its siblings and numerical libraries; a report module outside
    stats may read MLflow."""
    ok = "\n".join(["import numpy as np", "from orchestrator.report.stats import curves", "from .solve import f", "import scipy"])
    assert impure_stats_imports(ok, "orchestrator.report.stats.synthetic") == []
    assert impure_stats_imports("import mlflow\n", "orchestrator.report.query") == []


@pytest.mark.parametrize(
    "mods",
    [
        # the planner <-> calibrate circle: the planner takes the throughput table as an argument
        {
            "orchestrator.plan.planner": ("from orchestrator.run.driver.calibrate import x\n", False),
            "orchestrator.run.driver.calibrate": ("from orchestrator.plan.planner import resolve_train\n", False),
        },
        # relative imports, as data_pipeline writes them, one of them in a try block
        {
            "data_pipeline.a": ("from .b import f\n", False),
            "data_pipeline.b": ("try:\n    from . import a\nexcept ImportError:\n    a = None\n", False),
        },
        # one of them inside a function: a lazy import is an import all the same
        {"data_pipeline.a": ("from .b import f\n", False), "data_pipeline.b": ("def g():\n    from . import a\n", False)},
        # both lazy, in a method, round three modules (model.counts -> model.gpt -> model.registry)
        {
            "model.x": ("class C:\n    def f(self):\n        from model.y import g\n", False),
            "model.y": ("from model.z import h\n", False),
            "model.z": ("def h():\n    import model.x\n", False),
        },
    ],
)
def test_a_circle_is_found(mods):
    """Negative controls: each set of modules imports round a circle, lazily or not."""
    assert import_cycles(module_graph(mods)) == [sorted(mods)]


def test_every_circle_is_reported():
    mods = {
        "model.a": ("import model.b\n", False),
        "model.b": ("def f():\n    import model.a\n", False),
        "model.c": ("import model.d\n", False),
        "model.d": ("import model.c\nimport model.a\n", False),
    }
    assert import_cycles(module_graph(mods)) == [["model.a", "model.b"], ["model.c", "model.d"]]


def test_relative_imports_are_in_the_graph():
    graph = module_graph(product_modules())
    assert {"data_pipeline.storage", "data_pipeline.errors"} <= graph["data_pipeline.loader"]  # `from . import storage`


TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from model.{} import A\n"


def test_a_loop_closed_by_a_type_only_import_is_found():
    """Negative control: three modules round a loop (a -> b -> c -> a), the last edge under
    ``if TYPE_CHECKING:`` and one inside a function; and a pair closed by a type-only import."""
    loop = {
        "model.a": ("from model.b import f\n", False),
        "model.b": ("def g():\n    from model.c import h\n", False),
        "model.c": (TYPE_ONLY.format("a"), False),
    }
    assert import_cycles(module_graph(loop)) == [["model.a", "model.b", "model.c"]]
    pair = {"model.a": ("from model.b import f\n", False), "model.b": (TYPE_ONLY.format("a"), False)}
    assert import_cycles(module_graph(pair)) == [["model.a", "model.b"]]


MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60
# One concept per module: a module past MAX_FILE_LINES carries a line (comment or docstring)
# "Why one module: <the reason>", saying why its length is one concept, not several.
_OPENERS = "|".join(map(re.escape, ("#", '"""', "'''")))  # a comment or a docstring line
WHY_LONG = re.compile(rf"^[ \t]*({_OPENERS})?[ \t]*why one module:[ \t]*\S", re.IGNORECASE | re.MULTILINE)


def oversized(source: str, name: str) -> list[str]:
    """``name`` (a module's source) over ``MAX_FILE_LINES`` without a ``WHY_LONG`` line, and
    each function in it whose body is over ``MAX_FUNCTION_LINES`` (decorators and the signature
    excluded, docstring included)."""
    found = []
    if len(source.splitlines()) > MAX_FILE_LINES and not WHY_LONG.search(source):
        found.append(f"{name}: {len(source.splitlines())} lines, and no 'Why one module:' line")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.body[0].lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}.{node.name}: {length} lines")
    return found


def test_no_product_file_or_function_is_oversized():
    assert [o for name, (src, _) in product_modules().items() for o in oversized(src, name)] == []


def test_an_oversized_function_or_unexplained_long_module_is_caught():
    """Negative controls: a function of 61 body lines; a 601-line module without a reason, or with
    the mark and no reason; a 60-line body under a 20-line signature, a 600-line module and a
    601-line one that says why pass."""
    body = "def f():\n" + "    x = 1\n" * 61
    assert oversized(body, "m") == ["m.f: 61 lines"]
    wrapped = "def f(\n" + "    a,\n" * 19 + "):\n" + "    x = 1\n" * 60
    assert oversized(wrapped, "m") == []
    assert oversized("x = 1\n" * 601, "m") == ["m: 601 lines, and no 'Why one module:' line"]
    assert oversized("# Why one module:\n" + "x = 1\n" * 600, "m") == ["m: 601 lines, and no 'Why one module:' line"]
    assert oversized("x = 1\n" * 600, "m") == []
    assert oversized('"""Why one module: the grammar is one table."""\n' + "x = 1\n" * 600, "m") == []
    assert oversized("# why one module: one state machine\n" + "x = 1\n" * 600, "m") == []
