"""orchestrator package (see module docstrings)."""
