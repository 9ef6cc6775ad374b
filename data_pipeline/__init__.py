"""data_pipeline package (see module docstrings)."""
