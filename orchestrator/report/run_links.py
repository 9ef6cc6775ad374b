"""The report's list of runs, each tied to its MLflow run.

An MLflow tracking server (an http or https tracking URI) shows run r of experiment e at
``{server}/#/experiments/{e}/runs/{r}``, so the report links each run there. A SQLite (or
file) store has no page of its own: ``mlflow ui`` started on it picks its own address, so
the report prints each run's MLflow run id instead (what the UI's search and
``MlflowClient.get_run`` take) and links nothing it cannot vouch for.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pandas as pd

TABLE = "mlflow_runs"
COLUMNS = ["run_name", "variant", "scale", "seed", "extend", "status", "final_ppl", "run_uuid"]


def table(finals: pd.DataFrame, scales: list[str], variants: list[str]) -> pd.DataFrame:
    """One row per run of the report (curves.run_finals rows): COLUMNS, run_uuid the MLflow run id;
    in the report's scale and variant order (lists as the other tables use), then extend, seed."""
    t = finals.reindex(columns=COLUMNS).sort_values(["extend", "seed"], kind="stable")
    rank = {(s, v): (i, j) for i, s in enumerate(scales) for j, v in enumerate(variants)}
    order = sorted(range(len(t)), key=lambda i: rank.get((t["scale"].iat[i], t["variant"].iat[i]), (len(scales), len(variants))))
    return t.iloc[order].reset_index(drop=True)


def server(tracking_uri: str | None) -> str | None:
    """The MLflow UI's base address for an http(s) tracking URI, without credentials, query or
    trailing slash ("https://u:***@h:5000/mlflow/?token=***" -> "https://h:5000/mlflow"); None
    for any other store (SQLite, file, database URIs)."""
    if not tracking_uri:
        return None
    parts = urlsplit(tracking_uri)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme.lower(), host, parts.path.rstrip("/"), "", ""))


def run_url(base: str, experiment_id: str, run_uuid: str) -> str:
    """The page of one run on the MLflow UI at ``base`` (`server`)."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_uuid}"


def section_text(summary: dict) -> list[str]:
    base, eid = server(summary.get("tracking_uri")), summary.get("experiment_id")
    if base and eid is not None:
        return [f"Every run of this report, linked to its page on the MLflow server `{base}` (experiment {eid})."]
    return [
        f"Every run of this report with its MLflow run id (experiment {eid if eid is not None else 'unknown'}). The "
        f"tracking store `{summary.get('tracking_uri')}` is not an MLflow server, so there is no run page to link: "
        "open the store with `mlflow ui --backend-store-uri <store>` and search for the run id."
    ]


def display(summary: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs table as the report prints it; the MLflow run cell is a markdown link
    ``[id](page)`` on a server (render.html makes it an anchor), else the bare id."""
    base, eid = server(summary.get("tracking_uri")), summary.get("experiment_id")

    def cell(rid) -> str:
        if not isinstance(rid, str) or not rid:
            return "—"
        return f"[{rid}]({run_url(base, str(eid), rid)})" if base and eid is not None else rid

    return pd.DataFrame(
        {
            "run": runs["run_name"].fillna(""),
            "variant": runs["variant"],
            "scale": runs["scale"],
            "seed": runs["seed"].map(lambda s: "—" if pd.isna(s) else str(int(s))),
            "extend": runs["extend"].map(lambda e: "—" if pd.isna(e) else f"x{float(e):g}"),
            "status": runs["status"].fillna(""),
            "final ppl": runs["final_ppl"].map(lambda p: "—" if pd.isna(p) else f"{float(p):.3f}"),
            "MLflow run": runs["run_uuid"].map(cell),
        }
    )
