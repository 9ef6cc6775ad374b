"""Plug-in variants (`model.plugins`) as a user meets them: a module beside the spec, an
installed package's entry point, and the errors of one that cannot be used. Each case runs
the CLI in a child process, so no plug-in stays in this process's registry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli_errors import EXIT_INPUT
from tests.helpers import REPO, plan_json, qk

EXAMPLE = REPO / "examples" / "gated_qk"
PACKAGE = "qkstudy_gated_qk"


def _study(d: Path, plugins: list[str] | None = None, variants: tuple[str, ...] = ("standard", "gated_qk")) -> Path:
    spec = yaml.safe_load((EXAMPLE / "study.yaml").read_text())
    spec["variants"] = list(variants)
    if plugins is None:
        spec.pop("plugins")
    else:
        spec["plugins"] = plugins
    f = d / "study.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


@pytest.fixture
def beside(tmp_path) -> Path:
    """The example plug-in's package copied beside a copy of its study spec."""
    shutil.copytree(EXAMPLE / PACKAGE, tmp_path / PACKAGE)
    return _study(tmp_path, [PACKAGE])


def _ids(runs: list[dict]) -> dict[str, str]:
    return {r["variant"]: r["run_id"] for r in runs}


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_module_beside_the_spec_plans_and_its_source_is_in_the_plug_in_runs_identity(beside):
    runs = plan_json(beside)
    by_variant = {r["variant"]: r for r in runs}
    plugin = by_variant["gated_qk"]["plugin"]
    assert plugin["module"] == PACKAGE and plugin["version"] is None  # local: no distribution
    assert plugin["path"] == str(beside.parent / PACKAGE) and len(plugin["source_hash"]) == 64
    assert by_variant["standard"]["plugin"] is None
    # a built-in run's id does not depend on a plug-in being loaded
    (beside.parent / "alone").mkdir()
    alone = _ids(plan_json(_study(beside.parent / "alone", variants=("standard",))))
    assert alone["standard"] == by_variant["standard"]["run_id"]
    # edited plug-in code: new runs of its variant, the same standard run
    init = beside.parent / PACKAGE / "__init__.py"
    init.write_text(init.read_text().replace("1 + torch.tanh(self.g)", "1 + 0.5 * torch.tanh(self.g)"))
    edited = {r["variant"]: r for r in plan_json(beside)}
    assert edited["gated_qk"]["run_id"] != by_variant["gated_qk"]["run_id"]
    assert edited["gated_qk"]["plugin"]["source_hash"] != plugin["source_hash"]
    assert edited["standard"]["run_id"] == by_variant["standard"]["run_id"]


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_an_installed_package_is_loaded_by_its_entry_point_and_its_version_is_recorded(tmp_path):
    src, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(src)], check=True
    )
    d = tmp_path / "study"
    d.mkdir()
    spec = _study(d)  # no `plugins:` line: the entry point names the module
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    out = qk("plan", spec.name, "--json", cwd=d, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    plugin = {r["variant"]: r for r in json.loads(out.stdout)}["gated_qk"]["plugin"]
    assert plugin["version"] == "0.1.0" and plugin["path"] == str(site / PACKAGE)
    # without the package the same spec names an unknown variant
    bare = qk("validate", spec.name, cwd=d)
    assert bare.returncode == EXIT_INPUT and "gated_qk" in bare.stderr


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
@pytest.mark.parametrize(
    "source, says",
    [
        ("import torch\nraise ImportError('needs flash_attn')\n", "failed to import: ImportError: needs flash_attn"),
        ("x = 1\n", "registered no variant"),
        (
            # q' drops a channel: the stage contract's shapes
            "from torch import nn\nfrom model import Variant, register\n"
            "class Cut(nn.Module):\n    def forward(self, q, k):\n        return q[..., :-1], k\n"
            "    def num_flops_per_token(self, seq_len):\n        return 0\n"
            "register(Variant('cut_q', 'broken', qk_transform=lambda cfg: Cut()))\n",
            "breaks the stage contract: variant 'cut_q'",
        ),
        ("from model import Variant, register\nregister(Variant('coupled', 'a second coupled'))\n", "'coupled' is already registered"),
    ],
)
def test_a_plug_in_that_cannot_be_used_is_an_input_error_naming_it(tmp_path, source, says):
    (tmp_path / "broken_plugin.py").write_text(source)
    spec = _study(tmp_path, ["broken_plugin"], variants=("standard",))
    out = qk("validate", spec.name, cwd=tmp_path)
    assert out.returncode == EXIT_INPUT, out.stderr
    assert "study.yaml" in out.stderr and "plugins" in out.stderr and "broken_plugin" in out.stderr
    assert says in " ".join(out.stderr.split()), out.stderr


def test_an_unknown_plug_in_module_is_an_input_error(tmp_path):
    spec = _study(tmp_path, ["no_such_plugin"], variants=("standard",))
    out = qk("validate", spec.name, cwd=tmp_path)
    assert out.returncode == EXIT_INPUT and "no_such_plugin" in out.stderr and "ModuleNotFoundError" in out.stderr


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_model_check_loads_a_plug_in(beside):
    out = qk("model", "check", "gated_qk", "--plugin", PACKAGE, "--option", "gate_init=0.5", "--json", cwd=beside.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    assert len(rows) == 7 and all(r["ok"] is not False for r in rows)
    paired = next(r for r in rows if r["name"].startswith("shared"))
    assert paired["ok"] is True


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_run_planned_with_other_plug_in_code_refuses_to_train(beside):
    """The worker's check (`load_planned`): the code that trains is the code the run id names."""
    planned = {r["variant"]: r for r in plan_json(beside)}["gated_qk"]["plugin"]
    code = (
        "import sys, json; from model.plugins import load_planned, PluginError\n"
        f"sys.path.insert(0, {str(beside.parent)!r})\n"
        "p = json.loads(sys.argv[1])\n"
        "try:\n    load_planned(p)\nexcept PluginError as e:\n    print('refused:', e); sys.exit(3)\n"
    )
    same = subprocess.run([sys.executable, "-c", code, json.dumps(planned)], capture_output=True, text=True, cwd=REPO)
    assert same.returncode == 0, same.stderr
    other = subprocess.run(
        [sys.executable, "-c", code, json.dumps({**planned, "source_hash": "0" * 64})], capture_output=True, text=True, cwd=REPO
    )
    assert other.returncode == 3 and "is not the one the run was planned with" in other.stdout


def test_a_plug_in_that_exits_at_import_is_an_input_error_not_a_success(tmp_path):
    (tmp_path / "quits.py").write_text("raise SystemExit(0)\n")
    out = qk("validate", _study(tmp_path, ["quits"], variants=("standard",)).name, cwd=tmp_path)
    assert out.returncode == EXIT_INPUT and "failed to import: SystemExit" in out.stderr


def test_an_import_error_names_the_plug_ins_file_and_line(tmp_path):
    (tmp_path / "boom.py").write_text("x = 1\n\nraise RuntimeError('boom at import')\n")
    out = qk("validate", _study(tmp_path, ["boom"], variants=("standard",)).name, cwd=tmp_path)
    assert out.returncode == EXIT_INPUT
    assert f"RuntimeError: boom at import ({tmp_path / 'boom.py'}, line 3)" in "".join(out.stderr.splitlines())


@pytest.mark.parametrize("name", ["yaml", "tabulate"])
def test_a_local_module_named_like_an_installed_one_is_refused(tmp_path, name):
    """It would shadow the installed module here (yaml: already imported; tabulate: not yet),
    and the workers, which import by name, would get the installed one."""
    (tmp_path / f"{name}.py").write_text((EXAMPLE / PACKAGE / "__init__.py").read_text())
    out = qk("validate", _study(tmp_path, [name]).name, cwd=tmp_path)
    assert out.returncode == EXIT_INPUT, out.stderr
    assert "has the name of another importable module" in " ".join(out.stderr.split())


def test_a_path_is_not_a_plug_in_name(tmp_path):
    out = qk("validate", _study(tmp_path, ["./gated.py"], variants=("standard",)).name, cwd=tmp_path)
    assert out.returncode == EXIT_INPUT and "is not a module name" in out.stderr


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_a_dotted_plug_in_ships_and_hashes_its_whole_top_level_package(tmp_path):
    pkg = tmp_path / "mypkg"
    shutil.copytree(EXAMPLE / PACKAGE, pkg / "variants")
    (pkg / "__init__.py").write_text("")
    spec = _study(tmp_path, ["mypkg.variants"])
    plugin = {r["variant"]: r for r in plan_json(spec)}["gated_qk"]["plugin"]
    assert plugin["path"] == str(pkg)  # the workers import mypkg.variants from it
    (pkg / "__init__.py").write_text("SCALE = 1\n")  # the parent package is the plug-in's code too
    assert {r["variant"]: r for r in plan_json(spec)}["gated_qk"]["plugin"]["source_hash"] != plugin["source_hash"]


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_an_identical_copy_elsewhere_is_not_a_shadow_but_a_different_one_is(tmp_path, beside):
    """Inside a submitted job the spec's folder and the job's py_modules hold the same plug-in."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(EXAMPLE / PACKAGE, elsewhere / PACKAGE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(elsewhere), str(REPO)])}
    assert qk("validate", beside.name, cwd=beside.parent, env=env).returncode == 0
    init = elsewhere / PACKAGE / "__init__.py"
    init.write_text(init.read_text() + "\n# another version\n")
    out = qk("validate", beside.name, cwd=beside.parent, env=env)
    assert out.returncode == EXIT_INPUT and "has the name of another importable module" in " ".join(out.stderr.split())
