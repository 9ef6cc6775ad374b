"""Helpers the test files share: the repository's root, a free loopback port, the CLI as a user
runs it, a driver's environment, the tiny spec every training test starts from, a fresh MLflow
store, and MLflow reads ("every step once, none lost").

Fixtures live in ``tests/fixtures/``; this module holds plain functions and constants only.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.run.ext_lock import extension_roots
from orchestrator.track.tracking import sqlite_uri
from tests.synthetic_study import SyntheticStudy, write_synthetic_study

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
QKSTUDY = BIN / "qkstudy"
SHM_OP = "deepspeed_shm_comm"  # the one op CPU training builds (orchestrator/run/ext_lock.py)
TPS = 8 * 64  # tokens per optimizer step of TINY_SPEC (global batch 8 x seq_len 64)

# The smallest study that trains for real: cpu-xs on 60 stdlib files, BPE 512, 8 x 64 tokens a
# step, 20 steps. Tests override what they vary (``tiny_spec(name, **over)``).
TINY_SPEC = {
    "corpus": {"source": "stdlib", "max_documents": 60},
    "tokenizer": {"vocab_size": 512},
    "scales": ["cpu-xs"],
    "variants": ["standard"],
    "budget": {"mode": "tokens", "tokens": 20 * TPS},
    "train": {"global_batch": 8, "seq_len": 64, "log_every_steps": 1},
    "eval": {"num_evals": 2, "max_windows": 4, "final_max_windows": 8, "diagnostics": False},
}


def one_run_spec(name: str) -> dict:
    """A one-run study (standard, cpu-xs, 10 steps of 8 x 64 tokens) for tests that plan a run
    and write its records, never train it."""
    return {
        "name": name,
        "scales": ["cpu-xs"],
        "variants": ["standard"],
        "tokenizer": {"vocab_size": 512},
        "budget": {"mode": "tokens", "tokens": 10 * 8 * 64},
        "train": {"global_batch": 8, "seq_len": 64},
    }


def tiny_spec(name: str, **over) -> dict:
    """``TINY_SPEC`` named ``name`` with top-level keys replaced by ``over``."""
    return {**TINY_SPEC, "name": name, **over}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver_env(**extra: str) -> dict[str, str]:
    """This environment for a `qkstudy` child that starts its own local Ray (no RAY_ADDRESS)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, **extra}


def qk(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``qkstudy ARGS`` in ``cwd`` (None: this process's) as a user would: a child process in
    ``env`` (None: ``driver_env()``), output captured as text, killed past ``timeout`` s."""
    return subprocess.run(
        [str(QKSTUDY), *args], cwd=cwd, env=driver_env() if env is None else env, capture_output=True, text=True, timeout=timeout
    )


def write_spec(d: Path, name: str, **over) -> Path:
    """``tiny_spec(name, **over)`` written to ``d/NAME.yaml`` (``d`` created); its path."""
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{name}.yaml"
    f.write_text(yaml.safe_dump(tiny_spec(name, **over)))
    return f


def plan_json(spec: Path) -> list[dict]:
    """``qkstudy plan SPEC --json`` run from the spec's folder: one dict per planned run."""
    out = qk("plan", spec.name, "--json", cwd=spec.parent, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def start_driver(spec: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """Start ``qkstudy run SPEC ARGS`` from the spec's folder, in a session of its own (so
    ``reap_driver`` ends whatever it started), stdout and stderr piped as text."""
    return subprocess.Popen(
        [str(QKSTUDY), "run", spec.name, *args],
        cwd=spec.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish_driver(p: subprocess.Popen, timeout: float = 900) -> str:
    """Wait for a driver; its stderr. A driver past ``timeout`` (s) is killed with its session and
    AssertionError raised with the tail of its output."""
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        raise AssertionError(f"driver timed out: {err[-3000:]}") from None
    return err


def reap_driver(p: subprocess.Popen) -> None:
    """End whatever a (killed) driver's session left behind, such as a Ray it started."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def mlflow_store(folder: Path, *synthetic: SyntheticStudy) -> str:
    """The URI of a fresh SQLite MLflow store, ``folder/mlflow.db``, holding the ``synthetic``
    studies (``tests/synthetic_study.py``) written to it in order."""
    uri = sqlite_uri(folder / "mlflow.db")
    for study in synthetic:
        write_synthetic_study(study, uri)
    return uri


def sqlite_client(d: Path, study: str) -> MlflowClient:
    """The client of the embedded store of ``study`` run from folder ``d`` (runs/STUDY/mlflow.db)."""
    return MlflowClient(f"sqlite:///{d / 'runs' / study / 'mlflow.db'}")


def study_runs(d: Path, study: str) -> tuple[MlflowClient, dict[str, object]]:
    """The client of ``study``'s embedded store in ``d`` and its train runs by run_id tag."""
    c = sqlite_client(d, study)
    return c, train_runs(c, study)


def train_runs(client: MlflowClient, study: str, kind: str = "train") -> dict[str, object]:
    """run_id tag -> MLflow run of ``study``'s runs of ``kind`` (train, tune, report, superseded)."""
    exp = client.get_experiment_by_name(study)
    assert exp is not None, f"no experiment {study!r} in {client.tracking_uri}"
    return {r.data.tags["qkstudy.run_id"]: r for r in client.search_runs([exp.experiment_id], f"tags.`qkstudy.kind` = '{kind}'")}


def steps(client: MlflowClient, mlflow_id: str, key: str = "train/loss") -> list[int]:
    """The MLflow steps (tokens seen) at which ``key`` was logged, in logged order."""
    return [m.step for m in client.get_metric_history(mlflow_id, key)]


def history(client: MlflowClient, mlflow_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of every point of ``key``."""
    return [(m.step, m.value) for m in client.get_metric_history(mlflow_id, key)]


def assert_every_step_once(logged: list[int], n_steps: int, tps: int = TPS) -> None:
    """``logged`` (steps in tokens) is each optimizer step 1..n_steps exactly once: none twice,
    none lost. Raises AssertionError naming the repeated and the missing ones."""
    expected = [tps * i for i in range(1, n_steps + 1)]
    repeated = sorted({s for s in logged if logged.count(s) > 1})
    missing = sorted(set(expected) - set(logged))
    assert logged == expected, f"repeated {repeated}, missing {missing}, extra {sorted(set(logged) - set(expected))}"


def built_shm_op() -> Path | None:
    """The folder of the built DeepSpeed shm op (``<op>.so`` in it) under this user's
    torch-extension root (``ext_lock.extension_roots``: ``$TORCH_EXTENSIONS_DIR/<op>`` or
    ``~/.cache/torch_extensions/<tag>/<op>``), or None when it is not built."""
    (root,) = extension_roots()
    for d in [root / SHM_OP, *sorted(root.glob(f"*/{SHM_OP}"))]:
        if (d / f"{SHM_OP}.so").is_file():
            return d
    return None


def write_words_corpus(root: Path) -> None:
    """80 text files of seeded random words under ``root`` (about 400 KB): real-looking lines,
    the same on every machine."""
    rng = np.random.default_rng(7)
    words = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 9))) for _ in range(400)]
    for i in range(80):
        lines = [" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(rng.integers(20, 200))]
        (root / f"doc{i:03d}.txt").write_text("\n".join(lines) + "\n")


def prepared_digest(path: str) -> str:
    """sha256 of a prepared directory: its manifest (less times, paths and hashes that name the
    machine's temp folder) and every file's name and bytes."""
    h = hashlib.sha256()
    m = json.load(open(os.path.join(path, "manifest.json")))
    kept = {k: v for k, v in m.items() if k not in ("created_utc", "timings", "content_hash", "source_hashes", "corpus")}
    h.update(json.dumps(kept, sort_keys=True).encode())
    for f in sorted(os.listdir(path)):
        if f != "manifest.json":
            h.update(f.encode())
            h.update(open(os.path.join(path, f), "rb").read())
    return h.hexdigest()


def tokenization_task_nodes(address: str, prepared: str, timeout_s: float = 60) -> list[str]:
    """Node id of every tokenization task (``prepare_tasks._pool_task``) the cluster at
    ``address`` ran, from Ray's state API, once it lists one per shard of the prepared
    directory ``prepared`` (task events reach it asynchronously, flushed about every second)
    or ``timeout_s`` has passed."""
    from ray.util.state import list_tasks

    manifest = json.loads((Path(prepared) / "manifest.json").read_text())
    shards = sum(len(manifest["splits"][s]["shards"]) for s in ("train", "val"))
    deadline = time.time() + timeout_s
    while True:
        tasks = list_tasks(address=address, filters=[("func_or_class_name", "=", "_pool_task")], detail=True, limit=10000)
        if len(tasks) >= shards or time.time() > deadline:
            return [str(t.node_id) for t in tasks]
        time.sleep(1)
