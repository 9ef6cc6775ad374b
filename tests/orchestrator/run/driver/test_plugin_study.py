"""A plug-in variant trained end to end, as a local module beside its spec (it travels to the
Ray workers as ``runtime_env.py_modules``) and as an installed package (its entry point; the
workers import it from their environment): `qkstudy run` on a local Ray, then `qkstudy
report` over the store. The local case also trains the modern recipe (RoPE, RMSNorm, SwiGLU,
QK-norm, tied head) under ZeRO-3 over two workers: one training for both, since each costs the
suite a worker-group start."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from tests.fixtures.studies import train_study
from tests.helpers import REPO, qk, study_runs

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "gated_qk"
PACKAGE = "qkstudy_gated_qk"


@pytest.mark.parametrize("how", ["beside the spec", "installed"])
def test_a_two_arm_plug_in_study_trains_and_reports(tmp_path, how):
    spec = yaml.safe_load((EXAMPLE / "study.yaml").read_text())
    # the smallest corpus the tiny studies use: the test is about the plug-in, not the data
    spec.update(corpus={"source": "stdlib", "max_documents": 60}, tokenizer={"vocab_size": 512}, budget={"mode": "flops", "tokens": 8192})
    env = {}
    if how == "installed":
        site = tmp_path / "site"
        src = shutil.copytree(EXAMPLE, tmp_path / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(src)]
        subprocess.run(pip, check=True)
        env["PYTHONPATH"] = str(site)
        del spec["plugins"]  # the entry point loads it
    else:
        shutil.copytree(EXAMPLE / PACKAGE, tmp_path / PACKAGE)
        spec["architecture"] = {"positions": "rope", "norm": "rmsnorm", "mlp": "swiglu", "qk_norm": True, "tied_head": True}
        spec["resources"] = {"workers": 2, "cpus_per_worker": 1, "zero_stage": 3}
    folder = tmp_path / "study" if how == "installed" else tmp_path
    study = train_study(folder, spec["name"], yaml.safe_dump(spec), **env)
    client, runs = study_runs(folder, spec["name"])
    by_variant = {r.data.tags["qkstudy.variant"]: r for r in runs.values()}
    assert set(by_variant) == {"standard", "gated_qk"}
    assert all(r.data.tags["qkstudy.status"] == "finished" for r in runs.values())
    planned = {r["variant"]: r for r in study.plan}["gated_qk"]["plugin"]
    params = by_variant["gated_qk"].data.params
    assert params["plugin.module"] == PACKAGE and params["plugin.source_hash"] == planned["source_hash"]
    assert params.get("plugin.version") == ("0.1.0" if how == "installed" else None)  # a local module has none
    assert not any(k.startswith("plugin.") for k in by_variant["standard"].data.params)
    layout = {k: params.get(f"model.{k}") for k in ("positions", "mlp", "tied_head")}
    modern = {"positions": "rope", "mlp": "swiglu", "tied_head": "True"}
    assert layout == (dict.fromkeys(modern) if how == "installed" else modern)  # the GPT-2 default logs none of them
    # seed-paired and zero-init gate: the first loss is standard's; then the gate trains and the curves part
    std_loss = client.get_metric_history(by_variant["standard"].info.run_id, "train/loss")
    gated_loss = client.get_metric_history(by_variant["gated_qk"].info.run_id, "train/loss")
    assert len(std_loss) == len(gated_loss) > 0 and std_loss[0].value == pytest.approx(gated_loss[0].value, abs=1e-4)
    assert [m.value for m in std_loss] != [m.value for m in gated_loss]
    report = qk("report", study.spec.name, cwd=folder, env=study.env)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "gated_qk" in (folder / "runs" / spec["name"] / "report" / "report.md").read_text()
