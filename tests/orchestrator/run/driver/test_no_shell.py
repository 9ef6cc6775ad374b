"""No spec field reaches a shell.

Static: the product's source (orchestrator/, model/, data_pipeline/) never uses a shell to
launch anything (shell=True, os.system, os.popen, subprocess with a command *string*,
asyncio.create_subprocess_shell), and a Ray job entrypoint (which Ray runs through a shell)
is never built by string formatting.

Dynamic: a real spec whose string fields and file name hold ``$(touch ...)`` / backticks /
``;`` goes through the real submit path (`orchestrator.run.driver.submit.build_job`); the entrypoint a
real /bin/sh parses is exactly the intended argv, and nothing was executed.
"""

from __future__ import annotations

import ast
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

PRODUCT = ("orchestrator", "model", "data_pipeline")
SHELL_CALLS = {
    ("os", "system"),
    ("os", "popen"),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
    ("asyncio", "create_subprocess_shell"),
    ("pty", "spawn"),
}
PROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}
SAFE_WRAPPERS = {"shell_join", "join", "quote"}  # submit.shell_join, shlex.join, shlex.quote


def _dotted(node: ast.AST) -> tuple[str, ...]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return tuple(reversed(parts))


def _is_built_string(node: ast.AST) -> bool:
    """A command assembled from text: literal, f-string, `+`/`%` on text, str.format, ' '.join."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _is_built_string(node.left) or _is_built_string(node.right) or isinstance(node.left, ast.JoinedStr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format":
            return True
        if node.func.attr == "join" and isinstance(node.func.value, ast.Constant):
            return True  # " ".join(argv): no quoting
    return False


def shell_findings(source: str, filename: str) -> list[str]:
    """Every place in `source` where a process is started through a shell or from a string."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        where = f"{filename}:{node.lineno}"
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append(f"{where}: shell={ast.unparse(kw.value)}")
            if kw.arg == "entrypoint" and _is_built_string(kw.value):
                if not (
                    isinstance(kw.value, ast.Call)
                    and _dotted(kw.value.func)[-1:]
                    and _dotted(kw.value.func)[-1] in SAFE_WRAPPERS
                    and _dotted(kw.value.func) != ("str", "join")
                ):
                    found.append(f"{where}: entrypoint built from a string: {ast.unparse(kw.value)}")
        if name[-2:] in SHELL_CALLS or name in SHELL_CALLS:
            found.append(f"{where}: {'.'.join(name)}() runs a shell")
        if (
            len(name) >= 2
            and name[-2] == "subprocess"
            and name[-1] in PROCESS_CALLS
            or (name in {("Popen",), ("check_call",), ("check_output",)})
        ):
            cmd = node.args[0] if node.args else next((kw.value for kw in node.keywords if kw.arg == "args"), None)
            if cmd is not None and _is_built_string(cmd):
                found.append(f"{where}: {'.'.join(name)}() with a command string")
    return found


def test_scanner_flags_every_shell_form() -> None:
    bad = """
import os, subprocess, asyncio
subprocess.run(f"qkstudy run {spec.name}", shell=True)
subprocess.Popen("ls " + path)
subprocess.check_output("echo %s" % x)
os.system("rm " + p)
os.popen(cmd)
asyncio.create_subprocess_shell(cmd)
client.submit_job(entrypoint=f"python -m orchestrator.cli run {path}")
client.submit_job(entrypoint=" ".join(argv))
subprocess.run(["ls", p], shell=use_shell)
"""
    assert len(shell_findings(bad, "bad.py")) == 9, shell_findings(bad, "bad.py")
    good = """
import subprocess, shlex
subprocess.run(["pg_ctl", "-D", str(d), "start"], check=True)
subprocess.Popen([sys.executable, "-m", "mlflow", "server"], shell=False)
client.submit_job(entrypoint=shell_join(["python", "-m", "orchestrator.cli", "run", rel]))
client.submit_job(entrypoint=shlex.join(argv))
client.submit_job(entrypoint=job["entrypoint"])
"""
    assert shell_findings(good, "good.py") == []


def test_product_source_never_uses_a_shell() -> None:
    files = [p for pkg in PRODUCT for p in sorted((REPO / pkg).rglob("*.py"))]
    assert files, "no product source found"
    findings = [f for p in files for f in shell_findings(p.read_text(), str(p.relative_to(REPO)))]
    assert findings == []


# --------------------------------------------------------------------------- dynamic


def _hostile(marker: Path) -> str:
    return f"$(touch {marker}); `touch {marker}`; touch {marker} | cat && echo pwned"


def test_spec_fields_with_shell_metacharacters_reach_no_shell(tmp_path: Path) -> None:
    from orchestrator.plan.spec import SpecError, load_spec
    from orchestrator.run.driver import submit

    marker = tmp_path / "pwned"
    evil = _hostile(marker)
    base = yaml.safe_load((REPO / "jobs" / "cpu-demo.yaml").read_text())

    # A study name is restricted to [A-Za-z0-9_.-]: a hostile one is refused, by name.
    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump({**base, "name": evil}))
    with pytest.raises(SpecError, match="name"):
        load_spec(named)

    # Free-text and path fields accept any string: they must still never reach a shell.
    spec = {
        **base,
        "description": evil,
        "corpus": {"source": "text", "paths": [f"/data/{evil}.txt"], "text_column": evil},
        "tracking_uri": f"http://mlflow:5000/{evil}",
        "storage_path": f"/data/{evil}",
        "workdir": f"/tmp/{evil}",
    }
    # The file name travels into the entrypoint: make it hostile too (relative marker, the
    # shell below runs in tmp_path).
    spec_file = tmp_path / "jobs" / f"study $(touch {marker.name}) `touch {marker.name}`;x.yaml"
    spec_file.parent.mkdir()
    spec_file.write_text(yaml.safe_dump(spec))
    assert load_spec(spec_file).description == evil  # the spec is valid: the fields got through

    job = submit.build_job(spec_file, "http://127.0.0.1:8265", working_dir=tmp_path)
    entrypoint = job["entrypoint"]
    rel = spec_file.relative_to(tmp_path).as_posix()
    expected = ["python", "-m", "orchestrator.cli", "run", rel]
    assert shlex.split(entrypoint) == expected
    # No field value is interpolated anywhere into the command line; only the quoted path is.
    assert "touch" not in entrypoint.replace(shlex.quote(rel), "")
    assert evil not in str(job["runtime_env"])

    # Ray's job supervisor runs the entrypoint with /bin/sh. Let a real shell parse it, with
    # printf in front so the words it would pass to python are printed instead of executed.
    sh = shutil.which("sh")
    assert sh is not None
    out = subprocess.run([sh, "-c", "printf '%s\\n' " + entrypoint], capture_output=True, text=True, check=True, timeout=30, cwd=tmp_path)
    assert out.stdout.splitlines() == expected
    assert not marker.exists(), "a shell command embedded in the spec was executed"
