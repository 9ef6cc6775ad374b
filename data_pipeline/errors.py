"""The one error type the data pipeline raises for bad input."""


class DataError(ValueError):
    """Bad corpus, tokenizer or loader input.

    The message always names the source (``source 'text' (docs/a.txt)``), file, column or field
    at fault, so the CLI can print it as is and exit with code 2. Subclass of ValueError so
    callers that validate configs can catch both alike.
    """
