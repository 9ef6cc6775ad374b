"""How the ``qkstudy`` commands fail: exit codes, the product's input errors, redacted messages.

Any input error (bad spec, bad data source, bad address, unknown study) prints one line per
problem to stderr and exits with code 2 before Ray starts or MLflow is touched; a cluster or
tracking server that does not answer exits with 1. ``input_errors`` is the one place that maps
them, and every line printed goes through ``orchestrator.track.tracking.redact_uri``.
"""

from __future__ import annotations

import functools
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
)


def loaded_input_errors() -> tuple[type[Exception], ...]:
    """The `INPUT_ERRORS` classes of the modules imported so far: an error of a module that
    never ran cannot have been raised, and importing the module only to name its error would
    import Ray, MLflow or torch with it."""
    return tuple(getattr(sys.modules[m], name) for m, name in INPUT_ERRORS if m in sys.modules)


def input_errors(fn):
    """Turn the product's input errors into a clear message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConnectionError as e:  # a cluster or tracking server that does not answer
            print_error(str(e))
            raise typer.Exit(EXIT_FAILED) from None
        except Exception as e:
            if not isinstance(e, loaded_input_errors()):
                raise
            print_error(str(e))
            raise typer.Exit(EXIT_INPUT) from None

    return wrapper
