"""How the ``qkstudy`` commands fail: exit codes, the product's input errors, redacted messages.

Any input error (bad spec, bad data source, bad address, unknown study) prints one line per
problem to stderr and exits with code 2 before Ray starts or MLflow is touched; a cluster or
tracking server that does not answer exits with 1. ``input_errors`` is the one place that maps
them, and every line printed goes through ``orchestrator.track.tracking.redact_uri``. Errors no
product module raises on purpose end the same way, never in a traceback: a file or folder that
cannot be read or written (the path and the system's reason, exit 2), a file that is not text,
a number out of range (exit 2), a store that is not a database (exit 2) or a database server that fails (exit 1).
"""

from __future__ import annotations

import functools
import sqlite3
import sys

import typer
from rich.console import Console
from rich.markup import escape

# Wide lines when piped (CI logs, `| less`); the terminal width otherwise.
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

EXIT_INPUT = 2  # bad input: nothing ran
EXIT_FAILED = 1  # runs failed, or a cluster / tracking server did not answer


def print_error(message: str) -> None:
    """Print ``message`` to stderr, one ``error:`` line per line, every URI in it redacted."""
    from orchestrator.track.tracking import redact_uri

    for line in message.splitlines() or [""]:
        err.print(f"[red]error[/]: {escape(redact_uri(line))}", highlight=False, soft_wrap=True)


# The product's input errors (exit code 2), each named by the module that defines it.
INPUT_ERRORS = (
    ("orchestrator.plan.specfile", "SpecError"),
    ("orchestrator.plan.contract", "PlanError"),
    ("data_pipeline.errors", "DataError"),
    ("orchestrator.plan.inputs", "CorpusError"),
    ("orchestrator.run.driver.submit", "AddressError"),
    ("orchestrator.run.driver.placement", "ClusterConfigError"),
    ("orchestrator.track.status", "StudyNotFound"),
    ("orchestrator.report.errors", "ReportError"),
    ("orchestrator.track.lease", "LeaseHeld"),
    ("orchestrator.run.final_weights", "FinalWeightsError"),
    ("orchestrator.plan.tracking_uri", "TrackingURIError"),
    ("orchestrator.track.access", "AccessError"),
    ("orchestrator.cli_tables", "PowerInputError"),
)


def loaded_input_errors() -> tuple[type[Exception], ...]:
    """The `INPUT_ERRORS` classes of the modules imported so far: an error of a module that
    never ran cannot have been raised, and importing the module only to name its error would
    import Ray, MLflow or torch with it."""
    return tuple(getattr(sys.modules[m], name) for m, name in INPUT_ERRORS if m in sys.modules)


def system_error(e: BaseException) -> tuple[str, int] | None:
    """(one-line message, exit code) for an error of the system a command met rather than one
    of the product's (``INPUT_ERRORS``), or None when ``e`` is none of them (a bug: it is raised)."""
    if isinstance(e, OSError):  # ConnectionError is handled before, as a server that does not answer
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or e}", EXIT_INPUT
    if isinstance(e, UnicodeDecodeError):
        return f"a file given is not UTF-8 text ({e.reason} at byte {e.start})", EXIT_INPUT
    if isinstance(e, OverflowError):
        return f"a number is out of range ({e}): check the spec's and the options' sizes", EXIT_INPUT
    cause = getattr(e, "orig", e)  # SQLAlchemy wraps the driver's error
    if isinstance(cause, sqlite3.DatabaseError):
        return f"the tracking store cannot be read as an SQLite database ({cause})", EXIT_INPUT
    sqlalchemy = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy is not None and isinstance(e, sqlalchemy.DBAPIError):
        return f"the tracking store's database failed: {cause}", EXIT_FAILED
    return None


def input_errors(fn):
    """Turn the product's input errors into a clear message and exit code 2, and the system's
    errors a command meets into one line and its exit code (`system_error`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConnectionError as e:  # a cluster or tracking server that does not answer
            print_error(str(e))
            raise typer.Exit(EXIT_FAILED) from None
        except Exception as e:
            if isinstance(e, loaded_input_errors()):
                print_error(str(e))
                raise typer.Exit(EXIT_INPUT) from None
            said = system_error(e)
            if said is None:
                raise
            print_error(said[0])
            raise typer.Exit(said[1]) from None

    return wrapper
