"""Runner: schedules a study's runs on Ray, one Ray Train TorchTrainer per pack of runs.

Order of work: plan -> MLflow experiment and the list of runs already there -> data
preparation once per corpus as a Ray task -> one lightweight Ray task per pack (one run by
default, ``resources.runs_per_trainer`` back to back otherwise) that owns a TorchTrainer
(workers sized from the spec; Ray places them as resources free up) -> live progress from the
``ProgressBoard`` actor -> final states read back from MLflow.

Idempotence: a run whose MLflow record (found by its ``run_id`` tag) is ``finished`` with the
same data hash is skipped; an unfinished one is resumed: same MLflow run, same Ray Train
run name (the pack's) and storage path, so Ray Train V2 hands the loop its latest
checkpoint. A run whose resources can never fit the cluster is reported at once and not launched. A failing run is
marked failed in MLflow and never takes the study down.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.plan.planner import RunSpec, plan
from orchestrator.plan.spec import Study
from orchestrator.run.progress import board_name, get_board
from orchestrator.run.security import redact_uri
from orchestrator.track.tracking import (
    KIND_TAG,
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_QUEUED,
    client_for,
    create_run,
    ensure_experiment,
    find_train_runs,
    run_status,
    set_status,
)


@dataclass
class StudyResult:
    """What happened to each planned run: ``status`` maps run_id -> finished / failed /
    skipped / unschedulable; ``reasons`` holds why a run failed or was not launched."""

    status: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    trained: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every planned run finished (now or in an earlier submission)."""
        return all(s in ("finished", "skipped") for s in self.status.values())


def init_ray(address: str | None = None, verbose: bool = False) -> None:
    """Join ``address`` (or RAY_ADDRESS), else start a local Ray; no-op when connected."""
    if ray.is_initialized():
        return
    # "local": a fresh local Ray even if a stale `ray start` left its address file behind.
    ray.init(address=address or os.environ.get("RAY_ADDRESS") or "local", namespace="qkstudy", log_to_driver=verbose,
             configure_logging=verbose, logging_level="INFO" if verbose else "ERROR")


def run_demands(run: RunSpec) -> dict[str, float]:
    """Resources one worker of ``run`` asks Ray for."""
    r = run.resources
    d = {"CPU": r.cpus_per_worker}
    if r.gpus_per_worker:
        d["GPU"] = r.gpus_per_worker
    return d


def unschedulable_reason(run: RunSpec, nodes: list[dict[str, float]]) -> str | None:
    """Why ``run`` can never be placed on a cluster with these node resources (None: it can).

    Each worker is one bundle that must fit on one node; all workers must fit at once
    (Ray Train gangs them in a placement group), packed greedily over nodes.
    """
    demand = run_demands(run)
    if _place(demand, run.resources.workers, [dict(n) for n in nodes]):
        return None
    total = {k: sum(n.get(k, 0.0) for n in nodes) for k in demand}
    return (f"needs {run.resources.workers} workers x {demand}, but the cluster has "
            f"{len(nodes)} node(s) with {total} in all")


def _alive_nodes() -> list[dict[str, float]]:
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


@ray.remote(num_cpus=1)
def _prepare_task(corpus: dict, tokenizer: dict, cache_root: str | None) -> dict[str, Any]:
    from data_pipeline import CorpusConfig, TokenizerConfig, prepare

    p = prepare(CorpusConfig.model_validate(corpus), TokenizerConfig.model_validate(tokenizer), cache_root, progress=False)
    tokens = {split: info["tokens"] for split, info in p.manifest.get("splits", {}).items()}
    return {"path": p.path, "content_hash": p.content_hash, "vocab_size": p.vocab_size, "tokens": tokens}


class CorpusError(ValueError):
    """A corpus that cannot feed the study's runs; ``corpus_name`` says which."""

    def __init__(self, corpus_name: str, message: str):
        self.corpus_name = corpus_name
        super().__init__(f"corpus {corpus_name!r}: {message}")


def check_data_fits(runs: list[RunSpec], datasets: dict[str, dict[str, Any]]) -> None:
    """Every run's corpus holds at least one training window and one validation window, and
    its token ids fit the model's vocabulary.

    Raises:
        CorpusError: naming the corpus, the split and the setting (train.seq_len, vocab).
    """
    for r in runs:
        d = datasets[r.corpus_name]
        need = r.train.seq_len + 1
        for split, n in d.get("tokens", {}).items():
            if n < need:
                raise CorpusError(r.corpus_name, f"the {split} split has {n} tokens, fewer than one window of "
                                                 f"train.seq_len + 1 = {need} tokens (add documents or lower train.seq_len)")
        if d["vocab_size"] > r.model["vocab_size"]:
            raise CorpusError(r.corpus_name, f"token ids go up to {d['vocab_size'] - 1}, beyond the model's vocabulary "
                                             f"of {r.model['vocab_size']} (tokenizer.vocab_size)")


def prepare_data(runs: list[RunSpec]) -> dict[str, dict[str, Any]]:
    """Prepare (or find cached) each corpus the runs need, one Ray task per corpus, all at
    once; returns corpus name -> {path, content_hash, vocab_size}.

    Raises:
        CorpusError: a corpus cannot be prepared (the task's DataError, re-raised here).
    """
    from data_pipeline import DataError

    wanted = {r.corpus_name: (r.corpus, r.tokenizer) for r in runs}
    cache = os.environ.get("QKSTUDY_CACHE")
    refs = {name: _prepare_task.remote(c, t, cache) for name, (c, t) in wanted.items()}
    out = {}
    for name, ref in refs.items():
        try:
            out[name] = ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, DataError):  # the original error, without Ray's traceback
                raise CorpusError(name, str(e.cause)) from None
            raise
    return out


# The controller checks its workers this often; a finished run is noticed at the next check.
# Ray's default (2 s) adds seconds to every short run; the check is one cheap actor call.
_HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
_HEALTH_CHECK_S = "0.5"


@dataclass(frozen=True)
class Pack:
    """Runs trained back to back by one Ray Train worker group (``resources.runs_per_trainer``).

    ``name`` is the Ray Train run name, under which the group's checkpoints live: the run id
    when ``runs_per_trainer`` is 1, else a hash of the ids of every run the plan put in the
    pack, so a resubmitted study finds the same checkpoints whichever of its runs are done."""

    name: str
    runs: tuple[RunSpec, ...]


def make_packs(order: list[RunSpec], todo_ids: set[str]) -> list[Pack]:
    """Cut the plan's launch order into packs of ``runs_per_trainer`` consecutive runs (similar
    lengths, as the order is longest first), then keep only the runs in ``todo_ids``."""
    packs = []
    size = order[0].resources.runs_per_trainer if order else 1
    for i in range(0, len(order), size):
        chunk = order[i:i + size]
        name = chunk[0].run_id if size == 1 else \
            "pack-" + hashlib.sha256(",".join(r.run_id for r in chunk).encode()).hexdigest()[:16]
        keep = tuple(r for r in chunk if r.run_id in todo_ids)
        if keep:
            packs.append(Pack(name, keep))
    return packs


@ray.remote(num_cpus=0, max_retries=0)
def _fit_pack(name: str, items: list[dict], tracking_uri: str, storage_path: str,
              board: str | None) -> dict[str, dict[str, str]]:
    """Owns one pack's TorchTrainer; ``items``: [{run, data_path, mlflow_run_id}]. Returns
    {run_id: {status, reason}}. Any failure is recorded in MLflow, never raised."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from orchestrator.run.worker import train_loop_per_worker

    os.environ.setdefault(_HEALTH_CHECK_ENV, _HEALTH_CHECK_S)  # Ray Train hands it to its controller
    res = RunSpec.model_validate(items[0]["run"]).resources
    use_gpu = res.gpus_per_worker > 0
    worker_res = {"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if use_gpu else {})}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"runs": items, "tracking_uri": tracking_uri, "board": board},
        scaling_config=ScalingConfig(num_workers=res.workers, use_gpu=use_gpu, resources_per_worker=worker_res),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(name=name, storage_path=storage_path,
                             failure_config=FailureConfig(max_failures=res.max_retries),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    client = client_for(tracking_uri)
    crash = ""
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001 - a failing run never takes the study down
        crash = f"{type(e).__name__}: {e}"
        cause = getattr(e, "__cause__", None) or getattr(e, "worker_failures", None)
        if cause:
            crash += f" (cause: {cause})"
    out = {}
    for item in items:
        run_id, mlflow_id = item["run"]["run_id"], item["mlflow_run_id"]
        record = client.get_run(mlflow_id)
        status, reason = run_status(record), record.data.tags.get("failure_reason", "")
        if status != STATUS_FINISHED and not (status == STATUS_FAILED and reason):
            # The group crashed before this run ended (or before it started).
            reason = crash or "the worker group ended before this run did"
            status = STATUS_FAILED
            set_status(client, mlflow_id, STATUS_FAILED, reason=reason)
        out[run_id] = {"status": status, "reason": reason}
    return out


def run_study(study: Study, *, address: str | None = None, console: Console | None = None,
              verbose: bool = False, max_in_flight: int | None = None) -> StudyResult:
    """Train every planned run of ``study`` that is not already finished.

    Args:
        address: Ray cluster address (else RAY_ADDRESS, else a local Ray).
        max_in_flight: runs handed to Ray at once (default: as many as the cluster holds at
            once); Ray decides where each run's workers go.

    Returns:
        StudyResult with every run's final state (also in MLflow, which is the record).
    """
    return run_runs(plan(study), study.name, study.resolved_tracking_uri, study.resolved_storage_path,
                    address=address, console=console, verbose=verbose, max_in_flight=max_in_flight)


def run_runs(runs: list[RunSpec], study_name: str, tracking_uri: str, storage_path: str, *,
             address: str | None = None, console: Console | None = None, verbose: bool = False,
             max_in_flight: int | None = None) -> StudyResult:
    """Schedule ``runs`` (all of one study) on Ray; see ``run_study``.

    ``qkstudy train RUN.yaml`` calls this with one run: the same code path as a study.
    """
    console = console or Console(stderr=True)
    t0 = time.time()
    result = StudyResult()
    init_ray(address, verbose)
    nodes = _alive_nodes()
    console.print(f"[bold]{study_name}[/]: {len(runs)} planned runs; MLflow {redact_uri(tracking_uri)}")
    with console.status("preparing data (Ray tasks)"):
        datasets = prepare_data(runs)
    for name, d in datasets.items():
        console.print(f"data {name}: {d['path']} (content {d['content_hash'][:12]})")
    check_data_fits(runs, datasets)  # before MLflow is touched: a bad corpus leaves no record

    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    client = client_for(tracking_uri)
    exp_id = ensure_experiment(client, study_name)
    existing = find_train_runs(client, exp_id)

    todo: list[tuple[RunSpec, str]] = []
    for run in runs:
        data = datasets[run.corpus_name]
        prev = existing.get(run.run_id)
        same_data = prev is not None and prev.data.params.get("data_hash") == data["content_hash"]
        if same_data and run_status(prev) == STATUS_FINISHED:
            result.status[run.run_id] = "skipped"
            continue
        reason = unschedulable_reason(run, nodes)
        if reason:
            result.status[run.run_id], result.reasons[run.run_id] = "unschedulable", reason
            console.print(f"[red]unschedulable[/] {run.run_name}: {reason}")
            continue
        if same_data:
            mlflow_id = prev.info.run_id  # resume: the same MLflow run and Ray Train run name
            set_status(client, mlflow_id, STATUS_QUEUED)
        else:
            if prev is not None:  # trained on other data: keep the record, but it no longer counts
                client.set_tag(prev.info.run_id, KIND_TAG, "stale")
            mlflow_id = create_run(client, exp_id, run, {"data_hash": data["content_hash"], "data_path": data["path"]})
        todo.append((run, mlflow_id))
    skipped = sum(1 for s in result.status.values() if s == "skipped")
    if skipped:
        console.print(f"{skipped} run(s) already finished in MLflow: skipped")

    if todo:
        _launch_and_watch(study_name, launch_order(runs), todo, datasets, tracking_uri, storage_path, result, console,
                          nodes, max_in_flight)
    result.wall_s = time.time() - t0
    return result


def _place(demand: dict[str, float], workers: int, free: list[dict[str, float]]) -> bool:
    """Greedily place ``workers`` bundles of ``demand`` on ``free`` (mutated); True if all fit."""
    trial = [dict(n) for n in free]
    for _ in range(workers):
        node = next((n for n in trial if all(n.get(k, 0.0) + 1e-9 >= v for k, v in demand.items())), None)
        if node is None:
            return False
        for k, v in demand.items():
            node[k] = node.get(k, 0.0) - v
    free[:] = trial
    return True


def capacity(run: RunSpec, nodes: list[dict[str, float]]) -> int:
    """How many copies of ``run`` the cluster holds at once (at least 1)."""
    free, n = [dict(x) for x in nodes], 0
    while n < 4096 and _place(run_demands(run), run.resources.workers, free):
        n += 1
    return max(1, n)


def dispatch(items: list[Any], launch: Callable[[Any], Any], limit: int, on_done: Callable[[Any, Any], None],
             on_tick: Callable[[], None] | None = None, poll_s: float = 1.0) -> None:
    """Hand ``items`` to Ray through ``launch`` (returns an ObjectRef), keeping at most
    ``limit`` in flight; Ray's scheduler decides where and when each one runs. Calls
    ``on_done(item, result)`` as each finishes and ``on_tick()`` every ``poll_s`` seconds."""
    pending = list(items)
    in_flight: dict[Any, Any] = {}
    while pending or in_flight:
        while pending and len(in_flight) < limit:
            item = pending.pop(0)
            in_flight[launch(item)] = item
        ready, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=poll_s)
        if on_tick:
            on_tick()
        for ref in ready:
            item = in_flight.pop(ref)
            try:
                out = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - one run's crash is that run's failure only
                out = {"status": STATUS_FAILED, "reason": f"{type(e).__name__}: {e}"}
            on_done(item, out)


def launch_order(runs: list[RunSpec]) -> list[RunSpec]:
    """Longest first (by total FLOPs per worker): list scheduling in LPT order keeps the
    makespan near max(longest run, total work / capacity)."""
    return sorted(runs, key=lambda r: -r.total_flops / r.resources.workers)


def _launch_and_watch(study_name: str, plan_order: list[RunSpec], todo: list[tuple[RunSpec, str]],
                      datasets: dict[str, dict[str, Any]], uri: str, storage: str, result: StudyResult,
                      console: Console, nodes: list[dict[str, float]], max_in_flight: int | None) -> None:
    board = get_board(study_name)
    bname = board_name(study_name)
    # One pack per slot the cluster has (a study's runs share one resources block): each pack
    # that ends frees a slot for the next-longest, so Ray's placement follows LPT order.
    limit = max_in_flight or max(capacity(r, nodes) for r, _ in todo)
    mlflow_ids = {r.run_id: m for r, m in todo}
    order = launch_order([r for r, _ in todo])
    total_tokens = sum(r.tokens for r in order)
    # A terminal gets live bars; a log (CI, `| tee`) gets a line per finished run and a
    # study-level line every 30 s instead of bars that render only at the end.
    live = console.is_terminal
    last_line = [time.time()]
    done_tokens: dict[str, int] = {}
    announced: set[str] = set()  # runs whose "finished" line is out (a pack's runs end one by one)

    def announce(run_id: str, tokens: int) -> None:
        if not live and run_id not in announced:
            announced.add(run_id)
            console.print(f"finished {names[run_id]} ({tokens:,} tokens) [{len(announced)}/{len(order)}]")

    with Progress(TextColumn("{task.description}", justify="left"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False,
                  disable=not live) as bar:
        overall = bar.add_task(f"[bold]study {study_name}", total=total_tokens, info="")
        names = {r.run_id: r.run_name for r in order}
        tasks = {r.run_id: bar.add_task(f"  {r.run_name}", total=r.tokens, info="queued") for r in order}

        def launch(pack: Pack):
            items = [{"run": r.model_dump(mode="json"), "data_path": datasets[r.corpus_name]["path"],
                      "mlflow_run_id": mlflow_ids[r.run_id]} for r in pack.runs]
            return _fit_pack.remote(pack.name, items, uri, storage, bname)

        def on_tick() -> None:
            snap = ray.get(board.snapshot.remote())
            for run_id, s in snap.items():
                if run_id in tasks and run_id not in result.status:
                    loss = f" loss {s['loss']:.3f}" if "loss" in s else ""
                    bar.update(tasks[run_id], completed=s.get("tokens", 0), info=f"{s.get('state', '')}{loss}")
                    done_tokens[run_id] = s.get("tokens", 0)
                    if s.get("state") == "finished":
                        announce(run_id, s.get("tokens", 0))
            bar.update(overall, completed=sum(done_tokens.values()))
            if not live and time.time() - last_line[0] > 30:
                last_line[0] = time.time()
                running = ", ".join(f"{names.get(r, r)} {s_['tokens'] * 100 // max(s_['planned'], 1)}%"
                                    for r, s_ in snap.items() if s_.get("state") == "running" and "planned" in s_)
                console.print(f"study {study_name}: {sum(done_tokens.values()):,}/{total_tokens:,} tokens"
                              + (f"; running: {running}" if running else ""))

        def on_done(pack: Pack, outs: dict[str, Any]) -> None:
            crashed = "status" in outs  # the pack's task itself died: one result for all its runs
            for run in pack.runs:
                on_run_done(run, outs if crashed else outs[run.run_id])

        def on_run_done(run: RunSpec, out: dict[str, str]) -> None:
            result.status[run.run_id] = out["status"]
            result.trained.append(run.run_id)
            if out["status"] != STATUS_FINISHED:
                result.reasons[run.run_id] = out.get("reason", "")
                bar.update(tasks[run.run_id], info=f"[red]{out['status']}[/]")
                console.print(f"[red]{run.run_name} {out['status']}[/]: {out.get('reason', '')[:300]}")
            else:
                done_tokens[run.run_id] = run.tokens
                bar.update(tasks[run.run_id], completed=run.tokens, info="[green]finished[/]")
                announce(run.run_id, run.tokens)
            bar.update(overall, completed=sum(done_tokens.values()))

        dispatch(make_packs(plan_order, set(mlflow_ids)), launch, limit, on_done, on_tick)
