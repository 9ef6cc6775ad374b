"""What a run writes while it trains: MLflow (status, tags, batched metrics) and the progress board.

Rank 0 alone writes, so every rank holds a ``Recorder`` and calls the same methods at the
same points of the loop; on other ranks they do nothing. That keeps the loop free of rank
branches and puts every MLflow write of a run in one place. Step = tokens seen; points at
steps MLflow already holds (a resume recomputes the steps after its checkpoint) are dropped
by the ``MetricBuffer``, so no step is logged twice.
"""

from __future__ import annotations

import math
import time

from orchestrator.plan.planner import RunSpec
from orchestrator.run.mfu import device_peak_flops, mfu
from orchestrator.run.progress import report_progress
from orchestrator.track.tracking import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_RUNNING,
    MetricBuffer,
    client_for,
    last_logged_step,
    set_status,
)


def _ppl(val_loss: float) -> float:
    """Perplexity of a mean loss in nats/token (capped at e^50 so a diverged loss stays finite)."""
    return math.exp(min(val_loss, 50.0))


class Recorder:
    """One run's writes on rank 0 (``active``); a no-op on the other ranks.

    ``devices`` is the run's worker count (for MFU: peak FLOP/s x devices). Create it after
    the checkpoint is restored: ``mlflow_run_id`` must be the run the checkpoint was writing.
    """

    def __init__(self, run: RunSpec, tracking_uri: str, mlflow_run_id: str, board: str | None, *,
                 active: bool, devices: int):
        self.run, self.mlflow_run_id, self.board, self.active = run, mlflow_run_id, board, active
        self.tps = run.train.tokens_per_step
        if not active:
            return
        self.client = client_for(tracking_uri)
        self.metrics = MetricBuffer(self.client, mlflow_run_id, resume_after=last_logged_step(self.client, mlflow_run_id))
        peak = device_peak_flops()
        self.peak_flops = peak * devices if peak else None

    def start(self, step: int) -> None:
        """Mark the run running; on a restart (``step`` > 0) count it and say from where. The
        throughput clock starts here."""
        if not self.active:
            return
        set_status(self.client, self.mlflow_run_id, STATUS_RUNNING)
        if step:
            restarts = int(self.client.get_run(self.mlflow_run_id).data.tags.get("restarts", "0")) + 1
            self.client.set_tag(self.mlflow_run_id, "restarts", str(restarts))
            self.client.set_tag(self.mlflow_run_id, "resumed_from_tokens", str(step * self.tps))
        self._t_last, self._tok_last = time.perf_counter(), step * self.tps

    def train_point(self, step: int, loss: float, grad_norm: float, lr: float, wall_s: float) -> None:
        """Queue the training metrics after ``step`` optimizer steps; throughput (and MFU on a
        known GPU) over the tokens since the previous point; update the progress board."""
        if not self.active:
            return
        r, tokens = self.run, step * self.tps
        now = time.perf_counter()
        thr = (tokens - self._tok_last) / max(now - self._t_last, 1e-9)
        self._t_last, self._tok_last = time.perf_counter(), tokens
        point = {"train/loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens": tokens,
                 "flops": tokens * r.flops_per_token, "time/wall_s": wall_s, "throughput/tokens_per_s": thr}
        if self.peak_flops:
            point["throughput/mfu"] = mfu(r.flops_per_token, thr, self.peak_flops)
        self.metrics.add(point, tokens)
        report_progress(self.board, r.run_id, tokens=tokens, planned=r.tokens, loss=loss, state="running")

    def eval_point(self, step: int, val_loss: float, diagnostics: dict[str, float], final: bool) -> None:
        """Log the validation loss (nats/token), its perplexity and the attention diagnostics;
        ``final`` also logs them as ``final/*`` (the full validation pass). Flushes."""
        if not self.active:
            return
        point = {"val/loss": val_loss, "val/ppl": _ppl(val_loss), **diagnostics}
        if final:
            point.update({"final/val_loss": val_loss, "final/val_ppl": _ppl(val_loss)})
        self.metrics.add(point, step * self.tps)
        self.metrics.flush()

    def checkpoint_point(self, step: int, numbers: dict[str, float]) -> None:
        """Queue a checkpoint's ``checkpoint/*`` numbers (size, save and persist seconds)."""
        if self.active:
            self.metrics.add(numbers, step * self.tps)

    def failed(self, step: int, reason: str) -> None:
        """End the run as failed (reason and tokens in MLflow, the board told)."""
        self._end(step, STATUS_FAILED, reason=reason)

    def finished(self, step: int) -> None:
        """End the run as finished after ``step`` optimizer steps."""
        self._end(step, STATUS_FINISHED)

    def _end(self, step: int, status: str, reason: str | None = None) -> None:
        if not self.active:
            return
        tokens = step * self.tps
        self.metrics.flush()
        set_status(self.client, self.mlflow_run_id, status, reason=reason, tokens=tokens)
        report_progress(self.board, self.run.run_id, tokens=tokens, planned=self.run.tokens, state=status)
