"""Calibration measures throughput through a Ray task and feeds wallclock budgets."""

import json

import pytest
import ray

from orchestrator.plan.planner import PlanError, plan
from orchestrator.plan.spec import parse_spec
from orchestrator.plan.throughput import load_calibration, save_calibration, throughput_table
from orchestrator.run.calibrate import calibrate

pytestmark = pytest.mark.slow


def test_calibrate_then_plan_wallclock(tmp_path):
    study = parse_spec({"name": "cal", "scales": ["cpu-xs"], "variants": ["standard", "coupled"],
                        "budget": {"mode": "wallclock", "tokens": 204800}, "workdir": str(tmp_path),
                        "resources": {"workers": 2}, "tokenizer": {"vocab_size": 512}})
    with pytest.raises(PlanError, match="qkstudy calibrate"):
        plan(study)
    ray.init(address="local", num_cpus=2, log_to_driver=False, configure_logging=False)
    try:
        table = calibrate(study, repeats=2, steps=1)
    finally:
        ray.shutdown()
    assert set(table) == {"cpu-xs"} and set(table["cpu-xs"]) == {"standard", "coupled"}
    assert all(1e2 < v < 1e8 for v in table["cpu-xs"].values())
    path = save_calibration(study, table)
    assert json.loads(path.read_text()) == table == load_calibration(study)
    assert throughput_table(study) == table
    with pytest.raises(PlanError, match="qkstudy calibrate"):
        plan(study)  # the planner reads no file: the caller passes the table
    runs = {r.variant: r for r in plan(study, throughput_table(study))}
    thr = table["cpu-xs"]
    tps = runs["standard"].train.tokens_per_step
    expect = runs["standard"].tokens * thr["coupled"] / thr["standard"]
    assert abs(runs["coupled"].tokens - expect) <= tps
