"""MLflow conventions (DESIGN.md, "Conventions that numbers depend on") in one module.

The runner writes runs and the report reads them, often versions apart, so both take every
convention from here: names, statuses, where the default store lives, and how a URI is
printed. Experiment = study name. One MLflow run per planned run, found again by its
``run_id`` tag (the planner's hash), so a resubmitted study reuses the same MLflow run: the
id is created once by the driver and carried in the run's checkpoint. Step = tokens seen
(int). Run tags carry the ``qkstudy.`` namespace (``tag("status")`` -> ``qkstudy.status``):
study, run_id, variant, scale, seed, corpus, extend, status, failure_reason, ... (``RUN_TAGS``);
stores written before the namespace hold the bare names, so every reader goes through
``run_tag`` / ``run_tags``, which accept both (the namespaced one wins). ``KIND_TAG``:
``train`` for a training run, ``report`` for the report's own run, ``stale`` for an
abandoned duplicate, ``superseded`` for a run whose data or configuration the study no longer
has (tags ``superseded_by``: the run_id that replaced it, ``superseded_reason``); only
``train`` runs are study data. Experiment tags ``qkstudy.unigram_ppl.<corpus>`` and
``qkstudy.unigram_val_tokens.<corpus>``: each corpus's unigram baseline.

Default store: ``sqlite:///<workdir>/mlflow.db`` (the study's workdir, ``runs/<study>`` by
default). Every URI that is printed, logged or written into a report goes through
``redact_uri`` first: a ``postgresql://user:password@host/db`` store must not leak its
password into a shared report or a terminal log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.plan.spec import default_workdir

# Re-exported: printing a URI is one of this module's conventions (its doc).
from orchestrator.plan.uri_secrets import REDACTED as REDACTED
from orchestrator.plan.uri_secrets import redact_uri as redact_uri
from orchestrator.track.store_template import seed_store

if TYPE_CHECKING:  # MLflow takes seconds to import: the functions that talk to a store import it
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from orchestrator.plan.spec import Study

KIND_TAG = "qkstudy.kind"
KIND_TRAIN, KIND_REPORT, KIND_STALE, KIND_SUPERSEDED = "train", "report", "stale", "superseded"
STATUS_QUEUED, STATUS_RUNNING, STATUS_FINISHED, STATUS_FAILED = "queued", "running", "finished", "failed"
# Experiment tags, one pair per corpus of the study: the unigram perplexity of its val split
# (data_pipeline.unigram) and the val tokens it scored; the report reads them beside the finals.
UNIGRAM_PPL_TAG, UNIGRAM_VAL_TOKENS_TAG = "qkstudy.unigram_ppl", "qkstudy.unigram_val_tokens"
# Experiment tag of a tuned study: the rule its LRs were chosen by (JSON: the initial grid,
# tuning seeds, extend_edges, min_steps, per_corpus), so the report recomputes the same choice.
TUNE_TAG = "qkstudy.tune"
# Run tags qkstudy writes, by their bare name: each is stored as ``qkstudy.<name>`` (``tag``).
RUN_TAGS = (
    "study",
    "run_id",
    "variant",
    "model_variant",
    "scale",
    "seed",
    "corpus",
    "extend",
    "status",
    "failure_reason",
    "failed_at_tokens",
    "final_tokens",
    "trunk",
    "branch_step",
    "branch_point",
    "branched_at_tokens",
    "superseded_by",
    "superseded_reason",
    "pack",
    "restarts",
    "resumed_from_tokens",
    "resume_fallback",
    "metrics_dropped",
    "stall.section",
    "stall.elapsed_s",
)
TAG_NAMESPACE = "qkstudy."
STORE_FILE = "mlflow.db"

# MLflow prints "View run ... at: <tracking URI>/#/..." whenever a run on a server ends: the
# URI raw, password included, into the CLI's output and every worker's log. Every process
# that writes runs imports this module first.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

# --------------------------------------------------------------------------- store URIs


def sqlite_uri(path: str | os.PathLike[str]) -> str:
    """``sqlite:///<absolute path>`` of a SQLite store file (four slashes on POSIX)."""
    return f"sqlite:///{Path(path).resolve()}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` (or ``sqlite+driver:///``) URI; None for any
    other store. A relative path stays relative (SQLAlchemy reads it from the cwd)."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme.split("+")[0].lower() != "sqlite":
        return None
    return Path(rest.removeprefix("/").split("?", 1)[0])  # "sqlite://" (in memory): Path(".")


def default_tracking_uri(workdir: str | os.PathLike[str]) -> str:
    """The embedded store of a work dir: ``sqlite:///<workdir>/mlflow.db``."""
    return sqlite_uri(Path(workdir) / STORE_FILE)


def study_tracking_uri(study: Study) -> str:
    """The spec's ``tracking_uri``, else the SQLite file in the study's work dir."""
    return study.tracking_uri or default_tracking_uri(study.workdir_path)


def named_study_uri(name: str, tracking_uri: str | None = None) -> str:
    """Store of a study known only by name: ``tracking_uri``, else ``MLFLOW_TRACKING_URI``,
    else the default work dir's SQLite file (``runs/<name>/mlflow.db``)."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(default_workdir(name))


# --------------------------------------------------------------------------- run tags


def tag(name: str) -> str:
    """The stored name of run tag ``name`` (one of ``RUN_TAGS``): ``qkstudy.<name>``.

    Raises KeyError for a name that is not a qkstudy run tag (a typo would otherwise write a
    tag no reader looks for)."""
    if name not in RUN_TAGS:
        raise KeyError(f"{name!r} is not a qkstudy run tag (RUN_TAGS)")
    return TAG_NAMESPACE + name


def run_tag(tags: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    """Run tag ``name`` from a run's tags: ``qkstudy.<name>``, else the bare ``<name>`` that
    stores written before the namespace hold, else ``default``."""
    return tags.get(tag(name), tags.get(name, default))


def run_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """A run's tags with every qkstudy run tag under its bare name (namespaced beats bare,
    whichever the store holds) and every other tag (MLflow's, provenance) unchanged."""
    out = {k: v for k, v in tags.items() if not (k.startswith(TAG_NAMESPACE) and k[len(TAG_NAMESPACE) :] in RUN_TAGS)}
    for name in RUN_TAGS:
        value = run_tag(tags, name)
        if value is not None:
            out[name] = value
    return out


# --------------------------------------------------------------------------- runs


def client_for(uri: str) -> MlflowClient:
    """An MlflowClient on ``uri`` (SQLite file, http(s) server, or a file store). A SQLite
    store that does not exist yet is created as a copy of a migrated template
    (``track.store_template``: seconds less than MLflow's migrations)."""
    from mlflow.tracking import MlflowClient

    if (db := sqlite_path(uri)) is not None and db != Path("."):
        seed_store(db)
    return MlflowClient(tracking_uri=uri)


def artifact_location(tracking_uri: str) -> str | None:
    """Where a new experiment's artifacts go: ``<folder of the SQLite file>/artifacts`` (a
    ``file://`` URI; the study's workdir for the embedded store) for a SQLite store, None (the
    server's or MLflow's default) for any other. MLflow's own default for a SQLite store is
    ``./mlruns`` of whichever process logs first: a worker's cwd, not the study's folder."""
    db = sqlite_path(tracking_uri)
    return None if db is None or db == Path(".") else (db.resolve().parent / "artifacts").as_uri()


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """Experiment id of ``name``, creating it (tolerating a concurrent creator) with its
    artifacts under ``artifact_location`` of the client's store."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(client.tracking_uri))
    except Exception:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_train_runs(client: MlflowClient, experiment_id: str, kind: str = KIND_TRAIN) -> dict[str, Any]:
    """All training runs of an experiment keyed by their ``run_id`` tag (newest wins); ``kind``
    ``tune`` gives the LR-tuning runs instead (``orchestrator.plan.tune_plan``)."""
    out: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{KIND_TAG}` = '{kind}'",
            max_results=5000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        for r in page:
            out[run_tag(r.data.tags, "run_id") or r.info.run_id] = r
        token = page.token
        if not token:
            return out


def run_status(run: Any) -> str:
    """``queued``, ``running``, ``finished`` or ``failed`` from the run's ``status`` tag."""
    return run_tag(run.data.tags, "status", STATUS_QUEUED) or STATUS_QUEUED


def create_run(
    client: MlflowClient,
    experiment_id: str,
    spec: Any,
    extra_params: dict[str, Any] | None = None,
    extra_tags: dict[str, str] | None = None,
) -> str:
    """Create the MLflow run of a planned run (RunSpec) with its tags and params; return its id.
    ``extra_tags`` (the driver's provenance, ``track.provenance``) are set at creation too."""
    named = {
        "study": spec.study,
        "run_id": spec.run_id,
        "variant": spec.variant,
        "model_variant": spec.model_variant,
        "scale": spec.scale,
        "seed": str(spec.seed),
        "corpus": spec.corpus_name,
        "extend": spec.extend_tag,
        "status": STATUS_QUEUED,
    }
    if getattr(spec, "branch_step", None) is not None:  # protocol: branches: its trunk (a trunk is its own)
        named.update(trunk=spec.trunk or spec.run_id, branch_step=str(spec.branch_step))  # and where it branches
    kind = getattr(spec, "kind", KIND_TRAIN)  # a tuning run is kind tune
    tags = {**(extra_tags or {}), KIND_TAG: kind, **{tag(k): v for k, v in named.items()}}
    run = client.create_run(experiment_id, run_name=spec.run_name, tags=tags)
    params = {
        "n_params": spec.n_params,
        "n_params_total": spec.n_params_total,
        "flops_per_token": spec.flops_per_token,
        "planned_tokens": spec.tokens,
        "planned_steps": spec.steps,
        "seq_len": spec.train.seq_len,
        "global_batch": spec.train.global_batch,
        "lr": spec.train.lr,
        "schedule": spec.train.schedule,
        "zero_stage": spec.resources.zero_stage,
        "workers": spec.resources.workers,
        **{f"model.{k}": v for k, v in spec.model.items()},
        # a plug-in variant's code, as its run id names it (model.plugins)
        **{f"plugin.{k}": v for k, v in (getattr(spec, "plugin", None) or {}).items() if k != "path" and v is not None},
        **(extra_params or {}),
    }
    _log_params(client, run.info.run_id, params)
    return run.info.run_id


def _log_params(client: MlflowClient, mlflow_run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client.log_batch(mlflow_run_id, params=items[i : i + 100])


def set_status(client: MlflowClient, mlflow_run_id: str, status: str, reason: str | None = None, tokens: int | None = None) -> None:
    """Set the ``status`` tag (and MLflow's own run status) of a run; record why it failed.

    ``reason`` is stored redacted (``redact_uri``): exception text may quote a storage or store
    URI with its credentials, and the tag reaches every report's ``runs.csv``."""
    from mlflow.entities import RunTag

    tags = [RunTag(tag("status"), status)]
    if reason is not None:
        tags.append(RunTag(tag("failure_reason"), redact_uri(reason)[:5000]))
    if tokens is not None:
        tags.append(RunTag(tag("failed_at_tokens" if status == STATUS_FAILED else "final_tokens"), str(tokens)))
    client.log_batch(mlflow_run_id, tags=tags)
    if status == STATUS_FINISHED:
        client.set_terminated(mlflow_run_id, "FINISHED")
    elif status == STATUS_FAILED:
        client.set_terminated(mlflow_run_id, "FAILED")
    else:
        client.update_run(mlflow_run_id, status="RUNNING")


def last_logged_step(client: MlflowClient, mlflow_run_id: str, key: str = "tokens") -> int:
    """Largest step logged for ``key`` in a run (-1 if none)."""
    hist: Iterable[Metric] = client.get_metric_history(mlflow_run_id, key)
    return max((m.step for m in hist), default=-1)


# --------------------------------------------------------------------------- experiment tags


def set_unigram_tags(client: MlflowClient, experiment_id: str, corpus: str, val_ppl: float, val_tokens: int) -> None:
    """Record ``corpus``'s unigram baseline on the study's experiment: its val split's
    perplexity per token (``data_pipeline.unigram``) and the val tokens scored."""
    client.set_experiment_tag(experiment_id, f"{UNIGRAM_PPL_TAG}.{corpus}", repr(float(val_ppl)))
    client.set_experiment_tag(experiment_id, f"{UNIGRAM_VAL_TOKENS_TAG}.{corpus}", str(int(val_tokens)))


def set_tune_tag(client: MlflowClient, experiment_id: str, record: dict[str, Any]) -> None:
    """Record a tuned study's choice rule (``orchestrator.plan.tune_plan.tune_record``) on its experiment."""
    client.set_experiment_tag(experiment_id, TUNE_TAG, json.dumps(record, sort_keys=True))


def tune_from_tags(tags: dict[str, str]) -> dict[str, Any] | None:
    """The record ``set_tune_tag`` wrote, or None (an untuned study, or one tuned before the
    record existed: its LRs were the plain grid argmin)."""
    value = tags.get(TUNE_TAG)
    return json.loads(value) if value else None


def unigram_from_tags(tags: dict[str, str]) -> dict[str, dict[str, Any]]:
    """corpus -> {"val_ppl": float, "val_tokens": int or None} from an experiment's tags (those
    ``set_unigram_tags`` wrote); corpora without the perplexity tag are absent."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in tags.items():
        if key.startswith(UNIGRAM_PPL_TAG + "."):
            corpus = key[len(UNIGRAM_PPL_TAG) + 1 :]
            n = tags.get(f"{UNIGRAM_VAL_TOKENS_TAG}.{corpus}")
            out[corpus] = {"val_ppl": float(value), "val_tokens": int(n) if n is not None else None}
    return out
