"""Run tags live under the ``qkstudy.`` namespace, and every reader still accepts the bare
names of stores written before it (the published stores among them)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import Study
from orchestrator.report.query import query_study
from orchestrator.track.sqlite_runs import sqlite_runs
from orchestrator.track.tracking import (
    KIND_TAG,
    RUN_TAGS,
    create_run,
    ensure_experiment,
    find_train_runs,
    run_status,
    run_tag,
    run_tags,
    set_status,
    sqlite_uri,
    tag,
)

STUDY = {"name": "tags", "variants": ["standard"], "scales": ["cpu-xs"], "seeds": [0], "budget": {"tokens_per_param": 1}}


def test_new_runs_carry_namespaced_tags_only(tmp_path):
    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    run = plan(Study.model_validate(STUDY))[0]
    mid = create_run(client, ensure_experiment(client, "tags"), run)
    set_status(client, mid, "failed", reason="loss NaN", tokens=512)
    tags = client.get_run(mid).data.tags
    assert tags["qkstudy.run_id"] == run.run_id and tags["qkstudy.variant"] == "standard" and tags["qkstudy.seed"] == "0"
    assert tags["qkstudy.status"] == "failed" and tags["qkstudy.failure_reason"] == "loss NaN" and tags["qkstudy.failed_at_tokens"] == "512"
    assert not set(tags) & set(RUN_TAGS)  # no bare name is written any more


def test_readers_accept_bare_names_and_prefer_namespaced():
    old = {"run_id": "abc", "status": "finished", "mlflow.user": "u"}
    assert run_tag(old, "run_id") == "abc" and run_tag(old, "corpus", "none") == "none"
    both = {"qkstudy.status": "running", "status": "finished"}
    assert run_tag(both, "status") == "running"
    assert run_tags({**old, "qkstudy.status": "failed", "qkstudy.kind": "train"}) == {
        "run_id": "abc",
        "status": "failed",
        "mlflow.user": "u",
        "qkstudy.kind": "train",  # not a run tag of RUN_TAGS: kept as stored
    }
    with pytest.raises(KeyError, match="not a qkstudy run tag"):
        tag("statuss")


def test_a_store_with_old_and_new_runs_reads_as_one_study(tmp_path):
    """One run written with bare tags (a store from before the namespace), one by create_run:
    the report's table, the run finder and the status reader see both the same way."""
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    eid = ensure_experiment(client, "tags")
    new = plan(Study.model_validate({**STUDY, "seeds": [1]}))[0]
    mid_new = create_run(client, eid, new)
    set_status(client, mid_new, "finished")
    bare = {"study": "tags", "run_id": "old0", "variant": "standard", "scale": "cpu-xs", "seed": "0", "corpus": new.corpus_name}
    mid_old = client.create_run(eid, run_name="old", tags={KIND_TAG: "train", **bare, "extend": "1", "status": "finished"}).info.run_id
    for mid in (mid_new, mid_old):
        client.log_metric(mid, "val/loss", 3.0, step=1)
    runs = query_study("tags", uri).runs.set_index("run_uuid")
    assert runs.loc[mid_old, "run_id"] == "old0" and runs.loc[mid_new, "run_id"] == new.run_id
    assert list(runs.loc[[mid_old, mid_new], "seed"]) == [0, 1] and set(runs["status"]) == {"finished"}
    assert not any(c.startswith("tags.qkstudy.") and c[len("tags.qkstudy.") :] in RUN_TAGS for c in runs.columns)
    found = find_train_runs(client, eid)
    assert sorted(found) == sorted(["old0", new.run_id]) and {run_status(r) for r in found.values()} == {"finished"}
    assert sorted(sqlite_runs(tmp_path / "mlflow.db", "tags")) == sorted(found)


def test_a_failure_reason_is_stored_with_its_uris_redacted(tmp_path):
    """Exception text quoting a storage URI with its keys reaches no tag (nor runs.csv, status)."""
    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    mid = create_run(client, ensure_experiment(client, "tags"), plan(Study.model_validate(STUDY))[0])
    reason = "OSError: When uploading s3://AKIAKEY:wJalrXUtn@ckpt/run/step-64?X-Amz-Signature=f00d (access denied)"
    set_status(client, mid, "failed", reason=reason)
    stored = client.get_run(mid).data.tags["qkstudy.failure_reason"]
    assert stored == "OSError: When uploading s3://AKIAKEY:***@ckpt/run/step-64?X-Amz-Signature=*** (access denied)"
