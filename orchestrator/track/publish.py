"""A study's SQLite MLflow store made fit to publish: gzipped, without the paths of the machine
that trained it.

A store records where each run's artifacts live (``runs.artifact_uri``, ``experiments.
artifact_location``: ``file:///home/<user>/...`` on the training machine). Published, those
paths name a stranger's disk and lead ``qkstudy eval`` to a folder that is not there. They
are rewritten to ``qkstudy-published:/<experiment>/<run>``, a scheme no artifact repository
serves, which the loaders recognise (``is_published``) and refuse with that reason. Run tags
written before the ``qkstudy.`` namespace (``variant``, ``status``, ...: ``tracking.RUN_TAGS``)
are renamed into it, so a query written from README (``tags.`qkstudy.variant` = 'coupled'``)
finds the runs of every published store; a bare tag beside its namespaced twin is dropped (the
namespaced one is what every reader takes). Values, metrics, params and inputs are kept as they
are: they are the record.

``python -m orchestrator.track.publish STORE.db OUT.db.gz`` (``make evidence`` runs it).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

from orchestrator.track.tracking import RUN_TAGS, TAG_NAMESPACE

PUBLISHED_SCHEME = "qkstudy-published"


def is_published(artifact_uri: str | None) -> bool:
    """Whether an artifact URI is one ``publish_store`` wrote (its artifacts were not published)."""
    return bool(artifact_uri) and str(artifact_uri).startswith(f"{PUBLISHED_SCHEME}:")


def publish_store(db: Path, out_gz: Path) -> None:
    """Write ``db`` (a SQLite MLflow store, left unchanged) gzipped to ``out_gz`` with every
    artifact location rewritten (module docstring); ``out_gz`` appears whole or not at all.

    Raises:
        FileNotFoundError: ``db`` does not exist.
        sqlite3.DatabaseError: ``db`` is not an MLflow SQLite store.
    """
    if not db.is_file():
        raise FileNotFoundError(f"no MLflow store at {db}")
    with tempfile.TemporaryDirectory(prefix="qkstudy-publish-") as d:
        copy = Path(d) / "mlflow.db"
        with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)  # a consistent copy even while a reader has it open
        with sqlite3.connect(copy) as con:
            con.execute("UPDATE experiments SET artifact_location = ? || ':/' || name", (PUBLISHED_SCHEME,))
            con.execute(
                "UPDATE runs SET artifact_uri = ? || ':/' || "
                "(SELECT name FROM experiments e WHERE e.experiment_id = runs.experiment_id) || '/' || run_uuid",
                (PUBLISHED_SCHEME,),
            )
            _namespace_run_tags(con)
        with sqlite3.connect(copy) as con:
            con.execute("VACUUM")  # the old paths must not survive in free pages
        tmp = out_gz.with_name(out_gz.name + ".tmp")
        with copy.open("rb") as f, gzip.GzipFile(tmp, "wb", compresslevel=9, mtime=0) as g:
            shutil.copyfileobj(f, g)
        os.replace(tmp, out_gz)


def _namespace_run_tags(con: sqlite3.Connection) -> None:
    """Rename every bare qkstudy run tag to its ``qkstudy.`` name, dropping a bare one whose
    namespaced twin the run already holds (module docstring)."""
    bare = ",".join("?" * len(RUN_TAGS))
    twin = "EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = tags.run_uuid AND t.key = ? || tags.key)"
    con.execute(f"DELETE FROM tags WHERE key IN ({bare}) AND {twin}", (*RUN_TAGS, TAG_NAMESPACE))
    con.execute(f"UPDATE tags SET key = ? || key WHERE key IN ({bare})", (TAG_NAMESPACE, *RUN_TAGS))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m orchestrator.track.publish STORE.db OUT.db.gz")
    publish_store(Path(sys.argv[1]), Path(sys.argv[2]))
