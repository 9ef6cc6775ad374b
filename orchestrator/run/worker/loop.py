"""The training loop that runs inside each Ray Train worker.

Each worker builds the run's model, wraps it in a DeepSpeed engine (ZeRO stage from the
spec), and trains exactly ``RunSpec.steps`` optimizer steps over the loader's global batches,
taking its rank's slice. Rank 0 alone talks to MLflow, through the run's ``Recorder``
(``run.worker.recorder``: batched ``log_batch``, step = tokens seen). When it evaluates and
checkpoints is the cadence objects' to say (``run.worker.cadence``), so the loop itself reads
as one short while-loop. Checkpoints (layout and manifests: ``run.checkpoint``): every rank
saves its own DeepSpeed shard into one directory with the loop state (step, wall time, MLflow
run id) and ``ray.train.report`` merges them into one Ray Train checkpoint on the study's
storage. On a restart (a worker retried by Ray's
FailureConfig, or the study resubmitted under the same run name) the loop loads the latest
checkpoint itself and continues the same MLflow run; points at steps already in MLflow are
dropped, so no step is logged twice. A non-finite loss or gradient norm ends the run as
failed (reason and tokens in MLflow) without raising, so Ray does not retry a divergence.

Evaluation: one fixed validation subset per run, the same for any worker count
(``TokenLoader.eval_windows``: one fixed order, nested prefixes). Every curve point
(``val/*``) reads its first ``eval_max_windows`` windows; the final pass (``final/*``) reads
the first ``max(final_max_windows, eval_max_windows)`` (all windows when
``final_max_windows`` is None), i.e. the curve's windows plus more, so a spec asking for a
smaller final pass gets the curve's. The last step logs both: its curve point is comparable
with the others, its final pass is the larger sample. MQAR-style corpora (``labelled``)
also log ``val/accuracy`` and ``final/val_accuracy``: argmax = target on labelled positions.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from model.toolchain import compile_unavailable
from orchestrator.plan.contract import RunSpec
from orchestrator.run import faults
from orchestrator.run.checkpoint import CKPT_TAG, FALLBACK_KEY, save_share
from orchestrator.run.evaluate import eval_sums, val_metrics
from orchestrator.run.ext_lock import pin_ninja, sweeping
from orchestrator.run.final_weights import save_final_weights
from orchestrator.run.pack_item import PackItem
from orchestrator.run.worker.branching import (
    BRANCH_POINT_KEY,
    branch_point_dir,
    copy_trunk_history,
    restore_branch_point,
    save_branch_point,
)
from orchestrator.run.worker.cadence import CheckpointCadence, DiagnosticsCadence, EvalCadence
from orchestrator.run.worker.optim import batch_geometry, deepspeed_config, lr_multiplier, param_groups
from orchestrator.run.worker.recorder import NodePlace, Recorder, node_place
from orchestrator.run.worker.stall import WorkerGuard, worker_log
from orchestrator.track.timeline import Timeline
from orchestrator.track.tracking import STATUS_FAILED, STATUS_FINISHED, client_for, run_status


class _Dist:
    """Thin collective helpers that also work with a single, non-distributed process."""

    def __init__(self) -> None:
        self.on = torch.distributed.is_available() and torch.distributed.is_initialized()

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        if self.on:
            torch.distributed.all_reduce(t)
        return t.tolist()


class RunLoop:
    """One worker's share of a run. ``rank``/``world_size`` come from the Ray Train context;
    ``step_hook`` (fault injection in tests, ``run.faults``) runs before every optimizer step when given;
    ``data_hash`` is the prepared data's content hash (a checkpoint of the same run on other
    data is never resumed); ``guard`` the process's watchdog (``run.worker.stall``; none: unwatched);
    ``storage_path`` the study's storage (branch points of ``protocol: branches``, ``run.worker.branching``);
    ``node`` where this process runs (its node's local rank 0 records the node's system metrics,
    ``run.worker.recorder``; none: rank 0's alone)."""

    def __init__(
        self,
        run: RunSpec,
        data_path: str,
        tracking_uri: str,
        mlflow_run_id: str,
        rank: int,
        world_size: int,
        board: str | None = None,
        step_hook: faults.StepHook | None = None,
        data_hash: str | None = None,
        guard: WorkerGuard | None = None,
        storage_path: str = "",
        timeline: Timeline | None = None,
        node: NodePlace | None = None,
    ):
        self.run, self.rank, self.world, self.node = run, rank, world_size, node
        self.step_hook, self.data_hash, self.guard = step_hook, data_hash, guard or WorkerGuard(rank, tracking_uri)
        self.data_path, self.tracking_uri, self.mlflow_run_id, self.board = data_path, tracking_uri, mlflow_run_id, board
        self.storage_path = storage_path
        self.timeline = timeline or Timeline.since()
        self.dist = _Dist()
        self.on_gpu = torch.cuda.is_available() and run.resources.gpus_per_worker > 0
        self.geom = batch_geometry(run.train.global_batch, world_size, run.train.micro_batch)
        self.evaluator, self.checkpointer = EvalCadence.of(run), CheckpointCadence.of(run)
        self.diagnoser = DiagnosticsCadence.of(run)

    # -- setup -------------------------------------------------------------------------
    def _build(self) -> None:
        import deepspeed

        from data_pipeline import TokenLoader
        from model import GPT, ModelConfig
        from model.plugins import load_planned

        self.timeline.mark("worker_imports")
        r, t = self.run, self.run.train
        if r.plugin is not None:  # a plug-in variant registers itself on import
            load_planned(r.plugin)
        torch.manual_seed(r.seed)
        model = GPT(ModelConfig(**r.model), seed=r.seed)  # same seed: same shared weights in every variant
        if r.resources.compile:  # compiles at the first forward: in the timeline's first_step
            model.compile()
        self.timeline.mark("model")
        self.train_loader = TokenLoader(self.data_path, "train", t.seq_len, t.global_batch, r.seed)
        self.val_loader = TokenLoader(self.data_path, "val", t.seq_len, t.global_batch, 0)
        self.timeline.mark("data_loader")
        optimizer = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=t.betas, fused=False, foreach=True)
        schedule = lambda step: lr_multiplier(step, r.steps, t.warmup_steps, t.schedule, t.min_lr_ratio, t.decay_fraction)  # noqa: E731
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        cfg = deepspeed_config(self.geom, r.resources.zero_stage, t.grad_clip, self.on_gpu)
        with sweeping(worker_log):  # a lock left by a killed op build would hang this forever (run.ext_lock)
            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model, optimizer=optimizer, lr_scheduler=scheduler, config=cfg, dist_init_required=False
            )
        self.device = self.engine.device
        self.timeline.mark("engine")
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.on_gpu else nullcontext()

    def _restore(self) -> dict[str, Any]:
        """Load the newest whole Ray Train checkpoint of this run, if any (``run.checkpoint``: a
        corrupt latest one falls back to the one before); return the loop state it holds."""
        from orchestrator.run.checkpoint import restore_newest_whole, resume_candidates
        from orchestrator.run.worker.safe_load import load_engine_checkpoint  # weights-only: storage is shared

        fresh = {"step": 0, "wall_s": 0.0, "evals": 0}
        dev = _collective_device(self.on_gpu)
        state = restore_newest_whole(
            resume_candidates() if _in_ray_train() else [],
            lambda d: load_engine_checkpoint(self.engine, d, CKPT_TAG),
            run_id=self.run.run_id,
            data_hash=self.data_hash,
            rank=self.rank,
            any_rank=lambda flag: self.dist.sum([float(flag)], dev)[0] > 0,
            log=worker_log,
            rebuild=self._build,
        )
        if state is None or "step" not in state:
            return {**fresh, **(state or {})}
        if state["mlflow_run_id"] != self.mlflow_run_id:
            # The checkpoint is the record of truth: continue the MLflow run it was writing.
            self.mlflow_run_id = state["mlflow_run_id"]
        return state

    # -- pieces of a step ----------------------------------------------------------------
    def _train_step(self, step: int) -> tuple[float, float, float]:
        """One optimizer step over the step's global batch: (mean loss over ranks, global
        gradient norm, the learning rate this step's update used)."""
        lr = self.scheduler.get_last_lr()[0]  # the engine steps the scheduler after the update
        x, y = self.train_loader.xy(step, self.rank, self.world)
        mb = self.geom.micro_batch
        losses = []
        own_norm = None
        for i in range(self.geom.grad_accum):
            xb = x[i * mb : (i + 1) * mb].to(self.device)
            yb = y[i * mb : (i + 1) * mb].to(self.device)
            with self.autocast:
                _, loss = self.engine(xb, yb)
            self.engine.backward(loss)
            if i == self.geom.grad_accum - 1 and self.run.resources.zero_stage == 0:
                # DeepSpeed's fp32 ZeRO-0 path clips without keeping the norm; the gradients
                # are already averaged over ranks here, so every rank gets the global norm.
                own_norm = _grad_norm(self.engine.module)
            self.engine.step()
            losses.append(loss.detach().float().item())
        (loss_sum,) = self.dist.sum([sum(losses) / len(losses)], self.device)
        gn = self.engine.get_global_grad_norm()
        grad_norm = float(gn) if gn is not None else own_norm if own_norm is not None else float("nan")
        return loss_sum / self.world, grad_norm, lr

    def _evaluate(self, max_windows: int | None, start: int = 0) -> list[float]:
        """``eval_sums`` over the val windows ``eval_windows(max_windows)[start:]``, this rank's
        share (every world-th window, padded so every rank runs the same batches: ZeRO-3
        forwards are collective), summed over ranks: [loss sum, labelled positions, correct]."""
        self.engine.eval()
        batches = self.val_loader.eval_xy(max_windows, self.geom.micro_batch, self.rank, self.world, start)
        sums = eval_sums(self.engine, batches, self.device, self.autocast, accuracy=self.val_loader.labelled)
        self.engine.train()
        return self.dist.sum(sums, self.device)

    @torch.no_grad()
    def _diagnostics(self) -> dict[str, float]:
        """``attention_diagnostics`` on the run's fixed probe (the first ``PROBE_WINDOWS`` eval
        windows), split over the ranks: each computes ``sharded_stats`` (every world-th window;
        the maps' SVDs cost several eval forwards of the same windows), the pieces are added
        into the whole probe's stats and every rank summarizes them (rank 0 logs): the numbers
        one rank computing every window gives. ZeRO-3 gathers the lambdas it reads."""
        import deepspeed

        from model.diagnostics import PROBE_WINDOWS, sharded_stats, summarize

        self.engine.eval()
        x, _ = next(iter(self.val_loader.eval_xy(PROBE_WINDOWS, PROBE_WINDOWS)))
        gather = deepspeed.zero.GatheredParameters if self.run.resources.zero_stage == 3 else None
        piece = sharded_stats(self.engine.module, x.to(self.device), self.rank, self.world, gather=gather)
        self.engine.train()
        return summarize(torch.tensor(self.dist.sum(piece.flatten().tolist(), self.device)).view_as(piece))

    def _ended_earlier(self) -> str | None:
        """``finished``/``failed`` if an earlier attempt of this worker group already ended
        the run (packs: a retry starts again at the pack's first run), else None. Rank 0
        reads MLflow; every rank gets its answer. Called before the model is built, so a
        skipped run costs one MLflow read and one all-reduce."""
        code = 0.0
        if self.rank == 0:
            status = run_status(client_for(self.tracking_uri).get_run(self.mlflow_run_id))
            code = {STATUS_FINISHED: 1.0, STATUS_FAILED: 2.0}.get(status, 0.0)
        (code,) = self.dist.sum([code], _collective_device(self.on_gpu))
        return {1.0: STATUS_FINISHED, 2.0: STATUS_FAILED}.get(code)

    def _checkpoint(self, state: dict[str, Any], metrics: dict[str, float]) -> dict[str, float]:
        """Save every rank's shard and the loop state as one Ray Train checkpoint.

        Returns {checkpoint/bytes (all ranks), checkpoint/save_s (DeepSpeed save), checkpoint/persist_s
        (ray.train.report copying it to the study's storage)} for rank 0 to log."""
        import ray.train

        with self.guard.section("checkpoint"), tempfile.TemporaryDirectory(prefix="qkstudy-ckpt-") as d:
            t0 = time.perf_counter()
            save_share(self.engine, d, state, self.rank, self.world)  # DeepSpeed, state, manifest (run.checkpoint)
            own = sum(f.stat().st_size for f in Path(d).rglob("*") if f.is_file())
            (size,) = self.dist.sum([float(own)], self.device)
            t1 = time.perf_counter()
            if _in_ray_train():
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            t2 = time.perf_counter()
        return {"checkpoint/bytes": size, "checkpoint/save_s": t1 - t0, "checkpoint/persist_s": t2 - t1}

    # -- the loop --------------------------------------------------------------------------
    def run_loop(self) -> str:
        """Train to the planned budget; returns the final status (finished / failed)."""
        self.guard.loop = self
        self._t_start, self._sections_before = time.perf_counter(), dict(self.guard.watchdog.seconds)
        with self.guard.section("startup"):
            ended = self._ended_earlier()
            if ended:
                return ended
            why = self.run.resources.compile and compile_unavailable("cuda" if self.on_gpu else "cpu")
            if why:  # nothing a retry changes: the run fails once, with the reason, and the study goes on
                self._open_record({"step": 0}).failed(0, f"resources.compile is set, but {why}")
                return STATUS_FAILED
            self._build()
            state = self._branch_start(self._restore())
            self.timeline.mark("restore")
        self._time_earlier = state.get("time_split", {})
        r = self.run
        self.rec = rec = self._open_record(state)
        step, wall_s, evals = state["step"], state["wall_s"], state["evals"]
        self.engine.train()
        grad_norm_max = 0.0  # over the steps since the last logged point: a spike between points shows
        while step < r.steps:
            with self.guard.section("step"):
                if self.step_hook:
                    self.step_hook(step)
                t0 = time.perf_counter()
                loss, grad_norm, lr = self._train_step(step)
            step += 1
            if step == state["step"] + 1:  # this attempt's first optimizer step: its start-up is over
                # its seconds (torch.compile, allocator and kernel warm-up) are the timeline's first_step, not wall_s
                rec.startup(step, {**self.timeline.mark("first_step").metrics(), **_compiled_graphs(r.resources.compile)})
                rec.warmed_up(step, wall_s)
            else:
                wall_s += time.perf_counter() - t0
            reason = _divergence(loss, grad_norm, step, step * r.train.tokens_per_step)
            if reason:
                rec.failed(step, reason)
                return STATUS_FAILED
            grad_norm_max = max(grad_norm_max, grad_norm)
            evaluate = self.evaluator.should_evaluate(step)
            if step % r.train.log_every_steps == 0 or evaluate:
                rec.train_point(step, loss, grad_norm, lr, wall_s, grad_norm_max)
                grad_norm_max = 0.0
            if evaluate:
                evals += 1
                with self.guard.section("eval"):
                    val = self._eval_step(rec, step, evals)
            if self.checkpointer.should_checkpoint(step, evals):
                self._checkpoint_step(rec, step, wall_s, evals, val)
            if self.checkpointer.should_keep_branch_point(step):  # a trunk: keep this step's checkpoint for its branches
                with self.guard.section("checkpoint"):
                    self._branch_point(step, wall_s, evals)
        self._save_final_weights(step)
        rec.time_split(step, self.time_split())
        rec.finished(step)
        return STATUS_FINISHED

    def _open_record(self, state: dict[str, Any]) -> Recorder:
        """The run's Recorder (rank 0 writes), started at the restored ``state``'s step: a
        resume's fallback note, a branch start and its branch point's verification said."""
        r = self.run
        rec = Recorder(
            r,
            self.tracking_uri,
            self.mlflow_run_id,
            self.board,
            active=self.rank == 0,
            devices=self.world,
            data=(r.corpus_name, self.data_path, self.data_hash),
            carried=state.get("unwritten_metrics"),
            node=self.node,
        )
        rec.start(
            state["step"],
            fallback=state.get(FALLBACK_KEY),
            branched=bool(state.get("branched")),
            branch_point=state.get(BRANCH_POINT_KEY),
            wall_s=state.get("wall_s", 0.0),
        )
        return rec

    def time_split(self) -> dict[str, float]:
        """Where this run's worker time went [s]: ``time/elapsed_s`` (from the loop's start),
        ``time/{startup,step,eval,checkpoint}_s`` (the watchdog's exclusive section totals, open ones so far;
        logging and the loop itself are the rest). Earlier attempts' figures, as of their last
        checkpoint, are added: what an attempt trained after its last checkpoint is not counted."""
        now = {f"time/{k}_s": v - self._sections_before.get(k, 0.0) for k, v in self.guard.watchdog.totals().items()}
        now["time/elapsed_s"] = time.perf_counter() - self._t_start
        return {k: v + float(self._time_earlier.get(k, 0.0)) for k, v in now.items()}

    def _branch_start(self, state: dict[str, Any]) -> dict[str, Any]:
        """A branch (``protocol: branches``) without a checkpoint of its own starts from its
        trunk's branch point, verified (a torn one: an earlier one or step 0), its curve
        copied from the trunk's up to the step it starts at (``run.worker.branching``)."""
        if state["step"] or self.run.trunk is None:
            return state
        from orchestrator.run.worker.safe_load import load_engine_checkpoint  # weights-only: storage is shared

        dev = _collective_device(self.on_gpu)
        start = restore_branch_point(
            lambda d: load_engine_checkpoint(self.engine, d, CKPT_TAG),
            self.scheduler,
            self.run,
            self.storage_path,
            data_hash=self.data_hash,
            rank=self.rank,
            any_rank=lambda flag: self.dist.sum([float(flag)], dev)[0] > 0,
            log=worker_log,
            rebuild=self._build,
        )
        if self.rank == 0 and start.get("branched"):
            copy_trunk_history(
                client_for(self.tracking_uri),
                start["trunk_mlflow_run_id"],
                self.mlflow_run_id,
                start["step"] * self.run.train.tokens_per_step,
            )
        return {**state, **start}  # a resume_fallback note of the branch's own checkpoints stays

    def _branch_point(self, step: int, wall_s: float, evals: int) -> None:
        """Save the retained checkpoint a branch starts from (``run.worker.branching``); collective."""
        state = {
            "step": step,
            "wall_s": wall_s,
            "evals": evals,
            "mlflow_run_id": self.mlflow_run_id,
            "run_id": self.run.run_id,
            "data_hash": self.data_hash,
        }
        save_branch_point(
            self.engine,
            branch_point_dir(self.storage_path, self.run.run_id, step),
            state,
            self.rank,
            self.world,
            lambda: self.dist.sum([0.0], self.device),
        )

    def _eval_step(self, rec: Recorder, step: int, evals: int) -> float:
        """Evaluate the curve's windows (and, at the last step, the final pass: those plus the
        windows it adds, module docstring) and log them, with the attention diagnostics when
        their cadence says (``evals``: evaluations so far, this one included; timed on their
        own, ``time/diag_s``); returns the curve's val loss."""
        r = self.run
        labelled = self.val_loader.labelled
        curve = self._evaluate(r.eval_max_windows)
        val, acc = val_metrics(curve, labelled)
        diag = {}
        if self.diagnoser.should_diagnose(step, evals):
            with self.guard.section("diag"):
                diag = self._diagnostics()
        rec.eval_point(step, val, diag, accuracy=acc)
        if self.evaluator.is_last(step):
            final = curve
            if r.final_max_windows is None or r.final_max_windows > r.eval_max_windows:
                added = self._evaluate(r.final_max_windows, start=r.eval_max_windows)
                final = [a + b for a, b in zip(curve, added)]
            rec.final_point(step, *val_metrics(final, labelled))
        return val

    def _checkpoint_step(self, rec: Recorder, step: int, wall_s: float, evals: int, val: float) -> None:
        """Save the loop state after ``step`` as a Ray Train checkpoint (``_checkpoint``) and log
        what the save cost; ``val`` (the step's val loss) goes to Ray Train's report."""
        r = self.run
        tokens = step * r.train.tokens_per_step
        state = {
            "step": step,
            "wall_s": wall_s,
            "evals": evals,
            "tokens": tokens,
            "mlflow_run_id": self.mlflow_run_id,
            "run_id": r.run_id,
            "data_hash": self.data_hash,
            "unwritten_metrics": rec.unwritten(),  # an outage's points survive this attempt
            "time_split": self.time_split(),
        }
        rec.checkpoint_point(step, self._checkpoint(state, {"tokens": tokens, "val_loss": val}))

    def _save_final_weights(self, step: int) -> None:
        """Log the weights of the last step as the run's final weights (``run.final_weights``)."""
        r = self.run
        with self.guard.section("checkpoint"):  # every rank: ZeRO-3 gathers are collective
            save_final_weights(
                self.engine,
                r.model,
                self.tracking_uri,
                self.mlflow_run_id,
                zero_stage=r.resources.zero_stage,
                rank=self.rank,
                step=step,
                tokens=step * r.train.tokens_per_step,
            )


def _divergence(loss: float, grad_norm: float, step: int, tokens: int) -> str | None:
    """Why the run must stop (a non-finite loss or gradient norm), or None."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return None
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    return f"non-finite {what} at step {step} ({tokens} tokens): loss={loss}, grad_norm={grad_norm}"


def _collective_device(on_gpu: bool) -> torch.device:
    """The device this worker's collectives use before its engine exists (NCCL needs the
    worker's own GPU; gloo the CPU)."""
    if on_gpu and _in_ray_train():
        from ray.train.torch import get_device

        return get_device()
    return torch.device("cpu")


def _grad_norm(module: torch.nn.Module) -> float:
    """2-norm over every parameter's gradient (as torch.nn.utils.clip_grad_norm_ computes it)."""
    norms = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def _compiled_graphs(compiled: bool) -> dict[str, float]:
    """{"compile/graphs": graphs torch.compile built in this process so far} when the run asked
    for compilation (0 would say nothing was compiled: a model dynamo skipped), else {}."""
    if not compiled:
        return {}
    from torch._dynamo.utils import counters

    return {"compile/graphs": float(counters["stats"]["unique_graphs"])}


def _in_ray_train() -> bool:
    try:
        import ray.train

        ray.train.get_context()
        return True
    except Exception:
        return False


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point: train a pack of runs back to back.

    ``config``: runs (``PackItem.to_dict`` of each run, in pack order),
    tracking_uri, board (progress actor name or None), timeline (the driver's and the pack
    task's start-up marks, ``track.timeline``: the first run continues them, each later run starts
    its own where the previous one ended, a restarted group at its entry). A run that ends (finished, or failed
    by divergence) never stops the pack; a crash does, and Ray's FailureConfig restarts the
    group, which skips the runs already ended and resumes the checkpointed one."""
    import gc

    import ray.train

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    pin_ninja()  # the ninja the prebuild used: another one would rebuild the shm op (ext_lock)
    ctx = ray.train.get_context()
    first_attempt = ray.train.get_checkpoint() is None  # no checkpoint existed when the group started
    storage = config.get("storage_path", "")
    local_storage = storage if storage and "://" not in storage else None  # where a fired fault point leaves its mark
    timeline = Timeline.from_json(config.get("timeline")) if first_attempt else None
    timeline = timeline.mark("worker_group") if timeline else Timeline.since("restart")
    guard = WorkerGuard(ctx.get_world_rank(), config["tracking_uri"]).start()  # one watchdog per process
    statuses = []
    for item in map(PackItem.from_dict, config["runs"]):
        loop = RunLoop(
            item.run,
            item.data_path,
            config["tracking_uri"],
            item.mlflow_run_id,
            ctx.get_world_rank(),
            ctx.get_world_size(),
            config.get("board"),
            step_hook=faults.step_hook(item.run.run_name, fired_dir=local_storage) if first_attempt else None,
            data_hash=item.data_hash,
            guard=guard,
            storage_path=config.get("storage_path", ""),
            timeline=timeline,
            node=node_place(ctx),
        )
        statuses.append(loop.run_loop())
        timeline = Timeline.since("previous_run")
        del loop  # free the engine (weights, optimizer states) before the next run builds its own
        gc.collect()
    guard.watchdog.stop()
    ray.train.report({"finished": sum(s == STATUS_FINISHED for s in statuses), "runs": len(statuses)})
