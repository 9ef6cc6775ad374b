"""Calibration measures throughput through a Ray task, reports its dispersion, refuses a noisy
one, and feeds wallclock budgets."""

import json

import pytest

from orchestrator.plan.contract import PlanError
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.plan.throughput import load_calibration, save_calibration, throughput_table
from orchestrator.run.driver.calibrate import Calibration, CalibrationError, calibrate, judge, relative_spread


def _cal(samples, load_avg=0.5, cpus=4):
    return Calibration(samples=samples, workers=2, load_avg=load_avg, cpus=cpus, repeats=3, steps=2)


def test_relative_spread_on_known_numbers():
    assert relative_spread([100.0, 110.0, 105.0]) == pytest.approx(10 / 105)
    assert relative_spread([50.0]) == 0.0
    assert relative_spread([1.0, 2.0, 3.0, 10.0]) == pytest.approx(9 / 2.5)  # even count: median 2.5
    with pytest.raises(ValueError, match="no samples"):
        relative_spread([])


def test_table_is_the_median_times_workers_and_spread_per_entry():
    cal = _cal({"cpu-xs": {"standard": [100.0, 104.0, 102.0], "coupled": [50.0, 80.0, 60.0]}})
    assert cal.table == {"cpu-xs": {"standard": 204.0, "coupled": 120.0}}
    assert cal.spread["cpu-xs"]["standard"] == pytest.approx(4 / 102)
    assert cal.spread["cpu-xs"]["coupled"] == pytest.approx(30 / 60)


def test_a_spread_above_the_threshold_refuses_with_the_numbers():
    cal = _cal({"cpu-xs": {"standard": [100.0, 104.0, 102.0], "coupled": [50.0, 80.0, 60.0]}})
    with pytest.raises(CalibrationError) as e:
        judge(cal, max_spread=0.05)
    msg = str(e.value)
    assert "cpu-xs/coupled: spread 50.0% over 3 repeats" in msg and "from 50 to 80" in msg and "5.0%" in msg
    assert "cpu-xs/standard" not in msg  # 3.9%: within the threshold
    assert isinstance(e.value, PlanError)  # the CLI's input errors: exit code 2
    assert judge(cal, max_spread=0.6) == []  # negative control: a looser threshold accepts it
    seen = []
    warnings = judge(cal, max_spread=0.05, allow_noisy=True, warn=seen.append)
    assert len(warnings) == 1 and warnings[0].startswith("cpu-xs/coupled") and seen == warnings


def test_a_loaded_machine_refuses_even_with_a_small_spread():
    quiet = {"cpu-xs": {"standard": [100.0, 101.0, 100.5]}}
    assert judge(_cal(quiet, load_avg=3.9, cpus=4)) == []
    with pytest.raises(CalibrationError, match=r"load average 6.50 > its 4 CPUs"):
        judge(_cal(quiet, load_avg=6.5, cpus=4))


@pytest.mark.slow
def test_calibrate_then_plan_wallclock(tmp_path, local_ray):
    study = parse_spec(
        {
            "name": "cal",
            "scales": ["cpu-xs"],
            "variants": ["standard", "coupled"],
            "budget": {"mode": "wallclock", "tokens": 204800},
            "workdir": str(tmp_path),
            "resources": {"workers": 2},
            "tokenizer": {"vocab_size": 512},
        }
    )
    with pytest.raises(PlanError, match="qkstudy calibrate"):
        plan(study)
    cal = calibrate(study, repeats=3, steps=1)
    table = cal.table
    assert set(table) == {"cpu-xs"} and set(table["cpu-xs"]) == {"standard", "coupled"}
    assert all(1e2 < v < 1e8 for v in table["cpu-xs"].values())
    assert all(len(x) == 3 for x in cal.samples["cpu-xs"].values())
    assert cal.cpus >= 1 and cal.load_avg >= 0
    judge(cal, allow_noisy=True)  # a shared test machine: warn at most
    path = save_calibration(study, table, cal.details())
    saved = json.loads(path.read_text())
    assert saved["tokens_per_s"] == table == load_calibration(study)
    assert saved["spread"] == cal.spread and saved["repeats"] == 3
    assert throughput_table(study) == table
    with pytest.raises(PlanError, match="qkstudy calibrate"):
        plan(study)  # the planner reads no file: the caller passes the table
    runs = {r.variant: r for r in plan(study, throughput_table(study))}
    thr = table["cpu-xs"]
    tps = runs["standard"].train.tokens_per_step
    expect = runs["standard"].tokens * thr["coupled"] / thr["standard"]
    assert abs(runs["coupled"].tokens - expect) <= tps
    # each wallclock run records the calibration it was planned with
    assert runs["coupled"].calibration["tokens_per_s"] == thr
    assert runs["coupled"].calibration["source"] == "calibration"
