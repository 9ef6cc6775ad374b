"""``qkstudy eval`` and ``qkstudy sample``: a finished run's final weights, used again.

Both find the run in the study's MLflow store (RUN: its planned run id or a unique prefix of
it, its MLflow run name, or its MLflow run id), load the final weights it logged
(``orchestrator.run.final_weights``: verified against the digest in the tracking store, loaded
weights-only, no DeepSpeed) and run on CPU. Registered by ``cli.py`` under its input-error
wrapper: a ``FinalWeightsError`` (no weights, a changed file) exits with code 2 like every
input error. Imports are lazy: ``cli.py`` imports this module on every command.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer


def find_run(tracking_uri: str, study: str, run: str) -> Any:
    """The study's training run named by ``run`` (see the module doc).

    Raises:
        orchestrator.track.status.StudyNotFound: no such study, or no (or more than one) run matches.
    """
    from orchestrator.track.status import StudyNotFound
    from orchestrator.track.tracking import client_for, find_train_runs, sqlite_path

    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        raise StudyNotFound(f"study {study!r}: no MLflow store at {db} (has it run? else pass --tracking-uri)")
    client = client_for(tracking_uri)
    exp = client.get_experiment_by_name(study)
    if exp is None:
        raise StudyNotFound(f"study {study!r}: no such experiment in the MLflow store")
    runs = find_train_runs(client, exp.experiment_id)
    exact = [r for rid, r in runs.items() if run in (rid, r.info.run_name, r.info.run_id)]
    hits = exact or [r for rid, r in runs.items() if rid.startswith(run)]
    if len(hits) != 1:
        names = ", ".join(sorted(f"{r.info.run_name} ({rid})" for rid, r in runs.items())[:12])
        what = "matches more than one run" if hits else "matches no run"
        raise StudyNotFound(f"study {study!r}: RUN {run!r} {what}; give a run id, run name or MLflow run id: {names}")
    return hits[0]


def _load(study: str, run: str, tracking_uri: str | None) -> tuple[Any, Any]:
    """(the MLflow run, its ``LoadedRun``)."""
    from orchestrator.run.final_weights import load_run
    from orchestrator.track.status import study_uri

    name, uri = study_uri(study, tracking_uri)
    record = find_run(uri, name, run)
    return record, load_run(uri, record.info.run_id)


def eval_cmd(
    study: str = typer.Argument(..., help="Study name or spec path."),
    run: str = typer.Argument(..., help="Run id (or a unique prefix), run name, or MLflow run id."),
    corpus: Path | None = typer.Option(None, "--corpus", help="A prepared corpus folder (`qkstudy data prepare`; default: the run's own)."),
    max_windows: int | None = typer.Option(
        None,
        "--max-windows",
        min=1,
        help="Evaluate the first N fixed val windows (default: all). The spec's eval.final_max_windows reproduces final/val_loss.",
    ),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default: MLFLOW_TRACKING_URI, else the study's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Load a finished run's final weights and evaluate them: mean val loss over a corpus's fixed windows."""
    from data_pipeline import TokenLoader
    from orchestrator.run.final_weights import evaluate
    from orchestrator.track.tracking import run_tag

    path = str(corpus) if corpus else None
    record, loaded = _load(study, run, tracking_uri)
    loss = evaluate(loaded, path, max_windows)
    data = path or loaded.data_path
    windows = len(TokenLoader(data, "val", loaded.seq_len, 1, 0).eval_windows(max_windows))
    out = {
        "run": record.info.run_name,
        "run_id": run_tag(record.data.tags, "run_id"),
        "mlflow_run_id": record.info.run_id,
        "corpus": data,
        "windows": windows,
        "val_loss": loss,
        "val_ppl": math.exp(min(loss, 50.0)),
        "recorded_final_val_loss": record.data.metrics.get("final/val_loss"),
    }
    if as_json:
        print(json.dumps(out, indent=2))
        return
    rec = out["recorded_final_val_loss"]
    print(
        f"{out['run']}: val_loss {loss:.6f} (ppl {out['val_ppl']:.3f}) over {windows} windows of {data}"
        + (f"; the run logged final/val_loss {rec:.6f}" if rec is not None else "")
    )


def sample_cmd(
    study: str = typer.Argument(..., help="Study name or spec path."),
    run: str = typer.Argument(..., help="Run id (or a unique prefix), run name, or MLflow run id."),
    prompt: str = typer.Option(..., "--prompt", help="Text to continue (encoded with the corpus's tokenizer)."),
    n: int = typer.Option(64, "-n", min=0, help="Tokens to generate."),
    temperature: float = typer.Option(1.0, min=0.0, help="0: greedy."),
    top_k: int | None = typer.Option(None, "--top-k", min=1, help="Sample among the K likeliest tokens."),
    seed: int = typer.Option(0, help="Sampling seed."),
    corpus: Path | None = typer.Option(None, "--corpus", help="Prepared corpus whose tokenizer to use (default: the run's)."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default: MLFLOW_TRACKING_URI, else the study's)."),
) -> None:
    """Load a finished run's final weights and continue a prompt; prints prompt + N new tokens."""
    from orchestrator.run.final_weights import sample_text

    _, loaded = _load(study, run, tracking_uri)
    print(sample_text(loaded, prompt, n, str(corpus) if corpus else None, temperature=temperature, top_k=top_k, seed=seed))


def register(app: typer.Typer, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Add ``eval`` and ``sample`` to ``app``, each under ``wrap`` (cli.py's input-error wrapper)."""
    app.command("eval")(wrap(eval_cmd))
    app.command("sample")(wrap(sample_cmd))
