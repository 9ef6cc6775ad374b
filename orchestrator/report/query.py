"""Read a study's training runs and metric histories from MLflow in bulk.

Why two paths: the MLflow client API fetches metric history one (run, metric) at a time,
which for 1,000 runs x 10 metrics is 10,000 round trips. When the tracking URI is a
database (sqlite, postgresql, mysql, mssql) we read MLflow's own tables (`runs`, `tags`,
`params`, `metrics`) with four SQL queries instead (SQLite through ADBC, which hands over
Arrow columns; other databases through SQLAlchemy). For an http MLflow server we use
`search_runs` plus the server's bulk history route (100 runs per request) in a thread pool,
and per-run `get_metric_history` for any other URI or a server without that route.
Both paths return the same `StudyData`. Runs tagged `qkstudy.kind` other than "train"
(e.g. the report's own run) are excluded from its run table. The same read also brings what
the report's optional parts need (the experiment's tags and the LR-tuning runs with their
final tuning loss), so building a report reads the store once.

Conventions read here are DESIGN.md "Conventions": experiment = study name, step = tokens.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd

from orchestrator.plan.tuning import KIND as KIND_TUNE
from orchestrator.report.errors import ReportError
from orchestrator.track.tracking import KIND_TAG, KIND_TRAIN, RUN_TAGS, TAG_NAMESPACE, sqlite_path

# Tags and params promoted to typed columns of the run table; the rest keep a prefix.
COLUMN_TAGS = ("study", "run_id", "variant", "scale", "seed", "corpus", "extend", "status", "failure_reason")
NUMERIC_PARAMS = ("n_params", "n_params_total", "flops_per_token", "planned_tokens", "seq_len", "global_batch")
_SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mssql")
# MLflow's own tags are dropped from the run table but these (the run's code, track.provenance)
KEPT_MLFLOW_TAGS = ("mlflow.source.git.commit",)


@dataclass
class StudyData:
    """A study's runs and metric points.

    runs: one row per MLflow run; columns run_uuid, run_name, mlflow_status, start_time,
        end_time (ms since epoch), the COLUMN_TAGS (seed as Int64, extend as float), kind,
        the NUMERIC_PARAMS as float, and `params.<name>` / `tags.<name>` for the rest.
    metrics: one row per (run_uuid, key, step); columns run_uuid, key, step (int, tokens
        seen), value (float, NaN where MLflow stored NaN), timestamp (ms).
    experiment_tags: the experiment's tags (the driver's records: unigram baselines, the
        tuning rule, the gate's decisions; ``track.tracking``, ``track.gate_record``).
    tuning: the LR-tuning runs (kind ``tune``) as run-table rows, one per ``run_id`` tag (the
        latest started wins), oldest first; ``status`` is the tag alone (None without one) and
        ``final_val_loss`` the run's latest ``final/val_loss`` (None when it logged none).
    """

    study: str
    tracking_uri: str
    experiment_id: str
    runs: pd.DataFrame
    metrics: pd.DataFrame
    experiment_tags: dict[str, str] = field(default_factory=dict)
    tuning: pd.DataFrame = field(default_factory=pd.DataFrame)

    def tidy(self) -> pd.DataFrame:
        """One row per (run, metric, step) with the run's columns; runs without metrics keep one row."""
        return self.runs.merge(self.metrics, on="run_uuid", how="left")


def is_sql_uri(tracking_uri: str) -> bool:
    """True when the tracking URI is a SQLAlchemy database URI MLflow stores runs in."""
    scheme = urlparse(tracking_uri).scheme.split("+")[0].lower()
    return scheme in _SQL_SCHEMES


def query_study(study: str, tracking_uri: str, *, with_metrics: bool = True, kinds: tuple[str, ...] = (KIND_TRAIN,)) -> StudyData:
    """Read the study's training runs (and, by default, all their metric histories); ``kinds``
    adds other run kinds (``tune``: the LR-tuning runs), told apart by the ``kind`` column.

    Raises ReportError when the store or the experiment does not exist or has no training runs.
    """
    if is_sql_uri(tracking_uri):
        data = _query_sql(study, tracking_uri, with_metrics, kinds)
    else:
        data = _query_client(study, tracking_uri, with_metrics, kinds)
    if data.runs.empty:
        raise _no_runs(study, tracking_uri)
    return data


def _no_runs(study: str, tracking_uri: str) -> ReportError:
    return ReportError(f"study {study!r} has no training runs (its experiment exists in {tracking_uri})")


def load_study(study: str, tracking_uri: str, *, tuning: bool = False) -> pd.DataFrame:
    """The study as one tidy table: a row per (run, metric, step) plus the run's columns.

    Columns: see StudyData.runs and StudyData.metrics (metric columns key, step, value,
    timestamp are NA on the single row of a run that logged no metric), and ``tokens``: the
    tokens seen at the point (the step, by the convention step = tokens; Int64). ``tuning``
    adds the LR-tuning runs (``kind`` tune; training runs are ``kind`` train).
    Raises ReportError when the study's experiment does not exist or has no runs.
    """
    tidy = query_study(study, tracking_uri, kinds=(KIND_TRAIN, KIND_TUNE) if tuning else (KIND_TRAIN,)).tidy()
    return tidy.assign(tokens=tidy["step"].astype("Int64"))


def export_study(study: str, tracking_uri: str, out_file: str | os.PathLike, *, tuning: bool = False) -> Path:
    """Write load_study's table to a Parquet file atomically (temp file, then rename).

    Returns the written path (mode 0644). Raises ReportError like load_study, when out_file
    does not end in .parquet, or when it cannot be written (the OS error and path named).
    """
    out = Path(out_file)
    if out.suffix.lower() != ".parquet":
        raise ReportError(f"export file {out} must end in .parquet (the export is a Parquet table)")
    table = load_study(study, tracking_uri, tuning=tuning)
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        table.to_parquet(tmp, index=False)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; an export is meant to be shared
        os.replace(tmp, out)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise ReportError(f"cannot write export file {out}: {err}") from err
        raise
    return out


# --- SQL path -------------------------------------------------------------------------------


def _sqlite_path(tracking_uri: str) -> str | None:
    """Filesystem path of a sqlite:/// URI (None for other databases); ReportError if absent."""
    db = sqlite_path(tracking_uri)
    if db is None:
        return None
    path = str(db)
    if path in (".", ":memory:") or not db.exists():
        raise ReportError(f"tracking store {tracking_uri}: database file {path!r} does not exist")
    return path


def _sql_queries(eid: int) -> dict[str, str]:
    """The four bulk queries; eid is an integer we read ourselves, so inlining it is safe."""
    where = f"r.experiment_id = {int(eid)} AND r.lifecycle_stage = 'active'"
    join = f"JOIN runs r ON r.run_uuid = x.run_uuid WHERE {where}"
    return {
        "runs": f"SELECT r.run_uuid, r.name AS run_name, r.status AS mlflow_status, r.start_time, r.end_time FROM runs r WHERE {where}",
        "tags": f"SELECT x.run_uuid, x.key, x.value FROM tags x {join}",
        "params": f"SELECT x.run_uuid, x.key, x.value FROM params x {join}",
        "metrics": f"SELECT x.run_uuid, x.key, x.step, x.value, x.timestamp, x.is_nan FROM metrics x {join}",
        # MLflow's own latest value per (run, key): what a client's run.data.metrics holds
        "tune_loss": f"SELECT x.run_uuid, x.value, x.is_nan FROM latest_metrics x {join} AND x.key = '{TUNE_LOSS}'",
        "experiment_tags": f"SELECT key, value FROM experiment_tags WHERE experiment_id = {int(eid)}",
    }


EXPERIMENT_SQL = "SELECT experiment_id FROM experiments WHERE name = {p} AND lifecycle_stage = 'active'"
TUNE_LOSS = "final/val_loss"  # what a tuning run is judged by (orchestrator.plan.tuning)


def _read_tables_adbc(path: str, study: str, names: list[str]) -> tuple[int | None, dict[str, pd.DataFrame]]:
    """SQLite through ADBC: rows arrive as Arrow columns, ~7x faster than SQLAlchemy row objects."""
    import adbc_driver_sqlite.dbapi as adbc

    with adbc.connect(f"file:{path}?mode=ro") as conn, conn.cursor() as cur:
        cur.execute(EXPERIMENT_SQL.format(p="?"), (study,))
        row = cur.fetchone()
        if row is None:
            return None, {}
        eid = int(row[0])
        out = {}
        for name in names:
            cur.execute(_sql_queries(eid)[name])
            out[name] = cur.fetch_arrow_table().to_pandas()
        return eid, out


def _read_tables_sqlalchemy(tracking_uri: str, study: str, names: list[str]) -> tuple[int | None, dict[str, pd.DataFrame]]:
    import sqlalchemy

    engine = sqlalchemy.create_engine(tracking_uri)
    try:
        with engine.connect() as conn:
            exp = pd.read_sql(sqlalchemy.text(EXPERIMENT_SQL.format(p=":n")), conn, params={"n": study})
            if exp.empty:
                return None, {}
            eid = int(exp["experiment_id"].iloc[0])
            return eid, {n: pd.read_sql(sqlalchemy.text(_sql_queries(eid)[n]), conn) for n in names}
    finally:
        engine.dispose()


def _query_sql(study: str, tracking_uri: str, with_metrics: bool, kinds: tuple[str, ...] = (KIND_TRAIN,)) -> StudyData:
    names = ["runs", "tags", "params", "tune_loss", "experiment_tags"] + (["metrics"] if with_metrics else [])
    path = _sqlite_path(tracking_uri)
    try:
        if path is not None:
            eid, t = _read_tables_adbc(path, study, names)
        else:
            eid, t = _read_tables_sqlalchemy(tracking_uri, study, names)
    except Exception as err:  # driver-specific errors: a missing table or a file that is no database means "not an MLflow store"
        if "not a database" in str(err):
            raise ReportError(f"tracking store {tracking_uri} is not an MLflow database (the file is not SQLite)") from None
        if "no such table" in str(err) or "does not exist" in str(err):
            raise ReportError(f"tracking store {tracking_uri} is not an MLflow database (it holds no MLflow tables)") from None
        raise
    if eid is None:
        raise ReportError(f"study {study!r}: no MLflow experiment of that name in {tracking_uri}")
    if t["runs"].empty:  # empty result columns come back untyped (int64), which shaping cannot use
        raise _no_runs(study, tracking_uri)
    table = _pivoted(t["runs"], t["tags"], t["params"])
    run_table = _of_kinds(table, kinds)
    loss = t["tune_loss"]
    loss = dict(zip(loss["run_uuid"], np.where(loss["is_nan"].astype(bool), np.nan, loss["value"].astype(float))))
    tuning = _tuning(table, loss)
    exp_tags = dict(zip(t["experiment_tags"]["key"], t["experiment_tags"]["value"]))
    metrics = t.get("metrics")
    if metrics is None:
        metrics = _empty_metrics()
    else:
        metrics.loc[metrics["is_nan"].astype(bool), "value"] = np.nan
        metrics = metrics.drop(columns="is_nan")
    return StudyData(study, tracking_uri, str(eid), run_table, _clean_metrics(metrics, run_table), exp_tags, tuning)


# --- client path (http MLflow server, file store) -------------------------------------------


def _query_client(study: str, tracking_uri: str, with_metrics: bool, kinds: tuple[str, ...] = (KIND_TRAIN,)) -> StudyData:
    from mlflow import MlflowClient
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri)
    try:
        exp = client.get_experiment_by_name(study)
    except MlflowException as err:
        raise ReportError(f"tracking store {tracking_uri}: {err}") from err
    if exp is None or exp.lifecycle_stage != "active":
        raise ReportError(f"study {study!r}: no MLflow experiment of that name in {tracking_uri}")
    found: list = []
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], run_view_type=ViewType.ACTIVE_ONLY, max_results=50000, page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            break
    runs = pd.DataFrame(
        [(r.info.run_id, r.info.run_name, r.info.status, r.info.start_time, r.info.end_time) for r in found],
        columns=["run_uuid", "run_name", "mlflow_status", "start_time", "end_time"],
    )
    tags = pd.DataFrame([(r.info.run_id, k, v) for r in found for k, v in r.data.tags.items()], columns=["run_uuid", "key", "value"])
    params = pd.DataFrame([(r.info.run_id, k, v) for r in found for k, v in r.data.params.items()], columns=["run_uuid", "key", "value"])
    table = _pivoted(runs, tags, params)
    run_table = _of_kinds(table, kinds)
    tuning = _tuning(table, {r.info.run_id: r.data.metrics[TUNE_LOSS] for r in found if TUNE_LOSS in r.data.metrics})
    exp_tags = dict(exp.tags)
    if not with_metrics:
        return StudyData(study, tracking_uri, exp.experiment_id, run_table, _empty_metrics(), exp_tags, tuning)
    keep = set(run_table["run_uuid"])
    by_key: dict[str, list[str]] = {}
    for r in found:
        if r.info.run_id in keep:
            for k in r.data.metrics:
                by_key.setdefault(k, []).append(r.info.run_id)
    jobs = [(k, ids[i : i + BULK_RUNS]) for k, ids in by_key.items() for i in range(0, len(ids), BULK_RUNS)]
    bulk = _bulk_history_fn(client, tracking_uri)

    def history(job):
        key, run_ids = job
        return bulk(key, run_ids)

    # The server handles concurrent reads; 8 requests in flight hide per-request latency.
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows = [row for part in pool.map(history, jobs) for row in part]
    metrics = pd.DataFrame(rows, columns=["run_uuid", "key", "step", "value", "timestamp"])
    return StudyData(study, tracking_uri, exp.experiment_id, run_table, _clean_metrics(metrics, run_table), exp_tags, tuning)


# MLflow server's bulk history route (used by its own UI): up to 100 runs and 25,000 points
# per request, complete histories (not the sampled "bulk-interval" route).
BULK_ROUTE = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
BULK_RUNS, BULK_POINTS = 100, 25000


def _bulk_history_fn(client, tracking_uri: str):
    """A function (key, run_ids) -> rows (run_uuid, key, step, value, timestamp).

    For http(s) servers it asks BULK_ROUTE for up to 100 runs at once, halving the batch when
    the 25,000-point cap may have cut the answer; a server without the route (or any other
    URI) gets one get_metric_history call per run, which pages through long histories itself.
    """

    def per_run(key, run_ids):
        return [(rid, key, m.step, m.value, m.timestamp) for rid in run_ids for m in client.get_metric_history(rid, key)]

    if urlparse(tracking_uri).scheme not in ("http", "https"):
        return per_run
    from mlflow.utils.rest_utils import http_request

    try:
        creds = client._tracking_client.store.get_host_creds()  # auth/TLS settings of this URI
    except AttributeError:
        return per_run
    route_ok = [True]

    def bulk(key, run_ids):
        if not route_ok[0] or len(run_ids) == 1:
            return per_run(key, run_ids)
        resp = http_request(creds, BULK_ROUTE, "GET", params={"run_id": run_ids, "metric_key": key, "max_results": BULK_POINTS})
        if resp.status_code == 404:
            route_ok[0] = False
            return per_run(key, run_ids)
        resp.raise_for_status()
        points = resp.json().get("metrics", [])
        if len(points) >= BULK_POINTS:  # possibly truncated: split the batch
            half = len(run_ids) // 2
            return bulk(key, run_ids[:half]) + bulk(key, run_ids[half:])
        return [(m["run_id"], key, int(m["step"]), float(m["value"]), int(m["timestamp"])) for m in points]

    return bulk


# --- shaping --------------------------------------------------------------------------------


def _empty_metrics() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_uuid": pd.Series(dtype=object),
            "key": pd.Series(dtype=object),
            "step": pd.Series(dtype="int64"),
            "value": pd.Series(dtype="float64"),
            "timestamp": pd.Series(dtype="int64"),
        }
    )


def _pivoted(runs: pd.DataFrame, tags: pd.DataFrame, params: pd.DataFrame) -> pd.DataFrame:
    """Every run with its tags and params as columns, untyped (``_of_kinds`` types them); a
    run without a kind tag is a training run of an early version."""
    runs, tags = runs.copy(), _bare_names(tags)
    t = tags.pivot(index="run_uuid", columns="key", values="value") if not tags.empty else pd.DataFrame()
    p = params.pivot(index="run_uuid", columns="key", values="value") if not params.empty else pd.DataFrame()
    runs = runs.set_index("run_uuid")
    for name in COLUMN_TAGS:
        runs[name] = t[name].reindex(runs.index) if name in t.columns else None
    runs["kind"] = t[KIND_TAG].reindex(runs.index) if KIND_TAG in t.columns else None
    for name in t.columns:
        if name not in COLUMN_TAGS and name != KIND_TAG and (not name.startswith("mlflow.") or name in KEPT_MLFLOW_TAGS):
            runs[f"tags.{name}"] = t[name].reindex(runs.index)
    for name in NUMERIC_PARAMS:
        col = p[name].reindex(runs.index) if name in p.columns else pd.Series(np.nan, index=runs.index)
        runs[name] = pd.to_numeric(col, errors="coerce").astype(float)
    for name in p.columns:
        if name not in NUMERIC_PARAMS:
            runs[f"params.{name}"] = p[name].reindex(runs.index)
    runs = runs.reset_index()
    runs["kind"] = runs["kind"].fillna(KIND_TRAIN)
    return runs


def _of_kinds(table: pd.DataFrame, kinds: tuple[str, ...], fill_status: bool = True) -> pd.DataFrame:
    """The runs of ``kinds`` of a ``_pivoted`` table, typed and sorted; ``fill_status``: a run
    without a status tag takes MLflow's status."""
    # The report's own run and any kind not asked for are not data.
    runs = table[table["kind"].isin(kinds)].copy()
    runs["seed"] = pd.to_numeric(runs["seed"], errors="coerce").astype("Int64")
    runs["extend"] = pd.to_numeric(runs["extend"], errors="coerce").fillna(1.0).astype(float)
    if fill_status:
        runs["status"] = runs["status"].fillna(runs["mlflow_status"].str.lower())
    runs["run_name"] = runs["run_name"].fillna("")
    return runs.sort_values(["scale", "variant", "extend", "seed", "run_name"], na_position="last").reset_index(drop=True)


def _tuning(table: pd.DataFrame, loss: dict[str, float]) -> pd.DataFrame:
    """StudyData.tuning from a ``_pivoted`` table and each run's latest tuning loss: of the
    runs sharing a ``run_id`` tag the latest started is kept (a retried tuning point),
    in the order MLflow lists them by start time (run id breaks a tie)."""
    runs = _of_kinds(table, (KIND_TUNE,), fill_status=False)
    runs = runs.sort_values(["start_time", "run_uuid"], kind="stable")
    row_of: dict[str, int] = {}  # run_id -> its latest row, in the order the run_ids first appear
    for i, run_id, uuid in zip(runs.index, runs["run_id"], runs["run_uuid"]):
        row_of[run_id if isinstance(run_id, str) and run_id else uuid] = i
    runs = runs.loc[list(row_of.values())].reset_index(drop=True)
    values = [None if (v := loss.get(u)) is None else float(v) for u in runs["run_uuid"]]  # a float, as MLflow's client gives
    runs["final_val_loss"] = pd.Series(values, index=runs.index, dtype=object)
    return runs


def _bare_names(tags: pd.DataFrame) -> pd.DataFrame:
    """Rows (run_uuid, key, value) with every qkstudy run tag under its bare name, as
    ``tracking.run_tags`` gives one run's: the namespaced value wins over a bare one of an
    older store."""
    if tags.empty:
        return tags
    n = len(TAG_NAMESPACE)
    namespaced = tags["key"].str.startswith(TAG_NAMESPACE) & tags["key"].str[n:].isin(RUN_TAGS)
    out = tags.assign(key=tags["key"].where(~namespaced, tags["key"].str[n:]), _namespaced=namespaced)
    return out.sort_values("_namespaced", kind="stable").drop_duplicates(["run_uuid", "key"], keep="last").drop(columns="_namespaced")


def _clean_metrics(metrics: pd.DataFrame, run_table: pd.DataFrame) -> pd.DataFrame:
    metrics = metrics[metrics["run_uuid"].isin(run_table["run_uuid"])]
    # An empty SQL result types run_uuid/key as int64; they are strings (merges need equal types).
    metrics = metrics.astype({"run_uuid": object, "key": object, "step": "int64", "value": "float64", "timestamp": "int64"})
    return metrics.sort_values(["run_uuid", "key", "step", "timestamp"], kind="stable").reset_index(drop=True)
