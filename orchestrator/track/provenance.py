"""Provenance: which code, spec, user and environment a study's runs came from.

Gathered once by the driver (the process that runs ``qkstudy run``; for ``qkstudy submit``
the job's driver, inside the uploaded working dir) and written on every run it creates, as
tags set at creation so that a run that fails at once still has them:

- ``mlflow.source.git.commit`` (when known), ``qkstudy.git.dirty`` (``true``/``false``) and
  ``qkstudy.source`` of the code that runs (the folder ``orchestrator`` is imported from,
  ``CODE_ROOT``; the spec's own text is in the spec hash and artifact): ``checkout`` (a git
  checkout), ``upload`` (the working dir ``qkstudy submit`` uploaded; its commit and dirty
  flag were read on the submitting machine, ``SOURCE_ENV``, because the upload carries no
  ``.git``) or ``not a checkout`` (an installed package, no git: no commit);
- ``mlflow.user`` (for a submitted job: the submitting user), ``mlflow.source.type``
  (``LOCAL``, or ``JOB`` inside a Ray job), ``mlflow.source.name`` (the spec's path),
  ``qkstudy.ray_job`` (a submitted job's id);
- ``qkstudy.version`` (the installed ``qkstudy`` distribution), ``qkstudy.python`` and
  ``qkstudy.packages`` (the versions of the packages the numbers depend on);
- ``qkstudy.spec_sha256``: the hash of the resolved spec (the validated study after its
  ``extends`` merge and any overrides: every field, defaults included);
- ``qkstudy.overrides``: JSON list of the command line's ``KEY=VALUE`` overrides of the spec
  (``orchestrator.plan.overrides``; ``[]`` for none), also in ``spec/resolved.yaml``;
- ``mlflow.note.content``: the spec's ``description`` (also the experiment's note).

Two artifacts per run, a few KB each: ``spec/resolved.yaml`` (the spec's path, the files of
its ``extends`` chain with their hashes, the command line's overrides, and the resolved study) and
``provenance/packages.txt`` (every installed distribution, ``name==version``). They go on
each run, not once per study, so a run read alone (``mlflow ui``, an export) says where it
came from. A plug-in variant's code hash is already a ``plugin.*`` param of its runs.

Nothing here enters a run's identity: the planner never sees it.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import importlib.metadata as md
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.plan.spec import Study
from orchestrator.plan.specfile import SpecError, read_layers
from orchestrator.track.lease import JOB_ID_ENV
from orchestrator.track.tracking import redact_uri

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# Set by ``qkstudy submit`` in the job's environment: JSON of ``git_state`` of the uploaded
# folder, read on the submitting machine, plus the submitting user.
SOURCE_ENV = "QKSTUDY_SOURCE"
NOT_A_CHECKOUT, CHECKOUT, UPLOAD = "not a checkout", "checkout", "upload"
COMMIT_TAG, DIRTY_TAG, SOURCE_TAG = "mlflow.source.git.commit", "qkstudy.git.dirty", "qkstudy.source"
SPEC_HASH_TAG, VERSION_TAG, NOTE_TAG = "qkstudy.spec_sha256", "qkstudy.version", "mlflow.note.content"
RESOLVED_ARTIFACT, PACKAGES_ARTIFACT = "spec/resolved.yaml", "provenance/packages.txt"
OVERRIDES_TAG = "qkstudy.overrides"
EARLIER_TAG = "qkstudy.earlier_code"  # a resumed run's code before the current driver's
# The packages a run's numbers depend on, as a tag (every distribution is in the artifact).
KEY_PACKAGES = ("torch", "ray", "deepspeed", "mlflow", "sentencepiece", "pyarrow", "numpy", "pydantic")
GIT_TIMEOUT_S = 10
NOTE_CHARS = 5000  # of a description, as a tag (MLflow caps tag values; the artifact holds it all)
# The folder holding the ``orchestrator`` package that runs: a checkout, or site-packages.
CODE_ROOT = Path(__file__).resolve().parents[2]


def git_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The git checkout holding ``folder``: {"source": "checkout", "commit": HEAD's sha,
    "dirty": True when ``git status --porcelain`` lists anything (modified, staged or
    untracked files)}; {"source": "not a checkout", "commit": None, "dirty": None} when git
    is missing, ``folder`` is not inside a repository, or git fails or hangs. Never raises,
    never writes: ``--no-optional-locks`` keeps ``git status`` off the index, which a user's
    own git may be using at the same time."""
    none = {"source": NOT_A_CHECKOUT, "commit": None, "dirty": None}

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "--no-optional-locks", *args], cwd=folder, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "--verify", "HEAD")
    if not commit or not commit.strip():
        return none
    status = git("status", "--porcelain", "--untracked-files=normal")
    if status is None:
        return none
    return {"source": CHECKOUT, "commit": commit.strip(), "dirty": bool(status.strip())}


def submit_source(folder: str | os.PathLike[str]) -> str:
    """The ``SOURCE_ENV`` value ``qkstudy submit`` passes to a job that uploads ``folder``:
    ``git_state`` of it with source ``upload`` (or ``not a checkout``) and the submitting user."""
    state = git_state(folder)
    if state["source"] == CHECKOUT:
        state["source"] = UPLOAD
    return json.dumps({**state, "user": _user()}, sort_keys=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry (some containers)
        return "unknown"


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def qkstudy_version() -> str:
    """The installed ``qkstudy`` distribution's version; ``unknown`` when it is not installed."""
    return _version("qkstudy") or "unknown"


def installed_packages() -> list[str]:
    """Every installed distribution as ``name==version``, sorted case-insensitively, once each."""
    seen = {(d.metadata["Name"] or "?"): d.version for d in md.distributions()}
    return [f"{n}=={v}" for n, v in sorted(seen.items(), key=lambda kv: kv[0].lower())]


def _redacted(value: Any) -> Any:
    """``value`` with every string passed through ``redact_uri`` (a tracking URI's password)."""
    if isinstance(value, str):
        return redact_uri(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def _file_hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def resolved_spec(study: Study, spec_path: str | os.PathLike[str] | None) -> tuple[dict[str, Any], str]:
    """(the ``spec/resolved.yaml`` mapping: the spec's path, its ``extends`` chain with each
    file's sha256, the command line's overrides and the resolved study; the resolved study's
    sha256). The hash covers the resolved study alone (canonical JSON, overrides applied), so
    the same study from other files or overrides hashes the same."""
    resolved = _redacted(study.model_dump(mode="json"))
    digest = hashlib.sha256(json.dumps(resolved, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    chain: list[dict[str, str]] = []
    if spec_path is not None:
        try:
            chain = [{"file": str(layer.path), "sha256": _file_hash(Path(layer.path))} for layer in read_layers(Path(spec_path))]
        except SpecError:
            chain = [{"file": str(spec_path), "sha256": _file_hash(Path(spec_path))}]
    overrides = _redacted(list(getattr(study, "overrides", [])))  # the command line's KEY=VALUE, in order
    doc = {"spec": None if spec_path is None else str(spec_path), "extends_chain": chain, "overrides": overrides, "resolved": resolved}
    return doc, digest


@dataclasses.dataclass(frozen=True)
class Provenance:
    """What ``gather`` found: ``tags`` for every run, ``artifacts`` (MLflow path -> text) for
    every run, ``note`` for the experiment (the spec's description, "" for none)."""

    tags: dict[str, str]
    artifacts: dict[str, str]
    note: str = ""

    @property
    def code(self) -> str:
        """``<commit>``, ``<commit> (dirty)`` or ``not a checkout``: this driver's code in words."""
        return code_words(self.tags)


def code_words(tags: Mapping[str, str]) -> str:
    """A run's code from its tags: ``<commit>``, ``<commit> (dirty)``, or ``not recorded``."""
    commit = tags.get(COMMIT_TAG)
    if not commit:
        return tags.get(SOURCE_TAG) or "not recorded"
    return commit + (" (dirty)" if tags.get(DIRTY_TAG) == "true" else "")


def gather(
    study: Study | None,
    spec_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    code_root: str | os.PathLike[str] = CODE_ROOT,
) -> Provenance:
    """Provenance of a driver about to create ``study``'s runs (module docstring).

    ``spec_path``: the spec the study was read from (its ``extends`` chain is read again for the
    artifact). ``study`` None (``qkstudy train RUN.yaml``: one planned run, no spec): no spec
    hash, note or ``spec/resolved.yaml``. ``code_root``: where git looks for the code's commit.
    ``env``: the environment (default ``os.environ``); ``SOURCE_ENV`` in it (a submitted job)
    gives the commit, dirty flag and user read where the job was submitted.

    Raises:
        ValueError: ``SOURCE_ENV`` is set but not a JSON object.
    """
    env = os.environ if env is None else env
    job = env.get(JOB_ID_ENV)
    if env.get(SOURCE_ENV):
        try:
            state = json.loads(env[SOURCE_ENV])
        except json.JSONDecodeError as e:
            raise ValueError(f"{SOURCE_ENV} is not JSON: {e}") from None
        if not isinstance(state, dict):
            raise ValueError(f"{SOURCE_ENV} is not a JSON object: {env[SOURCE_ENV][:200]!r}")
    else:
        state = {**git_state(code_root), "user": _user()}
    versions = {n: v for n in KEY_PACKAGES if (v := _version(n))}
    tags = {
        SOURCE_TAG: str(state.get("source") or NOT_A_CHECKOUT),
        "mlflow.user": str(state.get("user") or _user()),
        "mlflow.source.type": "JOB" if job or env.get(SOURCE_ENV) else "LOCAL",
        "mlflow.source.name": str(spec_path) if spec_path is not None else "qkstudy",
        VERSION_TAG: qkstudy_version(),
        "qkstudy.python": platform.python_version(),
        "qkstudy.packages": " ".join(f"{n}=={v}" for n, v in versions.items()),
    }
    if state.get("commit"):
        tags[COMMIT_TAG] = str(state["commit"])
        tags[DIRTY_TAG] = "true" if state.get("dirty") else "false"
    if job:
        tags["qkstudy.ray_job"] = job
    artifacts = {PACKAGES_ARTIFACT: "\n".join(installed_packages()) + "\n"}
    if study is None:
        return Provenance(tags=tags, artifacts=artifacts)
    doc, tags[SPEC_HASH_TAG] = resolved_spec(study, spec_path)
    tags[OVERRIDES_TAG] = json.dumps(doc["overrides"])[:5000]  # redacted there (a tracking_uri=... override)
    artifacts[RESOLVED_ARTIFACT] = yaml.safe_dump(doc, sort_keys=False)
    note = redact_uri(study.description)[:NOTE_CHARS]  # free text may quote a URI with its password
    if note:
        tags[NOTE_TAG] = note
    return Provenance(tags=tags, artifacts=artifacts, note=note)


def resume_tags(old: Mapping[str, str], prov: Provenance) -> dict[str, str]:
    """Tags a resumed run gets: the current driver's provenance (the code that trains it now),
    and, when the run's earlier code differs, that code appended to ``EARLIER_TAG`` (so a run
    trained by two commits says so)."""
    out = dict(prov.tags)
    before, now = code_words(old), code_words(prov.tags)
    if before != now and before != "not recorded":
        earlier = [c for c in old.get(EARLIER_TAG, "").split(", ") if c]
        out[EARLIER_TAG] = ", ".join([*earlier, before] if before not in earlier else earlier)[:5000]
    elif EARLIER_TAG in old:
        out[EARLIER_TAG] = old[EARLIER_TAG]
    return out


def log_artifacts(client: MlflowClient, mlflow_run_id: str, prov: Provenance) -> str | None:
    """Write ``prov.artifacts`` to a run; None when done, else why not (an artifact store this
    process cannot write: the run still trains, its tags still say where it came from)."""
    from mlflow.exceptions import MlflowException

    try:
        for path, text in prov.artifacts.items():
            client.log_text(mlflow_run_id, text, path)
    except (MlflowException, OSError) as e:
        return redact_uri(f"{type(e).__name__}: {e}")[:500]
    return None


def set_experiment_note(client: MlflowClient, experiment_id: str, prov: Provenance) -> None:
    """The spec's description as the experiment's note (``mlflow.note.content``); nothing without one."""
    if prov.note:
        client.set_experiment_tag(experiment_id, NOTE_TAG, prov.note)
