"""The data a study's MLflow runs were trained on, against the data this machine sees.

A run's id covers its corpus's content hash (``orchestrator.plan.planner``, IDENTITY_VERSION 2),
and every training run records that hash as its ``data_hash`` param
(``orchestrator.run.driver.records.run_params``). ``qkstudy status`` / ``report`` given a spec plan
the study here, where the corpus may be another copy (a cluster's shared storage holds the
one the runs used), unreadable, or edited since. Planned with the local hash, no run id
would match MLflow's and every run would show as missing. Instead, for each corpus:

- the local hash is one MLflow holds (or MLflow holds none): plan with it, say nothing;
- MLflow holds exactly one other hash: plan with MLflow's, so the rows are the study's runs
  as they ran, and say that the local data differs, naming both hashes (or that the local
  files cannot be read);
- MLflow holds several hashes, none the local one: plan with the local hash (what a run here
  would train) and say so, naming all of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator.plan.contract import RunSpec
from orchestrator.plan.planner import plan
from orchestrator.plan.spec import Study
from orchestrator.track.tracking import run_tag


def held_hashes(records: Iterable[Any]) -> dict[str, set[str]]:
    """Corpus name (``corpus`` tag) -> the ``data_hash`` params of MLflow run ``records``;
    records without either are skipped (an older version's runs)."""
    out: dict[str, set[str]] = {}
    for r in records:
        corpus, h = run_tag(r.data.tags, "corpus"), r.data.params.get("data_hash")
        if corpus and h:
            out.setdefault(corpus, set()).add(h)
    return out


def _note(corpus: str, local: str | None, held: list[str], used: str | None) -> str:
    """One line on corpus ``corpus``: data here ``local`` (None: unreadable), MLflow's ``held``
    hashes, and the hash the plan ``used``."""
    here = f"the data here (content hash {local})" if local else "its files cannot be read here"
    if used != local:
        link = " differs from the data" if local else "; the data"
        return (
            f"corpus {corpus!r}: {here}{link} the study's runs in MLflow were trained on (content hash "
            f"{used}): runs are matched by MLflow's hash"
        )
    return (
        f"corpus {corpus!r}: {here}; the study's runs in MLflow were trained on other data "
        f"(content hashes {', '.join(held)}): runs listed as planned would train on the data here"
    )


def match_data(local: dict[str, str | None], held: dict[str, set[str]]) -> tuple[dict[str, str | None], list[str]]:
    """(corpus -> the content hash to plan with, one line per corpus whose local hash is not
    the one used), following the module docstring. ``local``: ``plan.inputs.corpus_hashes``
    (None: unreadable here); ``held``: ``held_hashes`` of the study's runs."""
    data: dict[str, str | None] = {}
    notes: list[str] = []
    for corpus, h in local.items():
        hs = sorted(held.get(corpus, ()))
        data[corpus] = hs[0] if len(hs) == 1 and h not in hs else h
        if hs and h not in hs:
            notes.append(_note(corpus, h, hs, data[corpus]))
    return data, notes


def plan_against(study: Study, records: Iterable[Any]) -> tuple[list[RunSpec], list[str]]:
    """The study's runs with their ids computed on the data its MLflow ``records`` were trained
    on where the local data differs (``match_data``), and the lines saying where it does.

    Raises:
        PlanError: see ``orchestrator.plan.planner.plan``.
    """
    from orchestrator.plan.inputs import corpus_hashes
    from orchestrator.plan.throughput import throughput_table

    data, notes = match_data(corpus_hashes(study, strict=False), held_hashes(records))
    return plan(study, throughput_table(study), data), notes


def study_records(study_name: str, tracking_uri: str) -> list[Any]:
    """The study's training runs in MLflow (``tracking.find_train_runs``); [] when the store or
    the experiment does not exist. Reads only: never creates a store."""
    from orchestrator.track.tracking import client_for, find_train_runs, sqlite_path

    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        return []
    client = client_for(tracking_uri)
    exp = client.get_experiment_by_name(study_name)
    return list(find_train_runs(client, exp.experiment_id).values()) if exp is not None else []
