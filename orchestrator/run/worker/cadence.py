"""When the training loop evaluates and checkpoints: each component says when it is due.

Steps count optimizer steps done (1 after the first update). The evaluation curve has a point
every ``eval_every_steps`` steps and at the last step, whatever its remainder (so every run
ends on a point and its final pass). A Ray Train checkpoint follows every
``checkpoint_every_evals``-th evaluation, never the last step's (the run is done: its final
weights are saved instead), so a resume repeats at most that many evaluations' worth of steps.
Evaluations are counted over the whole run, a resumed or branched run continuing the count its
checkpoint holds: the cadence of a resumed run is the one it would have had uninterrupted.
Branch points (``protocol: branches``) are the retained checkpoints a trunk keeps at the steps
its branches start from. Attention diagnostics follow every ``diagnostics_every_evals``-th
evaluation and the last one, so every run ends with them. Pure arithmetic: no torch, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.contract import RunSpec

__all__ = ["CheckpointCadence", "DiagnosticsCadence", "EvalCadence"]


@dataclass(frozen=True)
class EvalCadence:
    """When the loop evaluates: every ``every_steps`` steps and at ``last_step``."""

    every_steps: int
    last_step: int

    @classmethod
    def of(cls, run: RunSpec) -> EvalCadence:
        """The cadence ``run`` asks for (``eval_every_steps``, ``steps``)."""
        return cls(run.eval_every_steps, run.steps)

    def should_evaluate(self, step: int) -> bool:
        """Whether the curve has a point at ``step``."""
        return step % self.every_steps == 0 or self.is_last(step)

    def is_last(self, step: int) -> bool:
        """Whether ``step`` ends the run (its evaluation adds the final pass)."""
        return step == self.last_step


@dataclass(frozen=True)
class CheckpointCadence:
    """When the loop saves: after every ``every_evals``-th evaluation of ``evals`` (never at
    its last step), and at each of ``branch_points``."""

    evals: EvalCadence
    every_evals: int
    branch_points: frozenset[int] = frozenset()

    @classmethod
    def of(cls, run: RunSpec) -> CheckpointCadence:
        """The cadence ``run`` asks for (``checkpoint_every_evals``, ``branch_points``)."""
        return cls(EvalCadence.of(run), run.checkpoint_every_evals, frozenset(run.branch_points))

    def should_checkpoint(self, step: int, evals_done: int) -> bool:
        """Whether a Ray Train checkpoint follows ``step``, at which the run has made
        ``evals_done`` evaluations in all (that step's included)."""
        return self.evals.should_evaluate(step) and not self.evals.is_last(step) and evals_done % self.every_evals == 0

    def should_keep_branch_point(self, step: int) -> bool:
        """Whether ``step`` is a branch point this run (a trunk) keeps for its branches."""
        return step in self.branch_points


@dataclass(frozen=True)
class DiagnosticsCadence:
    """When an evaluation also measures the attention diagnostics: at every ``every_evals``-th
    evaluation of ``evals`` and at its last step; never when ``enabled`` is False."""

    evals: EvalCadence
    every_evals: int
    enabled: bool = True

    @classmethod
    def of(cls, run: RunSpec) -> DiagnosticsCadence:
        """The cadence ``run`` asks for (``diagnostics``, ``diagnostics_every_evals``)."""
        return cls(EvalCadence.of(run), run.diagnostics_every_evals, run.diagnostics)

    def should_diagnose(self, step: int, evals_done: int) -> bool:
        """Whether the evaluation at ``step`` (the run's ``evals_done``-th, counted over the whole
        run as ``CheckpointCadence`` counts them) measures the diagnostics."""
        if not self.enabled or not self.evals.should_evaluate(step):
            return False
        return self.evals.is_last(step) or evals_done % self.every_evals == 0
