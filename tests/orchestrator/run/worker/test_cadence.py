"""When the worker loop evaluates, checkpoints and measures attention diagnostics
(``run.worker.cadence``), on synthetic steps: the loop asks these objects, so the steps here are
the steps a run logs and saves at."""

from collections.abc import Callable

import pytest

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import SpecError, parse_spec
from orchestrator.run.worker.cadence import CheckpointCadence, DiagnosticsCadence, EvalCadence
from orchestrator.run.worker.watchdog import SECTIONS, Watchdog
from tests.helpers import tiny_spec


def _evals(evals: EvalCadence, start: int = 0) -> list[int]:
    return [s for s in range(start + 1, evals.last_step + 1) if evals.should_evaluate(s)]


def _due(evals: EvalCadence, due: Callable[[int, int], bool], start: int = 0, evals_done: int = 0) -> list[int]:
    """The steps at which ``due(step, evaluations so far)`` holds for a loop resumed after
    ``start`` with ``evals_done`` evaluations made (the loop counts them as it goes)."""
    out = []
    for s in range(start + 1, evals.last_step + 1):
        evals_done += evals.should_evaluate(s)
        if due(s, evals_done):
            out.append(s)
    return out


def _checkpoints(ckpt: CheckpointCadence, start: int = 0, evals_done: int = 0) -> list[int]:
    """The steps a loop resumed after ``start`` (with ``evals_done`` evaluations made) saves at."""
    return _due(ckpt.evals, ckpt.should_checkpoint, start, evals_done)


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


def _diagnosed(diag: DiagnosticsCadence, start: int = 0, evals_done: int = 0) -> list[int]:
    """The steps whose evaluation measures the diagnostics, resumed after ``start``."""
    return _due(diag.evals, diag.should_diagnose, start, evals_done)


def test_diagnostics_at_every_nth_evaluation_and_the_last_and_never_when_off():
    evals = EvalCadence(every_steps=2, last_step=13)  # evaluations at 2, 4, ..., 12 and 13
    assert _diagnosed(DiagnosticsCadence(evals, 1)) == _evals(evals) == [2, 4, 6, 8, 10, 12, 13]
    assert _diagnosed(DiagnosticsCadence(evals, 3)) == [6, 12, 13]  # the 3rd, the 6th and the last
    assert _diagnosed(DiagnosticsCadence(evals, 100)) == [13]  # every run ends with them
    assert _diagnosed(DiagnosticsCadence(evals, 3), start=6, evals_done=3) == [12, 13]  # a resume keeps the cadence
    assert _diagnosed(DiagnosticsCadence(evals, 1, enabled=False)) == []
    assert not DiagnosticsCadence(evals, 1).should_diagnose(3, 1)  # no evaluation at step 3


def test_the_diagnostics_cadence_of_a_planned_run_and_its_identity():
    """``eval.diagnostics_every_evals`` reaches the run; 1 (the default) keeps the ids runs had
    before it existed, another value is another run; a bool, text or a float is refused."""
    spec = tiny_spec("cad")

    def every(n: object, on: bool = True) -> dict:
        return {**spec, "eval": {**spec["eval"], "diagnostics": on, "diagnostics_every_evals": n}}

    (base,) = plan(parse_spec({**spec, "eval": {**spec["eval"], "diagnostics": True}}))  # the field unset
    (off,) = plan(parse_spec(spec))
    (same,), (sparse,) = plan(parse_spec(every(1))), plan(parse_spec(every(4)))
    assert plan(parse_spec(every(4, on=False)))[0].run_id == off.run_id  # no diagnostics: the cadence is moot
    assert base.diagnostics_every_evals == 1 and same.run_id == base.run_id != off.run_id
    assert sparse.diagnostics_every_evals == 4 and sparse.run_id != base.run_id
    assert DiagnosticsCadence.of(sparse) == DiagnosticsCadence(EvalCadence.of(sparse), 4, True)
    for bad in (True, "2", 2.0, 0):
        with pytest.raises(SpecError, match="diagnostics_every_evals"):
            parse_spec(every(bad))


def test_diagnostics_are_timed_on_their_own_inside_an_evaluation():
    """``time/diag_s``: the watchdog's ``diag`` section, nested in ``eval`` and exclusive of it."""
    assert "diag" in SECTIONS
    wd = Watchdog(lambda *a: None)
    with wd.section("eval"):
        with wd.section("diag"):
            pass
    assert wd.seconds["diag"] > 0 and wd.seconds["eval"] > 0 and wd.limits.bound("diag") == 1800.0
