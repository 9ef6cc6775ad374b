"""model package (see module docstrings)."""
