"""End to end: a tiny study through real Ray, real DeepSpeed ZeRO-2 (2 workers) and a real
MLflow SQLite store, then the report, asserting on what MLflow holds."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.track.timeline import PREFIX, SECTIONS, TOTAL
from orchestrator.track.tracking import run_tags
from tests.helpers import REPO, qk, sqlite_client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(tiny_study):
    """The session's trained tiny study (tests/fixtures/studies.py), read-only."""
    return tiny_study.folder, tiny_study.env, tiny_study.plan, tiny_study.log


def _train_runs(d):
    c = sqlite_client(d, "e2e")
    exp = c.get_experiment_by_name("e2e")
    runs = c.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    return c, runs


def test_one_finished_mlflow_run_per_planned_run(study):
    d, _, plan, _ = study
    c, runs = _train_runs(d)
    assert sorted(r.data.tags["qkstudy.run_id"] for r in runs) == sorted(p["run_id"] for p in plan)
    by_id = {r.data.tags["qkstudy.run_id"]: r for r in runs}
    for p in plan:
        r = by_id[p["run_id"]]
        t = run_tags(r.data.tags)
        assert (t["study"], t["variant"], t["scale"], t["seed"], t["corpus"]) == ("e2e", p["variant"], "cpu-xs", "0", "stdlib")
        assert t["extend"] == ("2" if p["extend"] == 2 else "1") and t["status"] == "finished"
        assert r.info.status == "FINISHED"
        tokens = c.get_metric_history(r.info.run_id, "tokens")
        steps = [m.step for m in tokens]
        assert steps == sorted(set(steps)) and steps[-1] == p["tokens"]
        assert [m.value for m in tokens] == steps  # step is tokens seen
        val = c.get_metric_history(r.info.run_id, "val/ppl")
        assert val[-1].step == p["tokens"] and 1.0 < val[-1].value < 512
        # the final pass: the curve's 8 windows and 8 more, so near (not equal to) the last curve point
        (final,) = c.get_metric_history(r.info.run_id, "final/val_ppl")
        assert final.step == p["tokens"] and final.value == pytest.approx(val[-1].value, rel=0.2)
        assert r.data.params["data_hash"] == p["data_hash"] and r.data.params["tokenizer_hash"]
        assert int(r.data.params["n_params"]) == p["n_params"]
        assert {
            "train/loss",
            "lr",
            "grad_norm",
            "flops",
            "time/wall_s",
            "throughput/tokens_per_s",
            "attn/entropy",
            "attn/effective_rank",
        } <= set(r.data.metrics)
        m = r.data.metrics  # the time split, logged once at the last step
        parts = [m[f"time/{k}_s"] for k in ("startup", "step", "eval", "checkpoint")]
        assert all(x > 0 for x in parts) and sum(parts) <= m["time/elapsed_s"]
        # the steps' time is wall_s plus the attempt's first step (its warm-up), which the timeline times
        assert 0 < m["time/step_s"] - m["time/wall_s"] <= m[f"{PREFIX}first_step_s"], m


def test_each_run_records_the_code_spec_and_environment_it_came_from(tiny_study):
    """Every run names the commit of the checkout it ran from and whether that was dirty (as git
    says now: nothing here changes the code), the qkstudy version, the user, the resolved spec's
    hash (with the spec as an artifact) and the spec's description as its note, like its experiment."""
    import getpass
    from importlib.metadata import version

    import yaml

    from orchestrator.plan.spec import load_spec
    from orchestrator.track import provenance as P

    c, runs = _train_runs(tiny_study.folder)
    code = P.git_state(P.CODE_ROOT)
    digest = P.resolved_spec(load_spec(tiny_study.spec), tiny_study.spec)[1]
    for r in runs:
        t = r.data.tags
        if code["commit"]:  # a checkout (CI's clone, a developer's tree)
            assert t[P.COMMIT_TAG] == code["commit"] and t[P.DIRTY_TAG] == str(code["dirty"]).lower()
        else:
            assert P.COMMIT_TAG not in t and t[P.SOURCE_TAG] == P.NOT_A_CHECKOUT
        assert t[P.VERSION_TAG] == version("qkstudy") and t["mlflow.user"] == getpass.getuser()
        assert t["mlflow.source.type"] == "LOCAL" and t[P.SPEC_HASH_TAG] == digest
        assert t[P.NOTE_TAG] == "the end-to-end tests' study"
        resolved = yaml.safe_load(Path(c.download_artifacts(r.info.run_id, P.RESOLVED_ARTIFACT)).read_text())
        assert resolved["resolved"]["name"] == "e2e" and resolved["extends_chain"][0]["file"] == "e2e.yaml"
    assert c.get_experiment_by_name("e2e").tags[P.NOTE_TAG] == "the end-to-end tests' study"


def test_loss_goes_down(study):
    d, *_ = study
    c, runs = _train_runs(d)
    for r in runs:
        hist = c.get_metric_history(r.info.run_id, "train/loss")
        assert hist[-1].value < hist[0].value - 0.5


def test_each_run_logs_its_start_up_timeline_from_the_command(tiny_study):
    """Every run logs where its seconds to the first optimizer step went; the sections add up to
    its total. The study's three runs share one worker group (runs_per_trainer auto: a
    two-worker group fills the two CPUs): the first run's total is the time from the command's
    start (this test's clock, just before it started `qkstudy run`) to the moment rank 0 logged
    it after that step; each later run's starts where the previous one ended."""
    c, runs = _train_runs(tiny_study.folder)
    first = [r for r in runs if f"{PREFIX}worker_group_s" in r.data.metrics]
    assert len(first) == 1 and len(runs) == 3
    later = {f"{PREFIX}{s}_s" for s in ("worker_imports", "model", "data_loader", "engine", "restore", "first_step")}
    for r in runs:
        (total,) = c.get_metric_history(r.info.run_id, TOTAL)
        sections = {k: v for k, v in r.data.metrics.items() if k.startswith(PREFIX) and k != TOTAL}
        assert set(sections) == ({f"{PREFIX}{s}_s" for s in SECTIONS} if r is first[0] else later)
        assert all(v >= 0 for v in sections.values()) and sum(sections.values()) == pytest.approx(total.value, abs=1.0)
        planned = next(p for p in tiny_study.plan if p["run_id"] == r.data.tags["qkstudy.run_id"])
        assert total.step == planned["tokens"] // planned["steps"]  # logged at the first step
    (total,) = c.get_metric_history(first[0].info.run_id, TOTAL)
    # the clock of the test and of the driver is one: the timeline starts at the command
    assert total.timestamp / 1000 - tiny_study.started_at == pytest.approx(total.value, abs=1.0)
    sections = first[0].data.metrics
    assert sections[f"{PREFIX}worker_group_s"] > 0.5 and sections[f"{PREFIX}ray_s"] > 0.5


def test_training_finds_the_prebuilt_shm_op_up_to_date(tiny_study):
    """The workers build the op with the ninja the install-time prebuild used, whichever ninja
    the driver's PATH finds first (another version would rebuild it: run/ext_lock.py)."""
    before, after = tiny_study.op_mtime_ns
    assert before is not None, "the install-time prebuild left no shm op"
    assert after == before, "the training rebuilt the shm op"


def test_resubmit_trains_nothing(tiny_study_copy):
    d, env, plan = tiny_study_copy.folder, tiny_study_copy.env, tiny_study_copy.plan
    before = {r.info.run_id for r in _train_runs(d)[1]}
    res = qk("run", "e2e.yaml", cwd=d, env=env)
    assert res.returncode == 0, res.stderr
    assert f"{len(plan)} run(s) already finished in MLflow: skipped (Ray not started)" in res.stderr
    assert {r.info.run_id for r in _train_runs(d)[1]} == before


RERUN_WITHOUT_RAY = """\
import ray
from rich.console import Console
from orchestrator.plan.spec import load_spec
from orchestrator.run.driver.study import run_study
assert not ray.is_initialized()
res = run_study(load_spec("e2e.yaml"), console=Console(quiet=True))
print(json.dumps({"ray_started": ray.is_initialized(), "ok": res.ok, "status": res.status}))
"""


def test_rerun_of_a_finished_study_decides_from_mlflow_without_ray(tiny_study_copy):
    """In a fresh process (this one may hold the session's local Ray): ``run_study`` of the
    finished study decides from MLflow alone and never initializes Ray."""
    d, env, plan = tiny_study_copy.folder, tiny_study_copy.env, tiny_study_copy.plan
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + RERUN_WITHOUT_RAY], cwd=d, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert not res["ray_started"], "a finished study started Ray"
    assert res["ok"] and res["status"] == {p["run_id"]: "skipped" for p in plan}


def test_report_reads_mlflow_and_is_reproducible(tiny_study_copy):
    d, env, plan = tiny_study_copy.folder, tiny_study_copy.env, tiny_study_copy.plan
    out = d / "report"
    res = qk("report", "e2e.yaml", "--out", str(out), "--json", cwd=d, env=env)
    assert res.returncode == 0, res.stderr
    first = json.loads(res.stdout)
    assert [s["scale"] for s in first] == ["cpu-xs"]
    assert set(first[0]["final_ppl"]) == {"standard", "coupled"}
    assert isinstance(first[0]["censored"], bool)
    assert (out / "report.md").exists() and any(out.glob("*.png"))
    split = json.loads((out / "summary.json").read_text())["time_split"]
    assert split["recorded"] and split["runs"] == len(plan) and 0 < split["outside_steps"] < 1
    assert "Where the time went" in (out / "report.md").read_text()
    _, runs = _train_runs(d)
    finals = {r.data.tags["qkstudy.variant"]: r.data.metrics["final/val_ppl"] for r in runs if r.data.tags["qkstudy.extend"] == "1"}
    for v, ppl in finals.items():
        assert first[0]["final_ppl"][v] == pytest.approx(ppl)
    shutil.rmtree(out)
    again = json.loads(qk("report", "e2e.yaml", "--out", str(out), "--json", cwd=d, env=env).stdout)
    assert again == first


@pytest.mark.parametrize(
    "case,corpus,expect",
    [
        ("too_small", {"source": "text", "paths": ["docs"], "val_fraction": 0.5}, "corpus: corpus 'text': the val split has"),
        ("empty", {"source": "text", "paths": ["empty"]}, "corpus.paths: source 'text' (empty): no files match ['empty']"),
    ],
)
def test_bad_corpus_exits_2_before_mlflow(case, corpus, expect, tmp_path):
    import yaml

    (tmp_path / "docs").mkdir()
    (tmp_path / "empty").mkdir()
    text = (REPO / "README.md").read_text()[:3000]
    for i in range(4):  # ~1,000 tokens each: fewer than one 4,097-token window per split
        (tmp_path / "docs" / f"d{i}.txt").write_text(f"{i}\n{text}")
    spec = {
        "name": case,
        "corpus": corpus,
        "tokenizer": {"vocab_size": 400},
        "scales": ["cpu-xs"],
        "variants": ["standard"],
        "budget": {"tokens": 8 * 4096, "max_epochs": 1e6},  # prepare's own check is the subject
        "train": {"global_batch": 8, "seq_len": 4096},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    res = qk("run", "s.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "s.yaml: " + expect in res.stderr.replace("\n", " "), res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "\x1b[" not in res.stderr
    assert not (tmp_path / "runs" / case / "mlflow.db").exists()


SUPERSEDE_SPEC = """\
name: sup
corpus: {source: text, paths: [docs], val_fraction: 0.3}
tokenizer: {vocab_size: 512}
scales: [cpu-xs]
variants: [standard]
budget: {mode: tokens, tokens: 10240}
train: {global_batch: 8, seq_len: 64}
eval: {num_evals: 2, max_windows: 8}
resources: {workers: 1, cpus_per_worker: 1, zero_stage: 2}
"""


def test_changed_corpus_file_trains_new_runs_and_supersedes_the_old(tmp_path):
    """Edit one corpus file after a study finished: the re-run trains a new run (new id, new
    MLflow run, new Ray Train name), the old record keeps its metrics and is marked superseded,
    nothing fails; a third run trains nothing."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, f in enumerate(sorted((REPO / "orchestrator").rglob("*.py"))[:10]):
        (docs / f"d{i}.txt").write_text(f.read_text()[:6000])
    (tmp_path / "sup.yaml").write_text(SUPERSEDE_SPEC)
    env = {**os.environ, "QKSTUDY_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    res = qk("run", "sup.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    c = sqlite_client(tmp_path, "sup")
    exp_id = c.get_experiment_by_name("sup").experiment_id
    (old,) = c.search_runs([exp_id])
    keys = ("train/loss", "val/loss", "final/val_loss", "tokens")

    def history(mlflow_id):
        return {k: [(m.step, m.value) for m in c.get_metric_history(mlflow_id, k)] for k in keys}

    before = history(old.info.run_id)
    (docs / "d3.txt").write_text((docs / "d3.txt").read_text() + "\n# one more line\n")
    res = qk("run", "sup.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "superseded" in res.stderr
    runs = {r.info.run_id: r for r in c.search_runs([exp_id])}  # every kind
    assert len(runs) == 2
    o = runs.pop(old.info.run_id)
    (new,) = runs.values()
    assert o.data.tags["qkstudy.kind"] == "superseded" and o.data.tags["qkstudy.status"] == "finished"
    assert o.data.tags["qkstudy.superseded_by"] == new.data.tags["qkstudy.run_id"] != o.data.tags["qkstudy.run_id"]
    assert "trained on other data" in o.data.tags["qkstudy.superseded_reason"]
    assert history(o.info.run_id) == before  # untouched
    assert new.data.tags["qkstudy.kind"] == "train" and new.data.tags["qkstudy.status"] == "finished"
    assert new.info.status == "FINISHED" and "qkstudy.restarts" not in new.data.tags  # trained from scratch
    assert new.data.params["data_hash"] != o.data.params["data_hash"]
    assert history(new.info.run_id)["tokens"][-1] == (10240, 10240.0)
    plan = json.loads(qk("plan", "sup.yaml", "--json", cwd=tmp_path, env=env).stdout)
    assert [(p["run_id"], p["data_hash"]) for p in plan] == [(new.data.tags["qkstudy.run_id"], new.data.params["data_hash"])]
    res = qk("run", "sup.yaml", cwd=tmp_path, env=env)
    assert res.returncode == 0 and "1 run(s) already finished in MLflow: skipped" in res.stderr, res.stderr[-3000:]
    assert len(c.search_runs([exp_id])) == 2
