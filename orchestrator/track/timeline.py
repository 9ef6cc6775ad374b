"""Start-up timeline: where a run's first seconds went, from the command to its first optimizer step.

Why: what a user waits for before a run trains (imports, Ray, data, MLflow, Ray Train's worker
group, the DeepSpeed engine) is most of a short run's wall-clock and most of the test suite's;
it is cut only where it is measured. A ``Timeline`` is a list of marks (name, wall-clock epoch
seconds) that travels with the run: the driver marks its stages, the pack's task and every
worker add theirs, and rank 0 logs the sections to MLflow after the run's first optimizer step
(``startup/<section>_s``, ``startup/total_s``; the report's "Start-up" section reads them).

A section is named by the mark that ends it and lasts from the mark before. ``total_s`` is the
last mark minus the first, so the sections add up to it. A run trained after others in the same
worker group starts its timeline where the previous run ended (its start-up is its own engine
and first step); a worker group that starts from a checkpoint (restarted by Ray's
FailureConfig, or a resubmitted study) starts it at the worker's entry. On a multi-node
cluster a section that crosses machines (queued, trainer, worker_group) includes the offset
between their clocks.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

PREFIX = "startup/"
TOTAL = f"{PREFIX}total_s"

# Every section, in the order a first run of a pack passes them, with what it holds.
SECTIONS: dict[str, str] = {
    "imports": "interpreter start and imports of the command",
    "plan": "spec load and the plan",
    "ray": "Ray start or connect",
    "data": "data preparation (a Ray task; the cache check when prepared)",
    "mlflow": "MLflow: the study's runs read, created or resumed",
    "queued": "the pack waiting for a free slot and its task's start",
    "trainer": "the pack's TorchTrainer built (Ray Train imports)",
    "worker_group": "Ray Train's controller, worker processes and process group",
    "worker_imports": "DeepSpeed, the model and the data loader imported in the worker",
    "model": "the model built",
    "data_loader": "the token loaders opened",
    "engine": "the DeepSpeed engine (ZeRO stage, optimizer, op load)",
    "restore": "checkpoint restore or branch start",
    "first_step": "the first optimizer step (and torch.compile's compilation, with resources.compile)",
}


@dataclass
class Timeline:
    """Marks (name, wall-clock epoch seconds), the first one the origin.

    Raises nothing; a mark's name outside ``SECTIONS`` is kept but shown after the known ones."""

    marks: list[tuple[str, float]] = field(default_factory=list)

    @classmethod
    def since(cls, origin: str = "start", at: float | None = None) -> Timeline:
        """A timeline whose origin mark is ``at`` (epoch s; default now)."""
        return cls([(origin, time.time() if at is None else at)])

    @classmethod
    def since_process_start(cls) -> Timeline:
        """A timeline from this process's creation (the command's start), as the OS records it."""
        return cls.since("process", psutil.Process(os.getpid()).create_time())

    def mark(self, name: str) -> Timeline:
        """End section ``name`` now; returns self."""
        self.marks.append((name, time.time()))
        return self

    def then(self, name: str) -> Timeline:
        """A copy with section ``name`` ended now (the original unchanged: one copy per run)."""
        return Timeline(list(self.marks)).mark(name)

    def sections(self) -> dict[str, float]:
        """Seconds per section, in mark order (a name marked twice: its spans summed)."""
        out: dict[str, float] = {}
        for (_, t0), (name, t1) in zip(self.marks, self.marks[1:], strict=False):
            out[name] = out.get(name, 0.0) + (t1 - t0)
        return out

    def total(self) -> float:
        """Seconds from the first mark to the last."""
        return self.marks[-1][1] - self.marks[0][1] if self.marks else 0.0

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: ``startup/<section>_s`` for each section and ``startup/total_s``."""
        return {**{f"{PREFIX}{k}_s": v for k, v in self.sections().items()}, TOTAL: self.total()}

    def to_json(self) -> list[list[float | str]]:
        """Plain lists, for a Ray task's or Ray Train config's arguments."""
        return [[n, t] for n, t in self.marks]

    @classmethod
    def from_json(cls, marks: list[list[float | str]] | None) -> Timeline | None:
        """The inverse of ``to_json``; None for None or no marks."""
        return cls([(str(n), float(t)) for n, t in marks]) if marks else None
