"""Runner: the run executor. Schedules planned runs of one study on Ray, one Ray Train
TorchTrainer per pack of runs, under the study's lease (``run_runs`` takes it, or runs under
the one its caller holds). The study protocol above it (``run.driver.study``: ``run_study``, the
tuned protocol) decides which runs to plan and in which stages; this module never imports it.

Order of work: plan -> data preparation once per corpus as a Ray task (``run.driver.prepare_tasks``) -> MLflow
experiment and the runs already there -> one lightweight Ray task per pack (``run.driver.packing``:
one per slot the cluster has by default, ``resources.runs_per_trainer`` runs otherwise) that owns a
TorchTrainer (workers sized from the spec; Ray places them as resources free up; at most as
many packs in flight as ``run.driver.placement`` says fit at once) -> live progress from the
``ProgressBoard`` actor (``run.progress`` draws it) -> final states read back from MLflow.

Idempotence: a run whose MLflow record (found by its ``run_id`` tag, which covers the corpus's
content hash) is ``finished`` with the same data hash is skipped; when every run is, the
driver returns from MLflow alone, before Ray starts (``run.driver.records``). An unfinished one is
resumed: same MLflow run, same Ray Train run name (the pack's) and storage path, so Ray
Train V2 hands the loop its latest checkpoint. Records of runs the plan replaced (other data,
other configuration) are marked superseded, never resumed. A run whose resources can never
fit the cluster is reported at once and not launched. A failing run is marked failed in
MLflow and never takes the study down.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from mlflow.entities import RunTag
from rich.console import Console

from model.plugins import py_modules
from orchestrator.plan.contract import RunSpec
from orchestrator.run.driver.leasing import study_lease
from orchestrator.run.driver.packing import PACK_TAG, Pack, fit_pack, launch_order, make_packs, pack_items, requeue
from orchestrator.run.driver.placement import (
    ClusterGrowth,
    alive_nodes,
    capacity,
    cluster_growth,
    declared_growth,
    driver_node_memory,
    packs_at_once,
    run_demands,
    unschedulable_reason,
)
from orchestrator.run.driver.prepare_tasks import check_data_fits, find_unigrams, prepare_data, record_unigrams
from orchestrator.run.driver.records import (
    existing_runs,
    finished_before_ray,
    finished_on,
    mark_superseded,
    run_params,
    runs_kind,
    supersede_replaced,
)
from orchestrator.run.progress import StudyProgress, board_name, get_board, on_driver_node
from orchestrator.track.lease import JOB_ID_ENV, STUDY_LEASE, Lease
from orchestrator.track.provenance import Provenance, log_artifacts, resume_tags, set_experiment_note
from orchestrator.track.timeline import Timeline
from orchestrator.track.tracking import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_QUEUED,
    client_for,
    create_run,
    redact_uri,
    run_tag,
    set_status,
    tag,
)


@dataclass
class StudyResult:
    """What happened to each planned run: ``status`` maps run_id -> finished / failed /
    skipped / unschedulable, or gated (a gated ladder stopped its arm, ``run.driver.study``);
    ``reasons`` holds why a run failed or was not launched."""

    status: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every planned run finished (now or in an earlier submission) or was gated."""
        return all(s in ("finished", "skipped", "gated") for s in self.status.values())


@dataclass(frozen=True)
class DriverOptions:
    """How a driver hands a study's runs to Ray, the same for every stage of its protocol.

    Attributes:
        address: Ray cluster address (else RAY_ADDRESS, else a local Ray).
        verbose: show worker logs.
        max_in_flight: packs handed to Ray at once (default: as many as the cluster holds at
            once); Ray decides where each pack's workers go.
        wait: when another driver holds the study's lease, wait for it (``run.driver.leasing``).
        provenance: the driver's code, spec and environment (``track.provenance.gather``),
            tagged on every run it creates or resumes; None records none.
    """

    address: str | None = None
    verbose: bool = False
    max_in_flight: int | None = None
    wait: bool = False
    provenance: Provenance | None = None


DASHBOARD_ENV = "QKSTUDY_RAY_DASHBOARD"


def init_ray(address: str | None = None, verbose: bool = False, plugins: list[str] | None = None) -> None:
    """Join ``address`` (or RAY_ADDRESS), else start a local Ray; no-op when connected.

    ``plugins``: files and folders of local plug-in variants (``model.plugins.py_modules``),
    shipped to every worker of this driver's job as Ray's ``runtime_env.py_modules`` (Ray takes
    local paths only for a whole job). Inside a submitted job they already travel in the job's
    runtime env (``run.driver.submit``).

    A local Ray starts without its dashboard unless ``QKSTUDY_RAY_DASHBOARD=1``: nothing here
    uses it (job submission targets a cluster's own head), and its head processes cost about
    4-8 s of wall-clock and 4-13 CPU-s per start on a 2-core machine (BENCHMARKS.md)."""
    if ray.is_initialized():
        return
    # "local": a fresh local Ray even if a stale `ray start` left its address file behind.
    target = address or os.environ.get("RAY_ADDRESS") or "local"
    dashboard = os.environ.get(DASHBOARD_ENV) == "1" if target == "local" else None  # None: a cluster's own choice
    runtime_env = {"py_modules": plugins} if plugins and not os.environ.get(JOB_ID_ENV) else None
    ray.init(
        address=target,
        namespace="qkstudy",
        log_to_driver=verbose,
        configure_logging=verbose,
        logging_level=logging.INFO if verbose else logging.ERROR,
        include_dashboard=dashboard,
        runtime_env=runtime_env,
    )
    if target == "local":  # a kill -9 of this driver would leave two Ray agents running (run.ray_reaper)
        from orchestrator.run.driver.ray_reaper import start_reaper

        start_reaper()


def run_runs(
    runs: list[RunSpec],
    study_name: str,
    tracking_uri: str,
    storage_path: str,
    options: DriverOptions = DriverOptions(),
    *,
    console: Console | None = None,
    lease: Lease | None = None,
    timeline: Timeline | None = None,
) -> StudyResult:
    """Schedule ``runs`` (all of one study) on Ray under the study's lease, as ``options`` say
    (``DriverOptions``); ``console``: where progress goes (default: stderr).

    ``lease``: None (the default) takes the study lease for this call (before MLflow is read or
    Ray starts, released on return; ``wait`` as in ``run_study``). A caller that runs several
    stages under one lease (the tuned protocol, ``run.driver.study``) passes the study lease it holds
    (from ``run.driver.leasing.study_lease`` on ``storage_path``); it is neither taken nor released
    here, and ``options.wait`` is unused.

    ``timeline``: the command's start-up marks so far (``track.timeline``; the CLI's start from
    the process's); None starts one here. Each run's start-up timeline continues it.

    ``qkstudy train RUN.yaml`` calls this with one run: the same code path as a study.

    Raises:
        orchestrator.run.driver.leasing.StudyBusy: another live driver holds the study (unless ``wait``).
        orchestrator.run.driver.prepare_tasks.CorpusError: a corpus cannot be prepared or cannot feed the runs (nothing is
            written to MLflow then).
        orchestrator.run.driver.placement.ClusterConfigError: ``QKSTUDY_CLUSTER_CONFIG`` names
            a file that is no cluster config (before the lease is taken, Ray starts or MLflow is read).
        ValueError: ``lease`` is not the study lease of ``storage_path``, or is not held (never
            acquired, or released).
    """
    console = console or Console(stderr=True)
    declared = declared_growth()
    if lease is not None:
        if lease.name != STUDY_LEASE or lease.location != str(storage_path) or not lease.generation:
            raise ValueError(
                f"run_runs(lease=...) needs the held study lease of {storage_path!r}, got lease "
                f"{lease.name!r} of {lease.location!r} (generation {lease.generation})"
            )
        return _run_leased(runs, study_name, tracking_uri, storage_path, options, console, timeline, declared)
    with study_lease(study_name, storage_path, console, wait=options.wait):
        return _run_leased(runs, study_name, tracking_uri, storage_path, options, console, timeline, declared)


def _run_leased(
    runs: list[RunSpec],
    study_name: str,
    tracking_uri: str,
    storage_path: str,
    options: DriverOptions,
    console: Console,
    timeline: Timeline | None,
    declared: ClusterGrowth | None,
) -> StudyResult:
    """``run_runs`` once the study's lease is held (by this call or by its caller); ``declared``
    what ``QKSTUDY_CLUSTER_CONFIG`` says the cluster can grow to (``placement.declared_growth``)."""
    t0 = time.time()
    timeline = timeline.then("plan") if timeline else Timeline.since()
    result = StudyResult()
    console.print(f"[bold]{study_name}[/]: {len(runs)} planned runs; MLflow {redact_uri(tracking_uri)}")
    if finished_before_ray(runs, study_name, tracking_uri):
        result.status = {r.run_id: "skipped" for r in runs}
        console.print(f"{len(runs)} run(s) already finished in MLflow: skipped (Ray not started)")
        record_unigrams(tracking_uri, study_name, find_unigrams(runs, console), console)
        result.wall_s = time.time() - t0
        return result
    init_ray(options.address, options.verbose, py_modules([r.plugin for r in runs]))
    timeline.mark("ray")
    growth = cluster_growth(declared)
    if growth is not None:
        console.print(f"cluster can grow to {len(growth.nodes)} node(s) ({growth.source}): runs pend while the autoscaler adds nodes")
    with console.status("preparing data (Ray tasks)"):
        datasets = prepare_data(runs)
    for name, d in datasets.items():
        console.print(f"data {name}: {d['path']} (content {d['content_hash'][:12]})")
    check_data_fits(runs, datasets)  # before MLflow is touched: a bad corpus leaves no record
    timeline.mark("data")

    todo, recorded = _register(runs, study_name, tracking_uri, datasets, growth, result, console, options.provenance)
    record_unigrams(tracking_uri, study_name, {n: d.get("unigram") for n, d in datasets.items()}, console)
    skipped = sum(1 for s in result.status.values() if s == "skipped")
    if skipped:
        console.print(f"{skipped} run(s) already finished in MLflow: skipped")
    timeline.mark("mlflow")
    if todo:
        _launch_and_watch(
            study_name,
            launch_order(runs),
            todo,
            recorded,
            datasets,
            tracking_uri,
            storage_path,
            result,
            console,
            growth,
            options.max_in_flight,
            timeline,
        )
    result.wall_s = time.time() - t0
    return result


def _register(
    runs: list[RunSpec],
    study_name: str,
    tracking_uri: str,
    datasets: dict[str, dict[str, Any]],
    growth: ClusterGrowth | None,
    result: StudyResult,
    console: Console,
    provenance: Provenance | None = None,
) -> tuple[list[tuple[RunSpec, str]], dict[str, str]]:
    """Match each run to its MLflow record: skip the finished ones (same data), report the
    ones that can never fit (on the alive nodes, nor on what the cluster can grow to), queue
    the rest under their MLflow run (resumed, or created; a record the plan replaced is marked
    superseded, ``run.driver.records``), tagged with ``provenance`` when given. Returns
    [(run, MLflow run id)] to train and {run_id: pack name} of the resumed runs that
    recorded the pack they were launched in (``packing.PACK_TAG``)."""
    client, exp_id, existing = existing_runs(tracking_uri, study_name, runs_kind(runs))
    if provenance is not None:
        set_experiment_note(client, exp_id, provenance)
    supersede_replaced(client, existing, runs, datasets, console)
    todo: list[tuple[RunSpec, str]] = []
    recorded: dict[str, str] = {}
    nodes = alive_nodes()
    for run in runs:
        data = datasets[run.corpus_name]
        prev = existing.get(run.run_id)
        same_data = prev is not None and prev.data.params.get("data_hash") == data["content_hash"]
        if finished_on(prev, data["content_hash"]):
            result.status[run.run_id] = "skipped"
            continue
        reason = unschedulable_reason(run, nodes, growth)
        if reason:
            result.status[run.run_id], result.reasons[run.run_id] = "unschedulable", reason
            console.print(f"[red]unschedulable[/] {run.run_name}: {reason}")
            continue
        if prev is not None and same_data:
            mlflow_id = prev.info.run_id  # resume: the same MLflow run and Ray Train run name
            if pack := run_tag(prev.data.tags, PACK_TAG):
                recorded[run.run_id] = pack
            set_status(client, mlflow_id, STATUS_QUEUED)
            if provenance is not None:  # the code that trains it from here on
                client.log_batch(mlflow_id, tags=[RunTag(k, v) for k, v in resume_tags(prev.data.tags, provenance).items()])
        else:
            if prev is not None:  # same id, other data (a run planned without a data hash)
                mark_superseded(
                    client,
                    prev.info.run_id,
                    run.run_id,
                    f"trained on other data (content hash {prev.data.params.get('data_hash')}, now {data['content_hash']})",
                )
            mlflow_id = create_run(client, exp_id, run, run_params(run, data), provenance.tags if provenance else None)
            if provenance is not None and (why := log_artifacts(client, mlflow_id, provenance)):
                console.print(f"[yellow]warning[/]: {run.run_name}: provenance artifacts not stored: {why}")
        todo.append((run, mlflow_id))
    return todo, recorded


def _packs(
    plan_order: list[RunSpec], todo: list[tuple[RunSpec, str]], recorded: dict[str, str], slots: int, uri: str, console: Console
) -> list[Pack]:
    """The packs that train ``todo`` (``make_packs`` on ``slots``), said on the console and
    recorded on each run's MLflow record (``_record_packs``) before any launches."""
    packs = make_packs(plan_order, {r.run_id for r, _ in todo}, slots, recorded)
    size = todo[0][0].resources.runs_per_trainer
    how = f"runs_per_trainer auto: {slots} slot(s)" if size == "auto" else f"runs_per_trainer {size}"
    again = len({recorded[r.run_id] for r, _ in todo if r.run_id in recorded})
    console.print(
        f"{len(todo)} run(s) in {len(packs)} worker group(s) ({how}" + (f"; {again} of them resumed as launched)" if again else ")")
    )
    _record_packs(uri, packs, {r.run_id: m for r, m in todo}, recorded)
    return packs


def _record_packs(uri: str, packs: list[Pack], mlflow_ids: dict[str, str], recorded: dict[str, str]) -> None:
    """Tag each run not yet recorded in its pack with the pack's name (``packing.PACK_TAG``),
    before the pack launches: a resubmit then finds the run's checkpoints under that name."""
    client = client_for(uri)
    for pack in packs:
        for run in pack.runs:
            if recorded.get(run.run_id) != pack.name:
                client.set_tag(mlflow_ids[run.run_id], tag(PACK_TAG), pack.name)


def dispatch(
    items: list[Any],
    launch: Callable[[Any], Any],
    limit: int | Callable[[], int],
    on_done: Callable[[Any, Any], list[Any] | None],
    on_tick: Callable[[], None] | None = None,
    poll_s: float = 1.0,
) -> None:
    """Hand ``items`` to Ray through ``launch`` (returns an ObjectRef), keeping at most
    ``limit`` in flight (a callable: asked again before each launch, as nodes join and leave);
    Ray's scheduler decides where and when each one runs. Calls ``on_done(item, result)`` as
    each finishes (the items it returns are handed to Ray next) and ``on_tick()`` every
    ``poll_s`` seconds."""
    pending = list(items)
    in_flight: dict[Any, Any] = {}
    limit_now = limit if callable(limit) else lambda: limit
    while pending or in_flight:
        while pending and len(in_flight) < limit_now():
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
            pending[:0] = on_done(item, out) or []


def _launch_and_watch(
    study_name: str,
    plan_order: list[RunSpec],
    todo: list[tuple[RunSpec, str]],
    recorded: dict[str, str],
    datasets: dict[str, dict[str, Any]],
    uri: str,
    storage: str,
    result: StudyResult,
    console: Console,
    growth: ClusterGrowth | None,
    max_in_flight: int | None,
    timeline: Timeline,
) -> None:
    """Hand the packs of ``todo`` to Ray (at most as many as fit at once), draw progress from
    the study's board, and record each run's final state in ``result`` as its pack ends.
    ``recorded``: the packs resumed runs were launched in (``make_packs``); every run's pack is
    recorded on its MLflow run before it launches. Each pack's task continues ``timeline`` (its
    ``queued`` section ends when the task starts)."""
    board, bname = get_board(study_name), board_name(study_name)
    # One pack in flight per slot the cluster has, or can grow to (a study's runs share one
    # resources block): each pack that ends frees a slot for the next-longest, so Ray's
    # placement follows LPT order. Recounted as nodes join and leave; with an autoscaler, the
    # pending placement groups of the packs beyond the alive nodes are what makes it add nodes.
    # The grown cluster's slots are counted once; only the alive nodes are recounted each time.
    shapes = list({(r.resources.workers, tuple(sorted(run_demands(r).items()))): r for r, _ in todo}.values())
    grown = max(capacity(r, [], growth, most=len(todo)) for r in shapes) if growth else 1

    head_memory = driver_node_memory()  # each pack's task and Ray Train controller live on the driver's node

    def limit() -> int:
        if max_in_flight:
            return max_in_flight
        nodes = alive_nodes()
        return packs_at_once(max(grown, *(capacity(r, nodes, most=len(todo)) for r in shapes)), head_memory)

    mlflow_ids = {r.run_id: m for r, m in todo}
    packs = _packs(plan_order, todo, recorded, limit(), uri, console)

    with StudyProgress(study_name, [p.runs for p in packs], console) as view:

        def launch(pack: Pack) -> ray.ObjectRef:
            # On the driver's node: the pack's trainer (and Ray Train's controller) outlive a worker node.
            return fit_pack.options(scheduling_strategy=on_driver_node()).remote(
                pack.name, pack_items(pack, datasets, mlflow_ids), uri, storage, bname, timeline.to_json()
            )

        def on_done(pack: Pack, outs: dict[str, Any]) -> list[Pack]:
            crashed = "status" in outs  # the pack's task itself died: one result for all its runs
            again = None if crashed else requeue(pack, outs)
            if again is not None:
                console.print(f"{len(again.runs)} run(s) of {pack.name} never started before its worker group failed: queued again")
                _record_packs(uri, [again], mlflow_ids, {})
            for run in pack.runs:
                if again is not None and run in again.runs:
                    continue
                out = outs if crashed else outs[run.run_id]
                if out.get("started") is False:  # not requeued: its group failed before any run
                    set_status(client_for(uri), mlflow_ids[run.run_id], STATUS_FAILED, reason=out["reason"])
                result.status[run.run_id] = out["status"]
                if out["status"] != STATUS_FINISHED:
                    result.reasons[run.run_id] = out.get("reason", "")
                view.run_ended(run, out["status"], out.get("reason", ""))
            return [again] if again is not None else []

        def on_tick() -> None:
            view.update(ray.get(board.snapshot.remote()), result.status)

        dispatch(packs, launch, limit, on_done, on_tick)
