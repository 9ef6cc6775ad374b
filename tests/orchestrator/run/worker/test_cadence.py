"""When the worker loop evaluates and checkpoints (``run.worker.cadence``), on synthetic steps:
the loop asks these objects, so the steps here are the steps a run logs and saves at."""

import pytest

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.worker.cadence import CheckpointCadence, EvalCadence
from tests.helpers import tiny_spec


def _evals(evals: EvalCadence, start: int = 0) -> list[int]:
    return [s for s in range(start + 1, evals.last_step + 1) if evals.should_evaluate(s)]


def _checkpoints(ckpt: CheckpointCadence, start: int = 0, evals_done: int = 0) -> list[int]:
    """The steps a loop resumed after ``start`` (with ``evals_done`` evaluations made) saves at."""
    out = []
    for s in range(start + 1, ckpt.evals.last_step + 1):
        evals_done += ckpt.evals.should_evaluate(s)
        if ckpt.should_checkpoint(s, evals_done):
            out.append(s)
    return out


def test_evaluations_every_k_steps_and_at_the_last_step():
    evals = EvalCadence(every_steps=4, last_step=10)
    assert _evals(evals) == [4, 8, 10]
    assert [s for s in range(1, 11) if evals.is_last(s)] == [10]
    assert _evals(EvalCadence(every_steps=5, last_step=10)) == [5, 10]  # the last step evaluated once


def test_checkpoints_after_every_nth_evaluation_never_at_the_last_step():
    evals = EvalCadence(every_steps=2, last_step=12)
    assert _checkpoints(CheckpointCadence(evals, every_evals=2)) == [4, 8]
    assert _checkpoints(CheckpointCadence(evals, every_evals=1)) == [2, 4, 6, 8, 10]  # not 12: the run is done
    assert _checkpoints(CheckpointCadence(evals, every_evals=6)) == []  # the 6th evaluation is the last step's
    assert not CheckpointCadence(evals, every_evals=1).should_checkpoint(3, 1)  # no evaluation at step 3


def test_a_resumed_run_keeps_the_uninterrupted_cadence():
    ckpt = CheckpointCadence(EvalCadence(every_steps=2, last_step=12), every_evals=2)
    assert _checkpoints(ckpt, start=4, evals_done=2) == [8]  # as uninterrupted: [4, 8]


def test_branch_points_are_kept_where_the_run_asks():
    ckpt = CheckpointCadence(EvalCadence(3, 9), 1, frozenset({3, 5}))
    assert [s for s in range(1, 10) if ckpt.should_keep_branch_point(s)] == [3, 5]
    assert not CheckpointCadence(EvalCadence(3, 9), 1).should_keep_branch_point(3)


@pytest.mark.parametrize("branch_points", [[], [4, 6]])
def test_the_cadence_of_a_planned_run(branch_points):
    (run,) = plan(parse_spec(tiny_spec("cad")))
    run = run.model_copy(update={"branch_points": branch_points})
    ckpt = CheckpointCadence.of(run)
    assert ckpt.evals == EvalCadence.of(run) == EvalCadence(run.eval_every_steps, run.steps)
    assert ckpt.every_evals == run.checkpoint_every_evals and ckpt.branch_points == frozenset(branch_points)
    assert _evals(ckpt.evals)[-1] == run.steps
