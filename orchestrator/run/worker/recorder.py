"""What a run writes while it trains: MLflow (status, tags, batched metrics) and the progress board.

Rank 0 alone writes, so every rank holds a ``Recorder`` and calls the same methods at the
same points of the loop; on other ranks they do nothing. That keeps the loop free of rank
branches and puts every MLflow write of a run in one place. Step = tokens seen; points at
steps MLflow already holds (a resume recomputes the steps after its checkpoint) are dropped
by the ``MetricBuffer`` (``track.metric_buffer``), so no step is logged twice; it keeps
points through a tracking-server outage of a few minutes and writes them when it answers.

Beside the metrics: the run's training and validation data as MLflow dataset inputs (``log_data_inputs``)
and MLflow's system metrics (``system/cpu_utilization_percentage``, ``system/system_memory_usage_megabytes``,
disk, network, and GPU ones where ``pynvml`` finds a GPU) of every machine the run trains on,
sampled every 10 s (``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``) by ``mlflow.system_metrics``'s
monitor while the run trains. Their step is the monitor's sample count, not tokens (MLflow's
convention). One process per node samples (its local rank 0, ``NodePlace``; the monitor reads
the whole machine, every GPU on it included), into the run's MLflow record: a single-node run
under the names above, a run over several nodes under ``system/node<k>/...`` (k: Ray Train's
node rank), so each node's numbers stay apart. That is the one write a rank other than 0 makes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from orchestrator.plan.contract import RunSpec
from orchestrator.run.progress import report_progress
from orchestrator.run.worker.mfu import device_peak_flops, mfu
from orchestrator.track.http_env import apply_http_env
from orchestrator.track.metric_buffer import MetricBuffer
from orchestrator.track.timeline import TOTAL as STARTUP_TOTAL
from orchestrator.track.tracking import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_RUNNING,
    client_for,
    last_logged_step,
    run_tag,
    set_status,
    tag,
)


def _ppl(val_loss: float) -> float:
    """Perplexity of a mean loss in nats/token (capped at e^50 so a diverged loss stays finite)."""
    return math.exp(min(val_loss, 50.0))


DIGEST_CHARS = 36  # MLflow's dataset digest column (MAX_DATASET_DIGEST_SIZE)


def log_data_inputs(client: MlflowClient, mlflow_run_id: str, name: str, path: str, content_hash: str) -> None:
    """Record the prepared corpus as the run's dataset inputs (``mlflow.log_input``'s entities):
    its train split (context ``training``, name = the corpus's name in the study) and its val
    split (context ``validation``, name ``<corpus>/val``: every eval and the final pass read it).
    Digest = the manifest's content hash cut to MLflow's 36 characters (the whole hash is in
    the profile, with the split, and in the run's ``data_hash`` param), source = the prepared
    folder or URI (source type: ``local`` or the URI's scheme). Logging them again (a resumed
    run) adds nothing."""
    scheme = urlsplit(path).scheme if "://" in path else ""
    inputs = [
        DatasetInput(
            Dataset(
                name=name if split == "train" else f"{name}/{split}",
                digest=content_hash[:DIGEST_CHARS],
                source_type=scheme or "local",
                source=json.dumps({"uri": path}),
                profile=json.dumps({"content_hash": content_hash, "split": split}),
            ),
            [InputTag(MLFLOW_DATASET_CONTEXT, context)],
        )
        for split, context in (("train", "training"), ("val", "validation"))
    ]
    client.log_inputs(mlflow_run_id, inputs)


@dataclass(frozen=True)
class NodePlace:
    """Where a worker process runs, for the system metrics (module docstring): its rank on its
    node (``local_rank``), its node's rank among the run's nodes (``node_rank``) and whether
    the run's workers span several nodes (``multi_node``)."""

    local_rank: int = 0
    node_rank: int = 0
    multi_node: bool = False

    @property
    def samples(self) -> bool:
        """True for the one process per node that samples the machine (local rank 0)."""
        return self.local_rank == 0

    @property
    def node_id(self) -> str | None:
        """MLflow's ``node_id`` for this node's system metrics: ``node<k>`` over several nodes,
        None (the plain ``system/...`` names) on one."""
        return f"node{self.node_rank}" if self.multi_node else None


def node_place(ctx: Any) -> NodePlace:
    """This worker's ``NodePlace`` from Ray Train's context. The run spans several nodes when
    this node holds fewer than all its workers (true on every node of such a run)."""
    return NodePlace(ctx.get_local_rank(), ctx.get_node_rank(), ctx.get_local_world_size() < ctx.get_world_size())


class Recorder:
    """One run's writes on rank 0 (``active``); a no-op on the other ranks but for the system
    metrics of their node.

    ``devices`` is the run's worker count (for MFU: peak FLOP/s x devices). Create it after
    the checkpoint is restored: ``mlflow_run_id`` must be the run the checkpoint was writing.
    ``data``: (corpus name, prepared path, content hash) of the training data, logged as the
    run's dataset input at ``start`` when given. ``carried``: the points the checkpoint kept
    unwritten (``unwritten``), written with the run's next flush. ``node``: where this process
    runs; its node's local rank 0 samples the node's system metrics from ``start`` to the run's
    end. None: rank 0 alone samples, under the plain names (as on one node).
    """

    def __init__(
        self,
        run: RunSpec,
        tracking_uri: str,
        mlflow_run_id: str,
        board: str | None,
        *,
        active: bool,
        devices: int,
        data: tuple[str, str, str | None] | None = None,
        carried: list[list] | None = None,
        node: NodePlace | None = None,
    ):
        self.run, self.mlflow_run_id, self.board, self.active = run, mlflow_run_id, board, active
        self.tps, self.tracking_uri, self.data = run.train.tokens_per_step, tracking_uri, data
        self.samples = node.samples if node is not None else active
        self.node_id = node.node_id if node is not None else None
        self.sysmon: Any = None  # mlflow's SystemMetricsMonitor while the run trains (imported at start)
        if active or self.samples:
            apply_http_env()  # a cluster's workers do not inherit the driver's settings (track.http_env)
        if not active:
            return
        self.client = client_for(tracking_uri)
        self.metrics = MetricBuffer(self.client, mlflow_run_id, resume_after=last_logged_step(self.client, mlflow_run_id), carried=carried)
        peak = device_peak_flops()
        self.peak_flops = peak * devices if peak else None

    def start(
        self, step: int, fallback: str | None = None, branched: bool = False, branch_point: str | None = None, wall_s: float = 0.0
    ) -> None:
        """Mark the run running; on a restart (``step`` > 0) count it and say from where;
        ``fallback`` (``run.checkpoint``: corrupt checkpoints skipped) goes to the
        ``resume_fallback`` tag; ``branched``: a branch's first start at its trunk's branch
        point (``run.worker.branching``), tagged ``branched_at_tokens``, not a restart;
        ``branch_point``: how a branch's start checkpoint verified (``run.worker.branching``:
        verified, or torn and where it restarted from), the ``branch_point`` tag. Throughput is
        counted from here (``wall_s``: the run's training seconds so far), and the node's system
        metrics (``node``) start on the process that samples them."""
        if not self.active:
            self._sample_system(step)
            return
        set_status(self.client, self.mlflow_run_id, STATUS_RUNNING)
        if fallback:
            self.client.set_tag(self.mlflow_run_id, tag("resume_fallback"), fallback[:5000])
        if branch_point:
            self.client.set_tag(self.mlflow_run_id, tag("branch_point"), branch_point[:5000])
        if self.data and self.data[2]:
            log_data_inputs(self.client, self.mlflow_run_id, self.data[0], self.data[1], self.data[2])
        self._sample_system(step)
        if branched:
            self.client.set_tag(self.mlflow_run_id, tag("branched_at_tokens"), str(step * self.tps))
        elif step:
            restarts = int(run_tag(self.client.get_run(self.mlflow_run_id).data.tags, "restarts", "0") or 0) + 1
            self.client.set_tag(self.mlflow_run_id, tag("restarts"), str(restarts))
            self.client.set_tag(self.mlflow_run_id, tag("resumed_from_tokens"), str(step * self.tps))
        self._tok_last, self._wall_last = step * self.tps, wall_s

    def _sample_system(self, step: int) -> None:
        """Start MLflow's system metrics monitor on the run when this process samples its node;
        a restart (``step`` > 0) continues the run's sample count."""
        if not self.samples:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.sysmon = SystemMetricsMonitor(
            self.mlflow_run_id, tracking_uri=self.tracking_uri, resume_logging=step > 0, node_id=self.node_id
        )
        self.sysmon.start()

    def _stop_system(self) -> None:
        if self.sysmon is not None:
            self.sysmon.finish()  # flushes its last samples
            self.sysmon = None

    def train_point(self, step: int, loss: float, grad_norm: float, lr: float, wall_s: float, grad_norm_max: float | None = None) -> None:
        """Queue the training metrics after ``step`` optimizer steps; throughput (and MFU on a
        known GPU) over the tokens since the previous point, per second of ``wall_s`` (the
        optimizer steps' seconds: evals, diagnostics and checkpoints between do not count);
        update the progress board.

        grad_norm: this step's global gradient norm; grad_norm_max: the largest over the steps
        since the previous point (``grad_norm_max``; a spike between logged points shows there).
        """
        if not self.active:
            return
        r, tokens = self.run, step * self.tps
        seconds = wall_s - self._wall_last  # optimizer steps only: no eval, diagnostics or checkpoint
        thr = (tokens - self._tok_last) / seconds if seconds > 0 else None
        self._tok_last, self._wall_last = tokens, wall_s
        point = {
            "train/loss": loss,
            "grad_norm": grad_norm,
            "grad_norm_max": grad_norm if grad_norm_max is None else max(grad_norm_max, grad_norm),
            "lr": lr,
            "tokens": tokens,
            "flops": tokens * r.flops_per_token,
            "time/wall_s": wall_s,
        }
        if thr is not None:  # none for a point with no timed step since the last (the warm-up's)
            point["throughput/tokens_per_s"] = thr
            if self.peak_flops:
                point["throughput/mfu"] = mfu(r.flops_per_token, thr, self.peak_flops)
        self.metrics.add(point, tokens)
        report_progress(self.board, r.run_id, tokens=tokens, planned=r.tokens, loss=loss, state="running")

    def warmed_up(self, step: int, wall_s: float) -> None:
        """Count throughput from ``step``, this attempt's first optimizer step, whose seconds
        (compilation, allocator and kernel warm-up) the loop keeps out of ``time/wall_s``: they
        are the start-up timeline's ``startup/first_step_s``."""
        self._tok_last, self._wall_last = step * self.tps, wall_s

    def eval_point(self, step: int, val_loss: float, diagnostics: dict[str, float], accuracy: float | None = None) -> None:
        """Log a curve point: the validation loss (nats/token) on the run's fixed curve windows,
        its perplexity, the attention diagnostics and, for labelled corpora (MQAR),
        ``val/accuracy`` (fraction of labelled positions whose argmax is the target). Flushes."""
        if not self.active:
            return
        point = {"val/loss": val_loss, "val/ppl": _ppl(val_loss), **diagnostics}
        if accuracy is not None:
            point["val/accuracy"] = accuracy
        self.metrics.add(point, step * self.tps)
        self.metrics.flush()

    def final_point(self, step: int, val_loss: float, accuracy: float | None = None) -> None:
        """Log the final pass (the curve's windows plus the ones it adds) as ``final/val_loss``,
        ``final/val_ppl`` and, for labelled corpora, ``final/val_accuracy``. Flushes."""
        if not self.active:
            return
        point = {"final/val_loss": val_loss, "final/val_ppl": _ppl(val_loss)}
        if accuracy is not None:
            point["final/val_accuracy"] = accuracy
        self.metrics.add(point, step * self.tps)
        self.metrics.flush()

    def unwritten(self) -> list[list]:
        """Points MLflow does not have yet (an outage), for the checkpoint to keep ([] off rank 0)."""
        return self.metrics.unwritten() if self.active else []

    def checkpoint_point(self, step: int, numbers: dict[str, float]) -> None:
        """Queue a checkpoint's ``checkpoint/*`` numbers (size, save and persist seconds)."""
        if self.active:
            self.metrics.add(numbers, step * self.tps)

    def startup(self, step: int, seconds: dict[str, float]) -> None:
        """Queue the attempt's start-up timeline (``startup/*_s``, ``track.timeline``) at ``step``,
        its first optimizer step. A resumed attempt whose first step MLflow already holds a
        timeline at (an attempt that died before its first checkpoint) logs none: no step twice."""
        if not self.active:
            return
        tokens = step * self.tps
        if tokens <= self.metrics.resume_after and any(
            m.step == tokens for m in self.client.get_metric_history(self.mlflow_run_id, STARTUP_TOTAL)
        ):
            return
        self.metrics.add(seconds, tokens, even_if_logged=True)

    def time_split(self, step: int, seconds: dict[str, float]) -> None:
        """Queue the run's time split (``time/*_s`` seconds, ``RunLoop.time_split``) at ``step``,
        the last one. Logged once per run: an attempt that died after its last step's points
        but before the split leaves that step in MLflow without it, and the retry still writes it."""
        if not self.active:
            return
        tokens = step * self.tps
        if tokens <= self.metrics.resume_after and "time/elapsed_s" in self.client.get_run(self.mlflow_run_id).data.metrics:
            return
        self.metrics.add(seconds, tokens, even_if_logged=True)

    def failed(self, step: int, reason: str) -> None:
        """End the run as failed (reason and tokens in MLflow, the board told)."""
        self._end(step, STATUS_FAILED, reason=reason)

    def finished(self, step: int) -> None:
        """End the run as finished after ``step`` optimizer steps."""
        self._end(step, STATUS_FINISHED)

    def _end(self, step: int, status: str, reason: str | None = None) -> None:
        if not self.active:
            self._stop_system()
            return
        tokens = step * self.tps
        self.metrics.flush(wait=True)  # rides out an outage within its bound (track.metric_buffer)
        self._stop_system()  # while the run is still RUNNING
        self.metrics.call(lambda: set_status(self.client, self.mlflow_run_id, status, reason=reason, tokens=tokens))
        report_progress(self.board, self.run.run_id, tokens=tokens, planned=self.run.tokens, state=status)
