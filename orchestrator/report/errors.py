"""The one error type the report raises for bad input (the CLI maps it to exit code 2)."""


class ReportError(ValueError):
    """A study cannot be reported: unknown tracking store, experiment missing, or no runs."""
