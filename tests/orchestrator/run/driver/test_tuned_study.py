"""LR tuning end to end on one tuned study (real Ray, DeepSpeed and MLflow; a tiny custom shape,
a 2-point grid, standard and differential): a 2-point grid always has its best LR at an edge,
so each arm's grid must extend beyond it at the grid's ratio (one point per side at most);
the chosen LR is the argmin of tuning val loss over the extended grid among the runs below
the corpus's unigram perplexity, and the main runs train at it; the report shows the table
with the extended points; a resubmit trains nothing; and one study lease spans both stages:
a real second driver started between them is refused and trains nothing."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from rich.console import Console

import orchestrator.run.driver.study as study_mod
from orchestrator.plan.spec import parse_spec
from orchestrator.track.lease import STUDY_LEASE, Lease, LeaseHeld, read_lease
from orchestrator.track.tracking import study_tracking_uri
from tests.helpers import qk

pytestmark = pytest.mark.slow

GRID = (0.01, 0.03)
RATIO = GRID[1] / GRID[0]
EXTENDED = {float(f"{GRID[0] / RATIO:.4g}"), float(f"{GRID[1] * RATIO:.4g}")}  # one point beyond either edge
# runs_per_trainer packs each stage's runs (one shape) into one worker group. Tuning runs are 64
# steps: long enough to get below the unigram perplexity at these LRs.
SPEC = f"""\
name: tune
corpus: {{source: stdlib, max_documents: 60}}
tokenizer: {{vocab_size: 512}}
scales: [{{name: tiny, n_layer: 1, d_model: 32, n_head: 2, seq_len: 64, global_batch: 8}}]
variants: [standard, differential]
budget: {{mode: tokens, tokens: 65536}}
train: {{log_every_steps: 1}}           # the logged LR peaks at the run's peak LR
tune: {{lr: [{GRID[0]}, {GRID[1]}], tokens: 32768, min_steps: 64, extend_edges: 1}}
eval: {{num_evals: 2, max_windows: 4, final_max_windows: 8}}
resources: {{workers: 1, cpus_per_worker: 1, zero_stage: 2, runs_per_trainer: 4}}
"""


@dataclass
class Tuned:
    folder: Path
    uri: str
    storage: str
    result: object
    seen: dict  # what the hook between the stages saw


def _records(uri: str, name: str) -> list:
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(name)
    return [] if exp is None else c.search_runs([exp.experiment_id])


def _runs(c, exp_id, kind):
    return c.search_runs([exp_id], f"tags.`qkstudy.kind` = '{kind}'")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, local_ray):
    """The tuned study run in-process (``run_study``) with a hook right after the tuning stage
    returned, before the main runs are planned: it reads the study lease, tries a second
    driver's acquisition, and runs a real second `qkstudy run` of the same spec."""
    d = tmp_path_factory.mktemp("tuned")
    text = SPEC + f"workdir: {d / 'runs' / 'tune'}\n"
    (d / "tune.yaml").write_text(text)
    study = parse_spec(yaml.safe_load(text))
    storage, uri = study.resolved_storage_path, study_tracking_uri(study)
    seen: dict = {}
    real_outcomes = study_mod.tuning_outcomes

    def between_stages(tracking_uri, study_name, runs):
        out = real_outcomes(tracking_uri, study_name, runs)
        if "second" in seen:  # a later round of the tuning stage (an edge extension)
            return out
        seen["tuning_ids"] = {r.run_id for r in runs}
        seen["holder"] = read_lease(storage, STUDY_LEASE)  # a lease per stage: None (released) here
        try:  # a second driver's acquisition, judged by heartbeat alone as one on another machine would
            Lease(storage, STUDY_LEASE, local_liveness=False).acquire().release()
            seen["acquired"] = True
        except LeaseHeld as e:
            seen["refused_by"] = e.holder.pid
        t0 = time.time()
        seen["second"] = qk("run", str(d / "tune.yaml"), cwd=d, timeout=600)
        seen["second_s"] = time.time() - t0
        seen["records_after_second"] = sorted(r.data.tags["qkstudy.run_id"] for r in _records(uri, study_name))
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(study_mod, "tuning_outcomes", between_stages)
    try:
        result = study_mod.run_study(study, console=Console(quiet=True))
    finally:
        mp.undo()
    return Tuned(d, uri, storage, result, seen)


def test_the_edge_grid_extends_and_main_runs_train_at_the_argmin_below_unigram(tuned):
    c = MlflowClient(tuned.uri)
    exp = c.get_experiment_by_name("tune")
    tuning, main = _runs(c, exp.experiment_id, "tune"), _runs(c, exp.experiment_id, "train")
    assert 2 * (len(GRID) + 1) <= len(tuning) <= 2 * (len(GRID) + 2) and len(main) == 2
    bar = math.log(float(exp.tags["qkstudy.unigram_ppl.stdlib"]))  # nats/token
    loss: dict[str, dict[float, float]] = {}
    for r in tuning:
        assert r.data.tags["qkstudy.status"] == "finished" and r.info.run_name.startswith("tune-")
        loss.setdefault(r.data.tags["qkstudy.variant"], {})[float(r.data.params["lr"])] = r.data.metrics["final/val_loss"]
    for variant, by_lr in loss.items():
        added = set(by_lr) - set(GRID)
        assert set(GRID) <= set(by_lr) and added and added <= EXTENDED, (variant, sorted(by_lr))
        # the first extension is beyond the edge holding the grid's best (below unigram; when no
        # point is, the lowest loss)
        usable = [g for g in GRID if by_lr[g] < bar] or list(GRID)
        first = min(usable, key=lambda g: by_lr[g])
        assert float(f"{(first * RATIO if first == GRID[1] else first / RATIO):.4g}") in added, (variant, by_lr, bar)
    for r in main:
        by_lr = loss[r.data.tags["qkstudy.variant"]]
        usable = {g: x for g, x in by_lr.items() if x < bar}
        assert usable, (by_lr, bar)  # the test's runs are long enough to beat unigram somewhere
        best = min(usable, key=lambda g: usable[g])  # the argmin of the extended grid, computed here
        assert math.isclose(float(r.data.params["lr"]), best, rel_tol=1e-9)
        peak = max(m.value for m in c.get_metric_history(r.info.run_id, "lr"))
        assert math.isclose(peak, best, rel_tol=1e-6), (r.info.run_name, peak, best)


def test_one_study_lease_spans_both_stages_and_a_second_driver_between_them_trains_nothing(tuned):
    seen = tuned.seen
    # negative control: with a lease per stage, the lease was free at this point
    holder = seen["holder"]
    assert holder is not None and holder.pid == os.getpid(), holder
    assert "acquired" not in seen and seen["refused_by"] == os.getpid()
    second = seen["second"]
    assert second.returncode == 2, (second.stdout[-3000:], second.stderr[-3000:])
    flat = " ".join(second.stderr.split())
    assert f"study 'tune' is being run by pid {os.getpid()} on host" in flat, flat
    assert seen["records_after_second"] == sorted(seen["tuning_ids"])  # it registered and trained nothing
    # both stages ran, each run id trained exactly once (one MLflow record each, finished)
    records = _records(tuned.uri, "tune")
    ids = [r.data.tags["qkstudy.run_id"] for r in records]
    n_tune = sum(r.data.tags["qkstudy.kind"] == "tune" for r in records)
    assert len(ids) == len(set(ids)) == n_tune + 2, ids
    assert sorted(r.data.tags["qkstudy.kind"] for r in records) == ["train"] * 2 + ["tune"] * n_tune
    assert all(r.data.tags["qkstudy.status"] == "finished" for r in records)
    assert tuned.result.ok and tuned.result.status == {i: "finished" for i in ids}, tuned.result.status
    assert read_lease(tuned.storage, STUDY_LEASE) is None  # released when the study returned
    print(f"second driver refused in {seen['second_s']:.1f} s")


def test_report_shows_the_tuning_table_and_a_resubmit_trains_nothing(tuned):
    out = tuned.folder / "report"
    rep = qk("report", "tune.yaml", "--out", str(out), cwd=tuned.folder)
    assert rep.returncode == 0, rep.stderr[-3000:]
    md = (out / "report.md").read_text()
    assert "Learning-rate tuning" in md and "chosen_lr" in md and "extended" in md and "the grid was extended" in md
    assert f"lr {GRID[0]:g}" in md and f"lr {GRID[1]:g}" in md

    c = MlflowClient(tuned.uri)
    exp_id = c.get_experiment_by_name("tune").experiment_id
    n_before = len(c.search_runs([exp_id]))
    again = qk("run", "tune.yaml", cwd=tuned.folder)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished" in again.stderr
    assert len(c.search_runs([exp_id])) == n_before  # no new record of any kind
    assert len(_runs(c, exp_id, "train")) == 2
