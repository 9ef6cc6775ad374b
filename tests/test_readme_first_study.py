"""README's "Your first study" works as written (issue 51): its spec and its five commands, run
from a fresh folder on text files the test writes (CPython standard-library sources copied as
`.txt`), end with a report whose token-ratio section and runs are there. What the spec and the
commands are is read from README itself, so the page and the test cannot drift apart."""

from __future__ import annotations

import re
import shlex
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, qk

pytestmark = pytest.mark.slow


def _first_study() -> tuple[str, list[list[str]]]:
    """(the spec's YAML, each command's arguments after `qkstudy`) from README's section."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Your first study", 1)[1].split("\n## ", 1)[0]
    spec = re.search(r"```yaml\n(.*?)```", section, re.S)
    commands = re.search(r"```bash\n(.*?)```", section, re.S)
    assert spec and commands, "README's first study lost its spec or its commands"
    argvs = [shlex.split(line.split("#")[0])[1:] for line in commands.group(1).splitlines() if line.startswith("qkstudy ")]
    return spec.group(1), argvs


def test_the_first_study_in_readme_runs_as_written(tmp_path):
    text, argvs = _first_study()
    assert [a[0] for a in argvs] == ["validate", "plan", "run", "status", "report"]
    spec = yaml.safe_load(text)
    texts = tmp_path / spec["corpus"]["paths"][0].split("/")[0]
    texts.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(stdlib.glob("[a-k]*.py"))[:40]:  # "your own text": a few hundred KB of real prose and code
        (texts / f"{f.stem}.txt").write_text(f.read_text(errors="replace"))
    (tmp_path / "first.yaml").write_text(text)
    for argv in argvs:
        res = qk(*argv, cwd=tmp_path, timeout=600)
        assert res.returncode == 0, (argv, res.stdout[-2000:], res.stderr[-3000:])
        if argv[0] == "status":
            assert res.stdout.count("finished") == 2, res.stdout  # standard and coupled
    report = (tmp_path / "runs" / "first" / "report" / "report.md").read_text()
    assert "coupled" in report and "standard" in report and "cpu-xs" in report
