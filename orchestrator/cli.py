"""The ``qkstudy`` command line.

Every command that reads a spec validates it first; any input error (bad spec, bad data
source, unknown study) prints one line per problem to stderr and exits with code 2 before
Ray starts or MLflow is touched.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

# MLflow announces every new SQLite store at INFO; the CLI prints what matters itself.
logging.getLogger("mlflow").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)
# An unreachable tracking server fails in seconds, not after minutes of silent retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Compute-matched scaling studies of attention variants.")
data_app = typer.Typer(no_args_is_help=True, help="Prepare corpora into token shards.")
model_app = typer.Typer(no_args_is_help=True, help="Inspect model presets and variants.")
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")

# Wide tables when piped (CI logs, `| less`); the terminal width otherwise.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

EXIT_INPUT = 2


def redact_uri(uri: str) -> str:
    """Credentials in a URI never reach the terminal (see orchestrator.run.security)."""
    from orchestrator.run.security import redact_uri as _redact

    return _redact(uri)


def _input_errors(fn):
    """Turn the product's input errors into a clear message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from data_pipeline import DataError
        from orchestrator.plan.planner import PlanError
        from orchestrator.plan.spec import SpecError
        from orchestrator.run.runner import CorpusError
        from orchestrator.run.security import InsecureAddressError
        from orchestrator.track.status import StudyNotFound

        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            for line in str(e).splitlines():
                err.print(f"[red]error[/]: {escape(line)}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INPUT)
        except (PlanError, DataError, CorpusError, InsecureAddressError, StudyNotFound, _report_error()) as e:
            err.print(f"[red]error[/]: {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INPUT)
        except ConnectionError as e:  # a cluster or tracking server that does not answer
            err.print(f"[red]error[/]: {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1)

    return wrapper


def _report_error():
    try:
        from orchestrator.report import ReportError

        return ReportError
    except ImportError:  # report package not importable: nothing of its kind to catch
        return LookupError


def _load(spec: Path):
    from orchestrator.plan.spec import load_spec

    return load_spec(spec)


def _study_uri(study: str, tracking_uri: str | None) -> tuple[str, str]:
    """(study name, tracking URI) from a spec path or a study name."""
    p = Path(study)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        s = _load(p)
        return s.name, tracking_uri or s.resolved_tracking_uri
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path('runs') / study / 'mlflow.db').resolve()}"
    return study, uri


@app.command()
@_input_errors
def validate(spec: Path = typer.Argument(..., help="Study spec (YAML).")) -> None:
    """Validate a spec; print every error with its file and field path (exit code 2)."""
    from orchestrator.plan.planner import plan

    s = _load(spec)
    runs = plan(s)  # a spec that cannot be planned is not valid either
    n = lambda k, word: f"{k} {word}{'' if k == 1 else 's'}"  # noqa: E731
    out.print(f"{spec}: ok ({s.name}: {n(len(s.scales), 'scale')} x {n(len(s.variants), 'variant')} x "
              f"{n(len(s.seeds), 'seed')}, {n(len(runs), 'run')})")


@app.command()
def schema() -> None:
    """Print the JSON Schema of a study spec."""
    from orchestrator.plan.spec import Study

    print(json.dumps(Study.model_json_schema(), indent=2))


@app.command("plan")
@_input_errors
def plan_cmd(spec: Path = typer.Argument(..., help="Study spec (YAML)."),
             as_json: bool = typer.Option(False, "--json", help="Print the runs as a JSON list."),
             write_runs: Path | None = typer.Option(None, "--write-runs", help="Also write each run as DIR/<run_id>.yaml (for `qkstudy train`).")) -> None:
    """Print the compute-matched runs of a study before anything runs."""
    from orchestrator.plan.planner import plan

    s = _load(spec)
    runs = plan(s)
    if write_runs:
        import yaml

        from orchestrator.plan.spec import SpecError

        if write_runs.exists() and not write_runs.is_dir():
            raise SpecError(write_runs, [("", "--write-runs needs a folder, and this is a file")])
        write_runs.mkdir(parents=True, exist_ok=True)
        for r in runs:
            tmp = write_runs / f".{r.run_id}.yaml.tmp"
            tmp.write_text(yaml.safe_dump(r.model_dump(mode="json"), sort_keys=False))
            tmp.rename(write_runs / f"{r.run_id}.yaml")
    if as_json:
        rows = [{"run_id": r.run_id, "variant": r.variant, "scale": r.scale, "seed": r.seed, "extend": r.extend,
                 "n_params": r.n_params, "n_params_total": r.n_params_total, "flops_per_token": r.flops_per_token,
                 "tokens": r.tokens, "steps": r.steps, "total_flops": r.total_flops} for r in runs]
        print(json.dumps(rows, indent=2))
        return
    from orchestrator.run.calibrate import throughput_table

    thr = throughput_table(s) or {}
    hours = {r.run_id: device_hours(r, thr) for r in runs}
    t = Table(title=f"{s.name}: {len(runs)} runs, budget mode {s.budget.mode} (N = non-embedding parameters)")
    cols = ["run_id", "variant", "scale", "seed", "extend", "N", "N total", "FLOPs/token", "tokens", "steps", "total FLOPs",
            "est. device-h"]
    for c in cols:
        t.add_column(c, justify="right" if c not in ("run_id", "variant", "scale") else "left")
    for r in runs:
        h = hours[r.run_id]
        t.add_row(r.run_id, r.variant, r.scale, str(r.seed), f"{r.extend:g}", f"{r.n_params:,}", f"{r.n_params_total:,}",
                  f"{r.flops_per_token:,}", f"{r.tokens:,}", f"{r.steps:,}", f"{r.total_flops:.3e}",
                  f"{h:.2f}" if h is not None else "-")
    out.print(t)
    known = [h for h in hours.values() if h is not None]
    est = (f", {sum(known):,.1f} device-hours (throughput from {'the spec' if s.budget.throughput else 'calibration'})"
           if len(known) == len(runs) else " (device-hours: run `qkstudy calibrate SPEC` or declare budget.throughput)")
    out.print(f"total: {sum(r.tokens for r in runs):,} tokens, {sum(r.total_flops for r in runs):.3e} FLOPs" + est)


def device_hours(run, throughput: dict) -> float | None:
    """Device-hours of a run: tokens / (tokens/s of the run) x its devices (GPUs, else CPU
    workers) / 3600; None when the variant's throughput at that scale is unknown."""
    tps = (throughput.get(run.scale) or {}).get(run.variant)
    if not tps:
        return None
    r = run.resources
    devices = r.workers * (r.gpus_per_worker or 1)
    return run.tokens / tps * devices / 3600


@app.command()
@_input_errors
def calibrate(spec: Path = typer.Argument(..., help="Study spec (YAML)."),
              address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
              repeats: int = typer.Option(3, help="Timed repeats per variant (median).")) -> None:
    """Measure tokens/s of every (scale, variant) on the study's hardware (for wallclock budgets)."""
    from orchestrator.run.calibrate import calibrate as measure
    from orchestrator.run.calibrate import save_calibration
    from orchestrator.run.runner import init_ray

    s = _load(spec)
    init_ray(address)
    with err.status("timing optimizer steps of every variant (Ray task per scale)"):
        table = measure(s, repeats=repeats)
    path = save_calibration(s, table)
    t = Table(title=f"{s.name}: tokens/s per run ({s.resources.workers} worker(s))")
    t.add_column("scale")
    for v in s.variants:
        t.add_column(v.name, justify="right")
    for scale, row in table.items():
        t.add_row(scale, *[f"{row[v.name]:,.0f}" for v in s.variants])
    out.print(t)
    err.print(f"wrote {path}")


@app.command()
@_input_errors
def run(spec: Path = typer.Argument(..., help="Study spec (YAML)."),
        address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show worker logs.")) -> None:
    """Run a study: train every planned run not already finished in MLflow."""
    from orchestrator.plan.spec import SpecError, check_local_corpus_paths
    from orchestrator.run.runner import CorpusError, run_study

    s = _load(spec)
    check_local_corpus_paths(s, spec)
    try:
        res = run_study(s, address=address, console=err, verbose=verbose)
    except CorpusError as e:
        raise SpecError(spec, [(f"corpora.{e.corpus_name}" if s.corpora else "corpus", str(e))]) from None
    counts = {}
    for st in res.status.values():
        counts[st] = counts.get(st, 0) + 1
    err.print(f"study {s.name} done in {res.wall_s:.0f} s: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    err.print(f"MLflow: {redact_uri(s.resolved_tracking_uri)} (experiment {s.name})")
    if not res.ok:
        raise typer.Exit(1)


@app.command()
@_input_errors
def train(run_file: Path = typer.Argument(..., help="One run (YAML/JSON written by `qkstudy plan --write-runs`)."),
          tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default runs/<study>/mlflow.db)."),
          storage_path: str | None = typer.Option(None, "--storage", help="Ray Train storage (default runs/<study>/ray)."),
          address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
          verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Train one run, for debugging, on the same code path as `qkstudy run`."""
    import yaml
    from pydantic import ValidationError

    from orchestrator.plan.planner import RunSpec
    from orchestrator.plan.spec import SpecError
    from orchestrator.run.runner import run_runs

    data = None

    if not run_file.is_file():
        raise SpecError(run_file, [("", "no such file")])
    try:
        data = yaml.safe_load(run_file.read_text())
        run_spec = RunSpec.model_validate(data)
    except (yaml.YAMLError, ValidationError) as e:
        if isinstance(data, dict) and {"scales", "variants"} <= set(data):
            raise SpecError(run_file, [("", "this is a study spec, not a run: use `qkstudy run SPEC`, or write "
                                            "its runs with `qkstudy plan SPEC --write-runs DIR` and train one")]) from None
        raise SpecError(run_file, [("", f"not a run spec written by `qkstudy plan --write-runs`: {e}")]) from None
    work = (Path("runs") / run_spec.study).resolve()
    uri = tracking_uri or f"sqlite:///{work / 'mlflow.db'}"
    res = run_runs([run_spec], run_spec.study, uri, storage_path or str(work / "ray"), address=address,
                   console=err, verbose=verbose)
    st = res.status.get(run_spec.run_id)
    err.print(f"{run_spec.run_name}: {st} {res.reasons.get(run_spec.run_id, '')}")
    if not res.ok:
        raise typer.Exit(1)


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
    from orchestrator.report import build_report

    name, uri = _study_uri(study, tracking_uri)
    ref, expected = reference, None
    if Path(study).is_file():  # the plan says which runs are missing
        from orchestrator.plan.planner import plan

        spec = _load(Path(study))
        ref = ref or spec.reference
        expected = [{"variant": r.variant, "scale": r.scale, "seed": r.seed, "extend": r.extend, "corpus": r.corpus_name}
                    for r in plan(spec)]
    target = out_dir or Path("runs") / name / "report"
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
           image: str | None = typer.Option(None, help="Container image for the job (runtime_env image_uri)."),
           allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Allow plain http to a non-loopback host."),
           no_upload: bool = typer.Option(False, "--no-upload", help="Upload nothing: the cluster has this code (its image) and reads SPEC at the same absolute path (shared storage).")) -> None:
    """Send a study to a Ray cluster through the Job Submission API; print the job id."""
    from orchestrator.run.security import InsecureAddressError
    from orchestrator.run.submit import submit as submit_job

    try:
        job_id = submit_job(spec, address, image=image, allow_insecure=allow_insecure, upload=not no_upload)
    except InsecureAddressError as e:
        err.print(f"[red]error[/]: {e}")
        raise typer.Exit(EXIT_INPUT)
    except ValueError as e:
        from orchestrator.plan.spec import SpecError

        if isinstance(e, SpecError):
            raise
        err.print(f"[red]error[/]: {e}")
        raise typer.Exit(EXIT_INPUT)
    print(job_id)


@app.command()
@_input_errors
def status(study: str = typer.Argument(..., help="Study name or spec path."),
           tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
           address: str | None = typer.Option(None, help="Ray dashboard URL: also list the study's Ray jobs."),
           allow_insecure: bool = typer.Option(False, "--allow-insecure"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Each run's state from MLflow (and the study's Ray jobs with --address)."""
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
    t = Table(title=f"{name}: {len(rows)} runs ({redact_uri(uri)})")
    for c in ("run", "run_id", "status", "tokens", "planned", "val ppl", "note"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["run_name"], r["run_id"], r["status"], f"{r['tokens']:,}" if r["tokens"] is not None else "-",
                  f"{r['planned_tokens']:,}" if r["planned_tokens"] else "-",
                  f"{r['val_ppl']:.2f}" if r["val_ppl"] is not None else "-", r["note"])
    out.print(t)
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
    except ValueError as e:
        err.print(f"[red]error[/]: {e}")
        raise typer.Exit(EXIT_INPUT)
    if as_json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            out.print(f"{k:28s} {v:,}" if isinstance(v, int) else f"{k:28s} {v}")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
