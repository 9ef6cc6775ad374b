"""The ``qkstudy`` command line: wiring only.

Each command parses its arguments, calls the stage that does the work (``plan/``, ``run/``,
``track/``, ``report/``) and prints the result. Every command that reads a spec validates it
first; any input error (bad spec, bad data source, bad address, unknown study) prints one
line per problem to stderr and exits with code 2 before Ray starts or MLflow is touched
(``_input_errors`` is the one place that maps them). Every URI printed, error messages
included, goes through ``orchestrator.track.tracking.redact_uri``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

# MLflow announces every new SQLite store at INFO; the CLI prints what matters itself.
logging.getLogger("mlflow").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)
# An unreachable tracking server fails in seconds, not after minutes of silent retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")

# A traceback never lists local variables: they hold tracking URIs with their passwords.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Compute-matched scaling studies of attention variants.")
data_app = typer.Typer(no_args_is_help=True, help="Prepare corpora into token shards.")
model_app = typer.Typer(no_args_is_help=True, help="Inspect model presets and variants.")
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")

# Wide tables when piped (CI logs, `| less`); the terminal width otherwise.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

EXIT_INPUT = 2  # bad input: nothing ran
EXIT_FAILED = 1  # runs failed, or a cluster / tracking server did not answer


def _print_error(message: str) -> None:
    from orchestrator.track.tracking import redact_uri

    for line in message.splitlines() or [""]:
        err.print(f"[red]error[/]: {escape(redact_uri(line))}", highlight=False, soft_wrap=True)


def _input_errors(fn):
    """Turn the product's input errors into a clear message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from data_pipeline import DataError
        from orchestrator.plan.planner import PlanError
        from orchestrator.plan.spec import SpecError
        from orchestrator.report.errors import ReportError
        from orchestrator.run.data import CorpusError
        from orchestrator.run.submit import AddressError
        from orchestrator.track.status import StudyNotFound

        try:
            return fn(*args, **kwargs)
        except (SpecError, PlanError, DataError, CorpusError, AddressError, StudyNotFound, ReportError) as e:
            _print_error(str(e))
            raise typer.Exit(EXIT_INPUT) from None
        except ConnectionError as e:  # a cluster or tracking server that does not answer
            _print_error(str(e))
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper


def _load(spec: Path):
    from orchestrator.plan.spec import load_spec

    return load_spec(spec)


def _planned(study):
    """The study's runs, planned with its throughput table (declared or calibrated)."""
    from orchestrator.plan.planner import plan
    from orchestrator.plan.throughput import throughput_table

    return plan(study, throughput_table(study))


def _study_uri(study: str, tracking_uri: str | None) -> tuple[str, str]:
    """(study name, tracking URI) from a spec path or a study name."""
    from orchestrator.track.tracking import named_study_uri, study_tracking_uri

    p = Path(study)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        s = _load(p)
        return s.name, tracking_uri or study_tracking_uri(s)
    return study, named_study_uri(study, tracking_uri)


@app.command()
@_input_errors
def validate(spec: Path = typer.Argument(..., help="Study spec (YAML).")) -> None:
    """Validate a spec; print every error with its file and field path (exit code 2)."""
    s = _load(spec)
    runs = _planned(s)  # a spec that cannot be planned is not valid either
    n = lambda k, word: f"{k} {word}{'' if k == 1 else 's'}"  # noqa: E731
    out.print(f"{spec}: ok ({s.name}: {n(len(s.scales), 'scale')} x {n(len(s.variants), 'variant')} x "
              f"{n(len(s.seeds), 'seed')}, {n(len(runs), 'run')})")


@app.command()
def schema() -> None:
    """Print the JSON Schema of a study spec."""
    from orchestrator.plan.spec import Study
    from orchestrator.plan.specfile import file_schema

    print(json.dumps(file_schema(Study), indent=2))


@app.command("plan")
@_input_errors
def plan_cmd(spec: Path = typer.Argument(..., help="Study spec (YAML)."),
             as_json: bool = typer.Option(False, "--json", help="Print the runs as a JSON list."),
             write_runs: Path | None = typer.Option(None, "--write-runs", help="Also write each run as DIR/<run_id>.yaml (for `qkstudy train`).")) -> None:
    """Print the compute-matched runs of a study before anything runs."""
    from orchestrator.plan.throughput import throughput_table

    s = _load(spec)
    runs = _planned(s)
    if write_runs:
        _write_runs(write_runs, runs)
    if as_json:
        rows = [{"run_id": r.run_id, "variant": r.variant, "scale": r.scale, "seed": r.seed, "extend": r.extend,
                 "n_params": r.n_params, "n_params_total": r.n_params_total, "flops_per_token": r.flops_per_token,
                 "tokens": r.tokens, "steps": r.steps, "total_flops": r.total_flops} for r in runs]
        print(json.dumps(rows, indent=2))
        return
    from orchestrator.cli_tables import plan_table

    for part in plan_table(s, runs, throughput_table(s) or {}):
        out.print(part)


def _write_runs(folder: Path, runs) -> None:
    """Each run as ``folder/<run_id>.yaml`` (temp file, then rename)."""
    import yaml

    from orchestrator.plan.spec import SpecError

    if folder.exists() and not folder.is_dir():
        raise SpecError(folder, [("", "--write-runs needs a folder, and this is a file")])
    folder.mkdir(parents=True, exist_ok=True)
    for r in runs:
        tmp = folder / f".{r.run_id}.yaml.tmp"
        tmp.write_text(yaml.safe_dump(r.model_dump(mode="json"), sort_keys=False))
        tmp.rename(folder / f"{r.run_id}.yaml")


@app.command()
@_input_errors
def calibrate(spec: Path = typer.Argument(..., help="Study spec (YAML)."),
              address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
              repeats: int = typer.Option(3, help="Timed repeats per variant (median).")) -> None:
    """Measure tokens/s of every (scale, variant) on the study's hardware (for wallclock budgets)."""
    from orchestrator.cli_tables import calibration_table
    from orchestrator.plan.throughput import save_calibration
    from orchestrator.run.calibrate import calibrate as measure
    from orchestrator.run.runner import init_ray

    s = _load(spec)
    init_ray(address)
    with err.status("timing optimizer steps of every variant (Ray task per scale)"):
        table = measure(s, repeats=repeats)
    path = save_calibration(s, table)
    out.print(calibration_table(s, table))
    err.print(f"wrote {path}")


@app.command()
@_input_errors
def run(spec: Path = typer.Argument(..., help="Study spec (YAML)."),
        address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show worker logs.")) -> None:
    """Run a study: train every planned run not already finished in MLflow."""
    from orchestrator.plan.spec import SpecError, check_local_corpus_paths
    from orchestrator.run.data import CorpusError
    from orchestrator.run.runner import run_study
    from orchestrator.track.tracking import redact_uri, study_tracking_uri

    s = _load(spec)
    check_local_corpus_paths(s, spec)
    try:
        res = run_study(s, address=address, console=err, verbose=verbose)
    except CorpusError as e:  # the spec's field is the one to fix
        raise SpecError(spec, [(f"corpora.{e.corpus_name}" if s.corpora else "corpus", str(e))]) from None
    counts = Counter(res.status.values())
    err.print(f"study {s.name} done in {res.wall_s:.0f} s: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    err.print(f"MLflow: {redact_uri(study_tracking_uri(s))} (experiment {s.name})")
    if not res.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@_input_errors
def train(run_file: Path = typer.Argument(..., help="One run (YAML/JSON written by `qkstudy plan --write-runs`)."),
          tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default runs/<study>/mlflow.db)."),
          storage_path: str | None = typer.Option(None, "--storage", help="Ray Train storage (default runs/<study>/ray)."),
          address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
          verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Train one run, for debugging, on the same code path as `qkstudy run`."""
    from orchestrator.plan.spec import default_workdir
    from orchestrator.run.runner import run_runs
    from orchestrator.track.tracking import default_tracking_uri

    run_spec = _load_run(run_file)
    work = default_workdir(run_spec.study)
    res = run_runs([run_spec], run_spec.study, tracking_uri or default_tracking_uri(work), storage_path or str(work / "ray"),
                   address=address, console=err, verbose=verbose)
    st = res.status.get(run_spec.run_id)
    err.print(f"{run_spec.run_name}: {st} {res.reasons.get(run_spec.run_id, '')}")
    if not res.ok:
        raise typer.Exit(EXIT_FAILED)


def _load_run(run_file: Path):
    """The RunSpec in a file written by ``plan --write-runs``; SpecError naming the file."""
    import yaml
    from pydantic import ValidationError

    from orchestrator.plan.planner import RunSpec
    from orchestrator.plan.spec import SpecError

    if not run_file.is_file():
        raise SpecError(run_file, [("", "no such file")])
    data = None
    try:
        data = yaml.safe_load(run_file.read_text())
        return RunSpec.model_validate(data)
    except (yaml.YAMLError, ValidationError) as e:
        if isinstance(data, dict) and {"scales", "variants"} <= set(data):
            raise SpecError(run_file, [("", "this is a study spec, not a run: use `qkstudy run SPEC`, or write "
                                            "its runs with `qkstudy plan SPEC --write-runs DIR` and train one")]) from None
        raise SpecError(run_file, [("", f"not a run spec written by `qkstudy plan --write-runs`: {e}")]) from None


@app.command()
@_input_errors
def report(study: str = typer.Argument(..., help="Study name or spec path."),
           out_dir: Path | None = typer.Option(None, "--out", help="Output folder (default runs/<study>/report)."),
           tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default: MLFLOW_TRACKING_URI, else the study's store)."),
           reference: str | None = typer.Option(None, help="Reference variant (default: the spec's, else standard)."),
           target_variant: str = typer.Option("coupled", "--target", help="Variant whose token ratio is the headline."),
           corpus: str | None = typer.Option(None, help="Only this corpus (default: one report per corpus)."),
           no_log: bool = typer.Option(False, "--no-log", help="Do not log the report as an MLflow run."),
           as_json: bool = typer.Option(False, "--json", help="Print the per-scale summary as JSON.")) -> None:
    """Build the study's report from MLflow alone: curves, token ratio, tables, plots."""
    from orchestrator.plan.spec import default_workdir
    from orchestrator.report import build_report

    name, uri = _study_uri(study, tracking_uri)
    ref, expected = reference, None
    if Path(study).is_file():  # the plan says which runs are missing
        spec = _load(Path(study))
        ref = ref or spec.reference
        expected = [{"variant": r.variant, "scale": r.scale, "seed": r.seed, "extend": r.extend, "corpus": r.corpus_name}
                    for r in _planned(spec)]
    target = out_dir or default_workdir(name) / "report"
    summary = build_report(name, uri, target, reference=ref or "standard", target=target_variant,
                           log_to_mlflow=not no_log, expected=expected, corpus=corpus)
    if as_json:
        print(json.dumps(summary["scales"], indent=2))
    else:
        md = Path(target) / "report.md"
        if md.exists():
            print(md.read_text())
        err.print(f"report written to {Path(target).resolve()}")  # last, so it stays on screen


@app.command()
@_input_errors
def export(study: str = typer.Argument(..., help="Study name or spec path."),
           out_file: Path = typer.Option(..., "--out", help="Parquet file to write."),
           tracking_uri: str | None = typer.Option(None, "--tracking-uri")) -> None:
    """Export a study's runs and metric histories from MLflow as one tidy Parquet table."""
    from orchestrator.report import export_study

    name, uri = _study_uri(study, tracking_uri)
    export_study(name, uri, out_file)
    err.print(f"wrote {out_file}")


@app.command()
@_input_errors
def submit(spec: Path = typer.Argument(..., help="Study spec (YAML), inside the current folder."),
           address: str = typer.Option(..., help="Ray dashboard URL, e.g. https://HEAD:8265."),
           allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Allow plain http to a non-loopback host."),
           allow_ephemeral: bool = typer.Option(False, "--allow-ephemeral", help="Submit a spec whose tracking_uri / storage_path default to the job's temporary working dir (lost when it ends)."),
           no_upload: bool = typer.Option(False, "--no-upload", help="Upload nothing: the cluster has this code (its image) and reads SPEC at the same absolute path (shared storage).")) -> None:
    """Send a study to a Ray cluster through the Job Submission API; print the job id."""
    from orchestrator.run.submit import submit as submit_job

    print(submit_job(spec, address, allow_insecure=allow_insecure, allow_ephemeral=allow_ephemeral, upload=not no_upload))


@app.command()
@_input_errors
def status(study: str = typer.Argument(..., help="Study name or spec path."),
           tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
           address: str | None = typer.Option(None, help="Ray dashboard URL: also list the study's Ray jobs."),
           allow_insecure: bool = typer.Option(False, "--allow-insecure"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Each run's state from MLflow (and the study's Ray jobs with --address)."""
    from orchestrator.cli_tables import status_table
    from orchestrator.track.status import study_status

    name, uri = _study_uri(study, tracking_uri)
    planned = _load(Path(study)) if Path(study).is_file() else None
    rows = study_status(name, uri, planned)
    jobs = []
    if address:
        from orchestrator.run.submit import study_jobs

        jobs = study_jobs(address, name, allow_insecure=allow_insecure)
    if as_json:
        print(json.dumps({"runs": rows, "jobs": jobs}, indent=2, default=str))
        return
    out.print(status_table(name, uri, rows))
    for j in jobs:
        out.print(f"ray job {j['job_id']}: {j['status']} {j['message'] or ''}")


@app.command()
@_input_errors
def logs(job_id: str = typer.Argument(..., help="Ray job id printed by `qkstudy submit`."),
         address: str = typer.Option(..., help="Ray dashboard URL."),
         follow: bool = typer.Option(True, "--follow/--no-follow", help="Keep printing until the job ends."),
         allow_insecure: bool = typer.Option(False, "--allow-insecure")) -> None:
    """Print (and follow) a submitted job's logs."""
    from orchestrator.run.submit import follow_logs

    for chunk in follow_logs(address, job_id, follow=follow, allow_insecure=allow_insecure):
        sys.stdout.write(chunk)
        sys.stdout.flush()


@data_app.command("prepare")
@_input_errors
def data_prepare(source: str = typer.Option("stdlib", help="stdlib | text | jsonl | parquet | hf | mixture | mqar"),
                 path: str | None = typer.Option(None, help="File, folder, glob or URI of the source."),
                 out_dir: str | None = typer.Option(None, "--out", help="Cache root for the prepared shards."),
                 vocab_size: int | None = typer.Option(None, help="Tokenizer vocabulary size."),
                 tokenizer_kind: str | None = typer.Option(None, "--tokenizer", help="bpe | unigram."),
                 text_column: str | None = typer.Option(None, help="Text column (jsonl / parquet)."),
                 document_boundary: str | None = typer.Option(None, help="file | blank_lines | row | wikitext_heading."),
                 val_fraction: float | None = typer.Option(None, help="Share of documents held out for validation."),
                 max_documents: int | None = typer.Option(None, help="Keep only the first N documents."),
                 max_bytes: int | None = typer.Option(None, help="Keep documents up to this many UTF-8 bytes."),
                 preset: str | None = typer.Option(None, help="MQAR preset: easy | medium | hard."),
                 num_proc: int | None = typer.Option(None, help="Tokenizer processes (default: all cores)."),
                 ) -> None:
    """Tokenize a corpus into Arrow shards with a manifest (no-op when already prepared)."""
    from data_pipeline.cli_support import prepare_from_args

    opts = {"vocab_size": vocab_size, "tokenizer_kind": tokenizer_kind, "text_column": text_column,
            "document_boundary": document_boundary, "val_fraction": val_fraction, "max_documents": max_documents,
            "max_bytes": max_bytes, "preset": preset, "num_proc": num_proc}
    p = prepare_from_args(source, path, out_dir, **{k: v for k, v in opts.items() if v is not None})
    out.print(json.dumps({"path": p.path, "content_hash": p.content_hash, "vocab_size": p.vocab_size,
                          "splits": p.manifest.get("splits")}, indent=2, default=str))


@model_app.command("info")
def model_info_cmd(preset: str = typer.Option(..., help="Scale preset, e.g. cpu-s or 60m."),
                   variant: str = typer.Option("standard", help="Model variant."),
                   seq_len: int | None = typer.Option(None, min=1, help="Sequence length (default: the preset's)."),
                   vocab_size: int | None = typer.Option(None, min=1, help="Vocabulary size (default: the preset's)."),
                   as_json: bool = typer.Option(False, "--json")) -> None:
    """Parameter counts and FLOPs per token: analytic, and measured with FlopCounterMode."""
    from model.info import model_info

    try:
        info = model_info(preset, variant, seq_len=seq_len, vocab_size=vocab_size)
    except ValueError as e:  # model.info's unknown preset / variant / option (not decorated: no Ray, no spec)
        _print_error(str(e))
        raise typer.Exit(EXIT_INPUT) from None
    if as_json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            out.print(f"{k:28s} {v:,}" if isinstance(v, int) else f"{k:28s} {v}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
