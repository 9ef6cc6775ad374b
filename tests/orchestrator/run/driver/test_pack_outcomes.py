"""What a pack's task reads back from MLflow when its worker group crashed (packing._outcomes),
on a real SQLite store: which runs the group never started, and so may train in another pack."""

from mlflow.entities import Metric

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.packing import Pack, _outcomes, requeue
from orchestrator.track.tracking import STATUS_QUEUED, STATUS_RUNNING, client_for, create_run, ensure_experiment, set_status
from tests.helpers import mlflow_store


def test_only_runs_queued_with_no_training_point_count_as_never_started(tmp_path):
    """Three runs of a crashed pack: one trained (running), one queued with no point (never
    started), and one still tagged queued with points (its status write was lost while MLflow
    was down, yet it trained). Only the second comes back unstarted, and requeue trains it
    alone; the control (the third) is failed in place, not trained again from scratch."""
    runs = plan(parse_spec({"name": "o", "scales": ["cpu-xs"], "variants": ["standard"], "seeds": [0, 1, 2], "budget": {"tokens": 40960}}))
    uri = mlflow_store(tmp_path)
    client = client_for(uri)
    exp = ensure_experiment(client, "o")
    ids = [create_run(client, exp, r) for r in runs]
    set_status(client, ids[0], STATUS_RUNNING)
    set_status(client, ids[1], STATUS_QUEUED)
    set_status(client, ids[2], STATUS_QUEUED)
    client.log_batch(ids[0], metrics=[Metric("tokens", 512.0, 0, 512)])
    client.log_batch(ids[2], metrics=[Metric("tokens", 512.0, 0, 512)])
    items = [{"run": r.model_dump(mode="json"), "mlflow_run_id": m} for r, m in zip(runs, ids)]
    out = _outcomes(items, uri, "RuntimeError: boom")
    assert [out[r.run_id].get("started") for r in runs] == [None, False, None]
    assert all(o["status"] == "failed" and o["reason"] == "RuntimeError: boom" for o in out.values())
    assert client.get_run(ids[1]).data.tags["qkstudy.status"] == STATUS_QUEUED  # left for the requeue
    assert client.get_run(ids[2]).data.tags["qkstudy.status"] == "failed"
    again = requeue(Pack("pack-x", tuple(runs)), out)
    assert again is not None and again.runs == (runs[1],) and again.name == runs[1].run_id


def test_a_branch_family_whose_trunk_crashed_its_group_is_not_split():
    """A trunk that crashed its group leaves its branches unstarted. Requeued alone they would
    start from its branch points and release them when their pack ends, so the trunk's resume
    (or a branch's own) would find them gone: the family is not requeued. The control: a plain
    pack with the same outcomes is."""
    spec = {"name": "f", "scales": ["cpu-xs"], "variants": ["standard"], "budget": {"tokens": 40960}}
    family = plan(parse_spec({**spec, "protocol": "branches", "extend": [1.5, 2], "train": {"schedule": "wsd"}}))
    trunk = next(r for r in family if r.branch_points)
    assert trunk.branch_points and sum(r.trunk == trunk.run_id for r in family) == 2
    out = {r.run_id: {"status": "failed", "reason": "boom"} | ({} if r is trunk else {"started": False}) for r in family}
    assert requeue(Pack("family", tuple(family)), out) is None
    plain = plan(parse_spec({**spec, "seeds": [0, 1, 2]}))
    out = {r.run_id: {"status": "failed", "reason": "boom"} | ({} if i == 0 else {"started": False}) for i, r in enumerate(plain)}
    again = requeue(Pack("plain", tuple(plain)), out)
    assert again is not None and again.runs == tuple(plain[1:])
