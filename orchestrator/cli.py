"""The ``qkstudy`` command line: wiring only.

Each command parses its arguments, calls the stage that does the work (``plan/``, ``run/``,
``track/``, ``report/``) and prints the result. Every command that reads a spec validates it
first; any input error (bad spec, bad data source, bad address, unknown study) prints one
line per problem to stderr and exits with code 2 before Ray starts or MLflow is touched
(``cli_errors.input_errors`` is the one place that maps them). Every URI printed, error messages
included, goes through ``orchestrator.track.tracking.redact_uri``.

A command imports what it needs when it runs, nothing at module level: ``qkstudy validate``
should answer at once, and torch, MLflow, Ray and pandas each take a second or several to
import (``python -m benchmarks.cli_latency`` measures the commands; ``test_cli_imports``
checks which heavy modules the light ones load).

The cluster job commands (``submit``, ``logs``, ``stop``) live in ``cli_cluster.py``, ``eval`` and
``sample`` in ``cli_weights.py``; both are registered here.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from orchestrator.cli_access import register as register_access_commands
from orchestrator.cli_cluster import OVERRIDES_HELP, jobs_dashboard
from orchestrator.cli_cluster import register as register_cluster_commands
from orchestrator.cli_errors import EXIT_FAILED, EXIT_INPUT, err, input_errors, print_error
from orchestrator.cli_weights import register as register_weight_commands
from orchestrator.track.http_env import apply_http_env

# MLflow announces every new SQLite store at INFO; the CLI prints what matters itself.
logging.getLogger("mlflow").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)
# An unreachable tracking server fails a request in seconds, not after minutes of silent
# retries; runs ride out an outage in their metric buffer instead (track.http_env).
apply_http_env()

# A traceback never lists local variables: they hold tracking URIs with their passwords.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    help="Compute-matched scaling studies of attention variants.",
)
data_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Prepare corpora into token shards.")
model_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Inspect model presets and variants.")
app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")

# Wide tables when piped (CI logs, `| less`); the terminal width otherwise.
out = Console(width=None if sys.stdout.isatty() else 200)

# What the measuring commands (`model info`, `model check`) accept: they build the model and run
# it, so a length or vocabulary past these only fails in the allocator.
MAX_SEQ_LEN = 8192
MAX_VOCAB = 1 << 20  # data_pipeline.TokenizerConfig's bound
MAX_SEED = 2**63 - 1  # torch.manual_seed's range, as a spec's seeds (orchestrator.plan.spec.MAX_SEED)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"qkstudy {version('qkstudy')}")
        except PackageNotFoundError:
            print("qkstudy unknown (not installed)")
        raise typer.Exit()


@app.callback()
def _main(
    _version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Compute-matched scaling studies of attention variants."""


def _load(spec: Path, overrides: list[str] | None = None):
    """The spec, merged over its bases, with the command line's ``KEY=VALUE`` overrides set over
    it (``orchestrator.plan.overrides``); SpecError (exit 2) names the file or override at fault."""
    from orchestrator.plan.spec import load_spec

    return load_spec(spec, overrides or ())


def _spec_error(spec: Path, problems: list[tuple[str, str]], s):
    """The SpecError of problems found after loading, naming the override that set a bad field."""
    from orchestrator.plan.overrides import spec_error

    return spec_error(str(spec), problems, s.overrides)


def _planned(study, spec: Path):
    """The study's runs (``orchestrator.plan.inputs.plan_here``), warning of unreadable corpora."""
    from orchestrator.plan.inputs import plan_here

    return plan_here(study, warn=lambda w: err.print(f"[yellow]warning[/]: {escape(w)}"), path=spec)


def _study_uri(study: str, tracking_uri: str | None) -> tuple[str, str]:
    """(study name, tracking URI) from a spec path or a study name (``track.status.study_uri``)."""
    from orchestrator.track.status import study_uri

    return study_uri(study, tracking_uri)


@app.command()
@input_errors
def validate(
    spec: Path = typer.Argument(..., help="Study spec (YAML)."),
    overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP, show_default=False),
    data_elsewhere: bool = typer.Option(
        False, "--data-elsewhere", help="The corpus files are where the study runs (a cluster), not here: do not read them."
    ),
) -> None:
    """Validate a spec; print every error with its file and field path (exit code 2).

    The corpus files are read where they stand: missing or empty paths, binary content and a
    vocabulary the text cannot fill are refused (`--data-elsewhere`: said, not checked)."""
    from orchestrator.plan.inputs import fit_problems
    from orchestrator.plan.paths import data_problems
    from orchestrator.plan.tune_plan import tuning_problems
    from orchestrator.track.tracking import redact_uri  # an override may hold a URI with its password

    s = _load(spec, overrides)
    if data_elsewhere:
        err.print("[yellow]note[/]: corpus files not read (--data-elsewhere): `qkstudy run` checks them where the study runs")
    elif problems := data_problems(s):  # nothing that cannot train passes
        raise _spec_error(spec, problems, s)
    runs = _planned(s, spec)  # a spec that cannot be planned is not valid either
    problems = fit_problems(s, runs)  # nor one whose runs its data or devices cannot support
    problems += tuning_problems(s, runs)  # nor tuning runs too short to rank learning rates
    if problems:
        raise _spec_error(spec, problems, s)
    n = lambda k, word: f"{k} {word}{'' if k == 1 else 's'}"  # noqa: E731
    out.print(  # the user's text is never read as console markup: `variants=[standard,coupled]` is a tag to rich
        escape(f"{redact_uri(' '.join([str(spec), *s.overrides]))}: ok ({s.name}: {n(len(s.scales), 'scale')} x ")
        + escape(f"{n(len(s.variants), 'variant')} x {n(len(s.seeds), 'seed')}, {n(len(runs), 'run')})")
    )


@app.command()
def schema() -> None:
    """Print the JSON Schema of a study spec."""
    from orchestrator.plan.spec import Study
    from orchestrator.plan.spec_schema import file_schema

    print(json.dumps(file_schema(Study), indent=2))


@app.command("plan")
@input_errors
def plan_cmd(
    spec: Path = typer.Argument(..., help="Study spec (YAML)."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs as a JSON list."),
    write_runs: Path | None = typer.Option(None, "--write-runs", help="Also write each run as DIR/<run_id>.yaml (for `qkstudy train`)."),
    seed_sd: float | None = typer.Option(
        None, "--seed-sd", min=0, help="Declared std of an arm's final loss across seeds (nats): print the smallest gap the study detects."
    ),
    gap: float | None = typer.Option(None, "--gap", min=0, help="With --seed-sd: also print the seeds needed to detect this gap (nats)."),
    overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP, show_default=False),
) -> None:
    """Print the compute-matched runs of a study before anything runs."""
    from orchestrator.cli_files import write_run_files
    from orchestrator.cli_tables import plan_rows, plan_table, power_text, recipe_table
    from orchestrator.plan.epochs import corpus_sizes
    from orchestrator.plan.inputs import fit_problems
    from orchestrator.plan.throughput import throughput_table

    if gap is not None and seed_sd is None:
        print_error("--gap: needs --seed-sd (the seeds a gap needs follow from the seeds' spread)")
        raise typer.Exit(EXIT_INPUT)
    s = _load(spec, overrides)
    power = power_text(len(s.seeds), seed_sd, gap) if seed_sd is not None else ""  # before anything is written
    runs = _planned(s, spec)
    for loc, msg in fit_problems(s, runs):  # shown, not refused: `validate` and `run` refuse them
        err.print(f"[yellow]warning[/]: {loc}: {escape(msg)}")
    table, sizes = throughput_table(s) or {}, corpus_sizes(s, {r.corpus_name: r.data_hash for r in runs})
    # shown before anything is written: a plan that cannot be shown writes no run file
    shown = plan_rows(s, runs, table, sizes) if as_json else [*plan_table(s, runs, table, sizes), recipe_table(runs, s.tune is not None)]
    if write_runs:
        err.print(f"wrote {len(runs)} run file(s) to {write_run_files(write_runs, runs)}", highlight=False)
    if as_json:
        print(json.dumps(shown, indent=2))
        if power:  # stdout stays one JSON document
            err.print(power, highlight=False)
        return
    for part in shown:
        out.print(part)
    if s.tune is not None:  # tuning compute shown apart from the main budget
        from orchestrator.plan.tune_plan import tuning_summary

        out.print(tuning_summary(s, runs))
    if s.gate is not None:  # a gated ladder: the compute if every arm trains, and if every other arm stops at rung 1
        from orchestrator.plan.gate import gate_summary

        out.print(gate_summary(s.gate, s.reference, runs), highlight=False)
    if s.extend:  # the reference's compute under either protocol (branches or independent runs)
        from orchestrator.plan.branch_runs import reference_compute

        out.print(reference_compute(s, runs))
    if power:
        out.print(power, highlight=False)


@app.command()
@input_errors
def calibrate(
    spec: Path = typer.Argument(..., help="Study spec (YAML)."),
    address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
    repeats: int = typer.Option(7, min=1, help="Timed repeats per (scale, variant), interleaved (median)."),
    max_spread: float = typer.Option(0.05, min=0.0, help="Largest (max - min) / median of an entry's repeats."),
    allow_noisy: bool = typer.Option(False, "--allow-noisy", help="Warn, not refuse, when noisy or loaded."),
) -> None:
    """Measure tokens/s of every (scale, variant) on the study's hardware (for wallclock budgets)."""
    from orchestrator.cli_tables import calibration_table
    from orchestrator.run.driver import calibrate as measure
    from orchestrator.run.driver.runner import init_ray

    s = _load(spec)
    init_ray(address)
    with err.status("timing optimizer steps of every (scale, variant), interleaved (one Ray task)"):
        cal = measure.calibrate(s, repeats=repeats)
    measure.judge(cal, max_spread, allow_noisy, warn=lambda p: err.print(f"[yellow]warning[/]: {escape(p)}"))
    path = cal.save(s)
    out.print(calibration_table(s, cal.table))
    err.print(f"wrote {path} ({cal.summary()})")


@app.command()
@input_errors
def run(
    spec: Path = typer.Argument(..., help="Study spec (YAML)."),
    address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show worker logs."),
    wait: bool = typer.Option(False, "--wait", help="If another driver runs this study, wait for it to end, then train what is left."),
    overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP, show_default=False),
) -> None:
    """Run a study: train every planned run not already finished in MLflow."""
    from orchestrator.plan.inputs import FitError
    from orchestrator.plan.paths import check_local_corpus_paths
    from orchestrator.run.driver.prepare_tasks import CorpusError
    from orchestrator.run.driver.runner import DriverOptions
    from orchestrator.run.driver.study import run_study
    from orchestrator.track.provenance import gather
    from orchestrator.track.timeline import Timeline
    from orchestrator.track.tracking import redact_uri, study_tracking_uri

    timeline = Timeline.since_process_start().mark("imports")
    s = _load(spec, overrides)
    check_local_corpus_paths(s, spec)
    decide = None
    if s.gate is not None:  # the gate's numbers are the report's paired contrasts (run never imports report)
        from orchestrator.report import gate

        decide = gate.decide
    try:
        prov = gather(s, spec)  # the code, spec and environment every run records (track.provenance)
        options = DriverOptions(address=address, verbose=verbose, wait=wait, provenance=prov)
        res = run_study(s, options, console=err, timeline=timeline, gate_decider=decide)
    except CorpusError as e:  # the spec's field (or the override that set it) is the one to fix
        raise _spec_error(spec, [(f"corpora.{e.corpus_name}" if s.corpora else "corpus", str(e))], s) from None
    except FitError as e:
        raise _spec_error(spec, e.problems, s) from None
    counts = Counter(res.status.values())
    err.print(f"study {s.name} done in {res.wall_s:.0f} s: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    err.print(f"MLflow: {redact_uri(study_tracking_uri(s))} (experiment {s.name})")
    if not res.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@input_errors
def train(
    run_file: Path = typer.Argument(..., help="One run (YAML/JSON written by `qkstudy plan --write-runs`)."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default runs/<study>/mlflow.db)."),
    storage_path: str | None = typer.Option(None, "--storage", help="Ray Train storage (default runs/<study>/ray)."),
    address: str | None = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else a local Ray)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the workers' logs."),
) -> None:
    """Train one run, for debugging, on the same code path as `qkstudy run`."""
    from orchestrator.cli_files import load_run_file
    from orchestrator.plan.spec import default_workdir
    from orchestrator.plan.tracking_uri import check_tracking_uri
    from orchestrator.run.driver.runner import DriverOptions, run_runs
    from orchestrator.track.provenance import gather
    from orchestrator.track.timeline import Timeline
    from orchestrator.track.tracking import default_tracking_uri

    timeline = Timeline.since_process_start().mark("imports")
    if tracking_uri is not None:
        check_tracking_uri(tracking_uri, "--tracking-uri")
    run_spec = load_run_file(run_file)
    work = default_workdir(run_spec.study)
    res = run_runs(
        [run_spec],
        run_spec.study,
        tracking_uri or default_tracking_uri(work),
        storage_path or str(work / "ray"),
        DriverOptions(address=address, verbose=verbose, provenance=gather(None)),  # no spec: code, user and environment only
        console=err,
        timeline=timeline,
    )
    st = res.status.get(run_spec.run_id)
    err.print(f"{run_spec.run_name}: {st} {res.reasons.get(run_spec.run_id, '')}")
    if not res.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@input_errors
def report(
    study: str = typer.Argument(..., help="Study name or spec path."),
    out_dir: Path | None = typer.Option(None, "--out", help="Output folder (default runs/<study>/report)."),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow URI (default: MLFLOW_TRACKING_URI, else the study's store)."
    ),
    reference: str | None = typer.Option(None, help="Reference variant (default: the spec's, else standard)."),
    target_variant: str = typer.Option("coupled", "--target", help="Variant whose token ratio is the headline."),
    corpus: str | None = typer.Option(None, help="Only this corpus (default: one report per corpus)."),
    no_log: bool = typer.Option(False, "--no-log", help="Do not log the report as an MLflow run."),
    as_json: bool = typer.Option(False, "--json", help="Print the per-scale summary as JSON."),
    contrast: list[str] = typer.Option(
        [], "--contrast", help="VARIANT:AGAINST, compared in every currency (repeatable; beside the spec's contrasts)."
    ),
) -> None:
    """Build the study's report from MLflow alone: curves, token ratio, tables, plots."""
    from orchestrator.plan.spec import default_workdir
    from orchestrator.report import build_report

    name, uri = _study_uri(study, tracking_uri)
    ref, expected, pairs = reference, None, [_contrast_pair(c) for c in contrast]
    if Path(study).is_file():  # the plan says which runs are missing
        from orchestrator.track.data_match import plan_against, study_records

        spec = _load(Path(study))
        ref = ref or spec.reference
        pairs = [tuple(p) for p in spec.contrasts] + pairs
        planned, notes = plan_against(spec, study_records(name, uri))  # on the data MLflow's runs used
        for line in notes:
            err.print(f"[yellow]warning[/]: {escape(line)}")
        expected = [
            {"variant": r.variant, "scale": r.scale, "seed": r.seed, "extend": r.extend, "corpus": r.corpus_name, "flops": r.total_flops}
            for r in planned
        ]
    target = out_dir or default_workdir(name) / "report"
    with _progress_line() as progress:
        summary = build_report(
            name,
            uri,
            target,
            reference=ref or "standard",
            target=target_variant,
            log_to_mlflow=not no_log,
            expected=expected,
            corpus=corpus,
            contrasts=pairs,
            progress=progress,
        )
    if as_json:
        print(json.dumps(summary["scales"], indent=2))
    else:
        md = Path(target) / "report.md"
        if md.exists():
            print(md.read_text())
    if summary.get("mlflow_not_logged"):
        err.print(f"[yellow]warning[/]: report {escape(summary['mlflow_not_logged'])} (--no-log skips trying)")
    if not as_json:
        err.print(f"report written to {Path(target).resolve()}")  # last, so it stays on screen


@contextmanager
def _progress_line() -> Iterator[Callable[[str], None]]:
    """A callable told each step of a long command: a spinner showing the current step on a
    terminal, one stderr line per step (with seconds since the start) in a log."""
    t0 = time.monotonic()
    if err.is_terminal:
        with err.status("starting") as spinner:
            yield lambda step: spinner.update(escape(step))
    else:
        yield lambda step: err.print(f"[{time.monotonic() - t0:5.1f} s] {escape(step)}", highlight=False)


def _contrast_pair(text: str) -> tuple[str, str]:
    """'a:b' -> ('a', 'b'); a malformed pair is an input error (exit 2) naming --contrast."""
    a, sep, b = text.partition(":")
    if not (sep and a and b) or ":" in b:
        raise typer.BadParameter(f"{text!r}: give VARIANT:AGAINST, e.g. coupled:uncoupled_mlp", param_hint="--contrast")
    return a, b


@app.command()
@input_errors
def export(
    study: str = typer.Argument(..., help="Study name or spec path."),
    out_file: Path = typer.Option(..., "--out", help="Parquet file to write."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default: MLFLOW_TRACKING_URI, else the study's)."),
    tuning: bool = typer.Option(False, "--tuning", help="Include the LR-tuning runs (column kind: tune)."),
) -> None:
    """Export a study's runs and metric histories from MLflow as one tidy Parquet table (a row
    per run, metric and point; `tokens`: the tokens seen at the point)."""
    from orchestrator.report import export_study

    name, uri = _study_uri(study, tracking_uri)
    export_study(name, uri, out_file, tuning=tuning)
    err.print(f"wrote {out_file}")


@app.command()
@input_errors
def status(
    study: str = typer.Argument(..., help="Study name or spec path."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default: MLFLOW_TRACKING_URI, else the study's)."),
    address: str | None = typer.Option(
        None,
        callback=jobs_dashboard,
        help="Ray dashboard URL: also list the study's Ray jobs (default: RAY_API_SERVER_ADDRESS, else RAY_ADDRESS).",
    ),
    allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Allow plain http to a non-loopback host."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    tuning: bool = typer.Option(True, "--tuning/--no-tuning", help="Also list the study's LR-tuning runs."),
) -> None:
    """Each run's state from MLflow (and the study's Ray jobs with --address)."""
    from orchestrator.cli_tables import status_table
    from orchestrator.track.status import study_lease_line, study_status, tuning_status

    name, uri = _study_uri(study, tracking_uri)
    planned = _load(Path(study)) if Path(study).is_file() else None
    notes: list[str] = []
    rows = study_status(name, uri, planned, warn=notes.append)
    tune_rows = tuning_status(name, uri, planned) if tuning else []
    for line in notes:
        err.print(f"[yellow]warning[/]: {escape(line)}")
    jobs = []
    if address:
        from orchestrator.run.driver.submit import study_jobs

        jobs = study_jobs(address, name, allow_insecure=allow_insecure)
    if as_json:
        print(
            json.dumps(
                {"runs": rows, "tuning": tune_rows, "jobs": jobs, "study_lease": study_lease_line(name, planned), "data_notes": notes},
                indent=2,
                default=str,
            )
        )
        return
    out.print(status_table(name, uri, rows, study_lease_line(name, planned)))
    if tune_rows:
        out.print(status_table(name, uri, tune_rows, title=f"{name}: {len(tune_rows)} LR-tuning runs"))
    for j in jobs:
        out.print(f"ray job {j['job_id']}: {j['status']} {j['message'] or ''}")


register_cluster_commands(app, input_errors)
register_access_commands(app, input_errors)  # qkstudy grant, qkstudy revoke


@data_app.command("prepare")
@input_errors
def data_prepare(
    source: str = typer.Option("stdlib", help="stdlib | text | jsonl | parquet | hf | mixture | mqar"),
    path: str | None = typer.Option(None, help="File, folder, glob or URI of the source."),
    out_dir: str | None = typer.Option(None, "--out", help="Cache root for the prepared shards."),
    vocab_size: int | None = typer.Option(None, min=16, max=MAX_VOCAB, help="Tokenizer vocabulary size."),
    tokenizer_kind: str | None = typer.Option(None, "--tokenizer", help="bpe | unigram."),
    text_column: str | None = typer.Option(None, help="Text column (jsonl / parquet)."),
    document_boundary: str | None = typer.Option(None, help="file | blank_lines | row | wikitext_heading."),
    val_fraction: float | None = typer.Option(None, help="Share of documents held out for validation."),
    max_documents: int | None = typer.Option(None, help="Keep only the first N documents."),
    max_bytes: int | None = typer.Option(None, help="Keep documents up to this many UTF-8 bytes."),
    preset: str | None = typer.Option(None, help="MQAR preset: easy | medium | hard."),
    num_proc: int | None = typer.Option(None, min=1, help="Tokenizer processes (default: all cores)."),
) -> None:
    """Tokenize a corpus into Arrow shards with a manifest (no-op when already prepared)."""
    from data_pipeline.cli_support import prepare_from_args

    opts = {
        "vocab_size": vocab_size,
        "tokenizer_kind": tokenizer_kind,
        "text_column": text_column,
        "document_boundary": document_boundary,
        "val_fraction": val_fraction,
        "max_documents": max_documents,
        "max_bytes": max_bytes,
        "preset": preset,
        "num_proc": num_proc,
    }
    p = prepare_from_args(source, path, out_dir, **{k: v for k, v in opts.items() if v is not None})
    out.print(
        json.dumps(
            {"path": p.path, "content_hash": p.content_hash, "vocab_size": p.vocab_size, "splits": p.manifest.get("splits")},
            indent=2,
            default=str,
        )
    )


@model_app.command("info")
def model_info_cmd(
    preset: str = typer.Option(..., help="Scale preset, e.g. cpu-s or 60m."),
    variant: str = typer.Option("standard", help="Model variant."),
    seq_len: int | None = typer.Option(None, min=1, max=MAX_SEQ_LEN, help="Sequence length (default: the preset's)."),
    vocab_size: int | None = typer.Option(None, min=2, max=MAX_VOCAB, help="Vocabulary size (default: the preset's)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Parameter counts and FLOPs per token: analytic, and measured with FlopCounterMode."""
    from model.info import model_info

    try:
        info = model_info(preset, variant, seq_len=seq_len, vocab_size=vocab_size)
    except ValueError as e:  # model.info's unknown preset / variant / option (not decorated: no Ray, no spec)
        print_error(str(e))
        raise typer.Exit(EXIT_INPUT) from None
    if as_json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            out.print(f"{k:28s} {v:,}" if isinstance(v, int) else f"{k:28s} {v}")


def _option_pairs(pairs: list[str], flag: str = "--option") -> dict[str, Any]:
    """KEY=VALUE strings -> options, each value read as YAML (3 -> int, leapfrog -> str).
    Raises ValueError naming ``flag`` for a pair without ``=`` or a key given twice."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {pair!r}: expected KEY=VALUE, e.g. {flag} {'positions=rope' if flag == '--arch' else 'n_steps=3'}")
        if key in out:  # the last one would win silently
            raise ValueError(f"{flag} {key}= given twice ({out[key]!r}, then {value!r})")
        out[key] = yaml.safe_load(value)
    return out


@model_app.command("check")
def model_check_cmd(
    variant: str = typer.Argument(..., help="Model variant (a built-in, or a plug-in's with --plugin)."),
    preset: str = typer.Option("cpu-xs", help="Scale preset whose shape is checked."),
    seq_len: int | None = typer.Option(None, min=1, max=MAX_SEQ_LEN, help="Sequence length (default: the preset's)."),
    option: list[str] = typer.Option([], "--option", help="A variant option as KEY=VALUE (repeatable)."),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the models compared."),
    plugin: list[str] = typer.Option([], "--plugin", help="A plug-in module to load first, from this folder or installed (repeatable)."),
    arch: list[str] = typer.Option([], "--arch", help="A backbone layout field as KEY=VALUE, e.g. positions=rope (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every check the built-in variants pass, on one variant: stage shapes, finite forward and
    backward with a gradient for every parameter, causality, seeded and paired initial weights,
    analytic counts against the built model, executed FLOPs against FlopCounterMode; on the
    GPT-2 layout or the one `--arch` sets (a spec's `architecture`: RoPE, RMSNorm, ...).
    Exits 1 if a check fails, 2 on an unknown preset, variant, option or layout field."""
    from pydantic import ValidationError

    from model.check import check_variant
    from model.config import Architecture
    from model.plugins import load_entry_points, load_plugin

    try:
        load_entry_points()
        for module in plugin:
            load_plugin(module, Path.cwd(), check=False)  # the table below is the check
        try:
            layout = Architecture(**_option_pairs(arch, "--arch"))
        except ValidationError as e:  # one line per field, named by the option that set it
            raise ValueError("; ".join(f"--arch {'.'.join(map(str, d['loc']))}: {d['msg']}" for d in e.errors())) from None
        results = check_variant(variant, preset, seq_len=seq_len, seed=seed, architecture=layout, **_option_pairs(option))
    except ValueError as e:
        print_error(str(e))
        raise typer.Exit(EXIT_INPUT) from None
    if as_json:
        print(json.dumps([r._asdict() for r in results], indent=2))
    else:
        from rich.table import Table

        table = Table("check", "result", "detail", title=f"{variant} at {preset}")
        for r in results:
            table.add_row(r.name, {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "n/a"}[r.ok], escape(r.detail))
        out.print(table)
    if any(r.ok is False for r in results):
        raise typer.Exit(EXIT_FAILED)


register_weight_commands(app, input_errors)  # qkstudy eval, qkstudy sample

if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
