"""The unit tier's guard (tests/fixtures/tiers.py) fails an unmarked test that starts Ray, a
process group, `ray start`, a Docker engine command or a child that starts a Ray session, and
leaves marked tests and harmless children alone (the negative controls). Run as a pytest of
its own over a generated test file, so nothing here really starts."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.fixtures.tiers import forbidden_command
from tests.helpers import REPO

GUARDED = """
import os, subprocess, sys
import pytest

def test_ray_init():
    import ray
    ray.init(num_cpus=1)

def test_process_group():
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)

def test_ray_start():
    subprocess.run(["ray", "start", "--head"])

def test_docker_build():
    subprocess.run(["docker", "build", "."])

def test_child_starts_a_ray_session():
    # as Ray names a head's session: after the pid of the process that started it
    code = "import os; os.makedirs(os.path.join(os.environ['RAY_TMPDIR'], 'ray', f'session_2099-01-01_00-00-00_000000_{os.getpid()}'))"
    subprocess.run([sys.executable, "-c", code], check=True)

@pytest.mark.slow
def test_marked_test_is_not_guarded():
    import ray
    assert not getattr(ray.init, "unit_tier_guard", False)

def test_harmless_child_passes():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_a_session_of_another_process_passes():
    os.makedirs(os.path.join(os.environ["RAY_TMPDIR"], "ray", "session_2099-01-01_00-00-00_000000_1"))
"""


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_guard_fails_each_forbidden_start_and_passes_the_controls(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.fixtures.tiers"]\n')
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    (tmp_path / "ray").mkdir()
    xml = tmp_path / "out.xml"
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "RAY_TMPDIR": str(tmp_path),
        "HOME": str(tmp_path),
    }
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outcome = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcome[case.get("name")] = "passed" if bad is None else bad.get("message", "")
    for name, what in [
        ("test_ray_init", "ray.init"),
        ("test_process_group", "torch.distributed.init_process_group"),
        ("test_ray_start", "ray start"),
        ("test_docker_build", "docker build"),
        ("test_child_starts_a_ray_session", "a child process started a Ray session"),
    ]:
        # JUnit shortens a long message in its middle: the start names the cause, the end the remedy
        assert what in outcome[name] and "tier test: mark it `slow`" in outcome[name], (name, outcome[name])
    for name in ("test_marked_test_is_not_guarded", "test_harmless_child_passes", "test_a_session_of_another_process_passes"):
        assert outcome[name] == "passed", (name, outcome[name])


def test_forbidden_command_reads_argv_and_shell_strings():
    assert forbidden_command(["/usr/bin/ray", "start", "--head"]) == "ray start"
    assert forbidden_command("docker compose -f x.yaml up -d") == "docker compose up"
    assert forbidden_command(["docker-compose", "run", "svc"]) == "docker compose run"
    assert forbidden_command(["docker", "--host", "unix:///x", "run", "img"]) == "docker run"
    assert forbidden_command(["docker", "compose", "config"]) is None  # reads files, starts nothing
    assert forbidden_command(["ray", "status"]) is None and forbidden_command([]) is None


# Records which xdist worker each test would run on, and runs none (no fixture is set up).
WHERE = """
import os
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    with open(os.environ["WHERE_OUT"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " " + item.nodeid + "\\n")
    return True
"""


def _workers_by_test(tmp_path: Path, dist: str) -> dict[str, str]:
    (tmp_path / "where_probe.py").write_text(WHERE)
    out = tmp_path / f"where-{dist}.txt"
    files = [
        "tests/orchestrator/test_e2e.py",
        "tests/orchestrator/run/driver/test_unigram_tag.py",
        "tests/orchestrator/run/driver/test_tuned_study.py",
    ]
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "WHERE_OUT": str(out), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "where_probe", "-n", "2", "--dist", dist, "-m", "slow"]
        + files,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode in (0, 5), res.stdout[-3000:] + res.stderr[-3000:]  # the probe ran none of them
    return dict(line.split(" ", 1)[::-1] for line in out.read_text().splitlines())


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_tests_on_one_session_fixture_share_a_worker_and_a_plain_load_split_them(tmp_path) -> None:
    grouped = _workers_by_test(tmp_path, "loadgroup")
    own_study = ("test_bad_corpus", "test_changed_corpus")  # the e2e tests that train studies of their own
    tiny = {w for t, w in grouped.items() if ("test_e2e" in t or "unigram_tag" in t) and not any(o in t for o in own_study)}
    on_ray = {w for t, w in grouped.items() if "test_tuned_study" in t}
    assert len(grouped) > 12 and len(tiny) == 1 and len(on_ray) == 1, grouped  # the trained study, the local Ray: built once
    # negative control: xdist's plain load spreads the same tests over both workers
    loaded = _workers_by_test(tmp_path, "load")
    assert len({w for t, w in loaded.items() if "test_e2e" in t or "unigram_tag" in t}) == 2, loaded
