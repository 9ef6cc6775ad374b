"""The arithmetic of the benchmarks that compare two arms, on made-up records with known
answers: the whole run against the plain loop (benchmarks.whole_run: the ratio of the two
command wall-clocks, the stack's seconds split into its timeline, steps, evaluation,
checkpoints and the rest) and the demo's two settings (benchmarks.demo: the share outside
optimizer steps, the wall-clock against the baseline)."""

from __future__ import annotations

from benchmarks import demo
from benchmarks.whole_run import section, study_yaml


def record(stack_wall: float, plain_wall: float) -> dict:
    metrics = {
        "startup/ray_s": 4.0,
        "startup/engine_s": 6.0,
        "startup/total_s": 10.0,
        "time/step_s": 80.0,
        "time/eval_s": 5.0,
        "time/checkpoint_s": 2.0,
    }
    return {
        "study": study_yaml("w", 4096, "cpu-xs", "standard"),
        "load_before": (0.1, 0.2, 0.3),
        "load_after": (1.0, 0.5, 0.4),
        "stack_wall": stack_wall,
        "plain_wall": plain_wall,
        "plain": {"tokens": 4096, "steps": 2, "threads": 1, "step_s": 78.0, "process_s": 90.0},
        "metrics": metrics,
    }


def test_section_states_the_ratio_and_where_the_stacks_seconds_went() -> None:
    text = section(record(105.0, 100.0), ["--tokens", "4096"])
    assert "**stack / plain = 1.050** (goal <= 1.05)" in text
    assert "stack steps / plain steps = 1.026" in text  # 80 / 78
    assert (
        "| - the rest: logging, final weights, Ray shutdown, exit (the first step counts in the timeline and the steps) | 8.0 |" in text
    )  # 105 - 10 - 87
    assert "| ray | 4.0 |" in text and "| engine | 6.0 |" in text and "| **total** | **10.0** |" in text
    assert "scales: [cpu-xs]" in text and "budget: {mode: tokens, tokens: 4096}" in text


def test_a_slower_stack_reads_as_a_missed_goal() -> None:  # negative control: the ratio moves with the walls
    assert "**stack / plain = 1.300**" in section(record(130.0, 100.0), [])


def test_demo_section_gives_each_arms_share_outside_steps_and_its_ratio_to_the_baseline() -> None:
    baseline = {"overrides": ["resources.runs_per_trainer=1"], "walls": {"run": 580.0, "report": 20.0}, "runs": 8, "step_s": 300.0}
    packed = {"overrides": [], "walls": {"run": 430.0, "report": 20.0}, "runs": 8, "step_s": 300.0}
    text = demo.section([baseline, packed], ["0.10", "0.20"], [])
    assert "| resources.runs_per_trainer=1 | 8 | 580 | 20 | 600 | 300 | 50.0% | 1.00 |" in text
    assert "| as committed | 8 | 430 | 20 | 450 | 300 | 33.3% | 0.75 |" in text
