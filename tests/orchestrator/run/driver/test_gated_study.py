"""A gated ladder end to end (real Ray, DeepSpeed and MLflow, through ``qkstudy run``): two
tiny rungs, three seeds, the reference and an arm made worse on purpose (the same model at a
peak LR of 1e-7, which barely moves from its initial loss). The gate stops the bad arm after
rung 1: it is not trained at rung 2 while the reference is; the stop and its evidence are an
experiment tag; the report marks the arm as stopped; a resubmit trains nothing."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.track.gate_record import gate_ran_from_tags, recorded_gates
from tests.fixtures.studies import train_study
from tests.helpers import qk

pytestmark = pytest.mark.slow

SPEC = """\
name: gated
corpus: {source: stdlib, max_documents: 60}
tokenizer: {vocab_size: 512}
scales:
  - {name: tiny2, n_layer: 1, d_model: 48, n_head: 2, seq_len: 64, global_batch: 8}
  - {name: tiny1, n_layer: 1, d_model: 32, n_head: 2, seq_len: 64, global_batch: 8}
variants: [standard, {name: frozen, kind: standard, lr: 1.0e-7}]
seeds: [0, 1, 2]
budget: {mode: tokens, tokens: 4096}
gate: {metric: paired_delta_loss, worse_than: 0.02, currency: tokens}
eval: {num_evals: 2, max_windows: 4, final_max_windows: 8, diagnostics: false}
resources: {workers: 1, cpus_per_worker: 1, zero_stage: 2, runs_per_trainer: 6}
"""


def test_the_gate_stops_the_bad_arm_and_the_reference_trains_every_rung(tmp_path):
    study = train_study(tmp_path, "gated", SPEC)
    assert "rung 1/2 (tiny1)" in study.log and "rung 2/2 (tiny2)" in study.log  # rungs by N, not spec order
    client = MlflowClient(study.tracking_uri)
    exp = client.get_experiment_by_name("gated")
    runs = client.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")
    trained = sorted((r.data.tags["qkstudy.variant"], r.data.tags["qkstudy.scale"], r.data.tags["qkstudy.status"]) for r in runs)
    assert (
        trained == [("frozen", "tiny1", "finished")] * 3 + [("standard", "tiny1", "finished")] * 3 + [("standard", "tiny2", "finished")] * 3
    )

    [ev] = recorded_gates(study.tracking_uri, "gated")
    assert (ev.variant, ev.scale, ev.rung, ev.skipped, ev.n_pairs) == ("frozen", "tiny1", 1, ("tiny2",), 3)
    assert ev.stopped and ev.dloss > 0.02 and ev.low > 0
    assert "3 gated" in study.log and f"gate frozen ({ev.corpus}): {ev.sentence()}" in " ".join(study.log.split())
    # the gate's own record: its settings and the rungs it decided after (none after the largest)
    ran = gate_ran_from_tags(client.get_experiment(exp.experiment_id).tags)
    assert ran is not None and ran["decided_after"] == ["tiny1"] and ran["gate"]["worse_than"] == 0.02

    again = qk("run", "gated.yaml", cwd=study.folder, env=study.env)  # a resubmit: decides the same, trains nothing
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 gated, 9 skipped" in again.stderr and "Ray not started" in again.stderr
    assert len(client.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")) == 9

    status = qk("status", "gated.yaml", "--json", cwd=study.folder, env=study.env)
    assert status.returncode == 0, status.stderr[-3000:]
    rows = [r for r in json.loads(status.stdout)["runs"] if r["status"] == "gated"]
    assert len(rows) == 3 and all(r["run_name"].startswith("frozen") and "stopped at rung 1" in r["note"] for r in rows)

    plan = qk("plan", "gated.yaml", cwd=study.folder, env=study.env)
    assert plan.returncode == 0 and "worst case" in plan.stdout and "best case" in plan.stdout

    report = qk("report", "gated.yaml", "--no-log", cwd=study.folder, env=study.env)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "## Gated arms" in report.stdout and "`frozen` stopped at rung 1 (tiny1)" in report.stdout
    assert "not trained at tiny2." in report.stdout
