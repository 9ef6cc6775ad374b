"""No product code unpickles a file: checkpoints load with ``torch.load(weights_only=True)``
or through DeepSpeed's own ``engine.load_checkpoint`` (shared storage is not trusted).

A static scan of orchestrator/, model/ and data_pipeline/, with a check that the scanner
finds what it looks for.
"""

from __future__ import annotations

import ast

from tests.helpers import REPO

UNSAFE_LOADERS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("dill", "load"),
    ("dill", "loads"),
    ("joblib", "load"),
    ("cloudpickle", "load"),
    ("cloudpickle", "loads"),
}


def unsafe_loads(source: str, filename: str) -> list[str]:
    """torch.load without weights_only=True, and pickle-family loads, in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        name = (owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", ""), node.func.attr)
        if name == ("torch", "load"):
            weights_only = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append(f"{filename}:{node.lineno}: torch.load without weights_only=True")
        elif name in UNSAFE_LOADERS:
            found.append(f"{filename}:{node.lineno}: {'.'.join(name)} unpickles arbitrary objects")
    return found


def test_loader_scanner_can_fail() -> None:
    bad = "import torch, pickle\ntorch.load(p)\ntorch.load(p, weights_only=False)\npickle.loads(b)\n"
    assert len(unsafe_loads(bad, "bad.py")) == 3
    assert unsafe_loads("torch.load(p, map_location='cpu', weights_only=True)\n", "ok.py") == []


def test_product_loads_checkpoints_weights_only() -> None:
    """Checkpoints load weights-only or through DeepSpeed's engine.load_checkpoint only."""
    files = [p for pkg in ("orchestrator", "model", "data_pipeline") for p in sorted((REPO / pkg).rglob("*.py"))]
    findings = [f for p in files for f in unsafe_loads(p.read_text(), str(p.relative_to(REPO)))]
    assert findings == []
