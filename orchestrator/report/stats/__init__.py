"""The report's statistics: pure functions of a study's run and metric tables.

Curves and finals (``curves``), intervals and token ratios at equal perplexity
(``interval``, ``ratio``, ``solve``), paired verdicts and power (``verdict``, ``power``),
currencies and paired curves (``currencies``, ``paired_curve``), scaling fits
(``scaling``), recall crossings (``recall``) and the paper's claims (``claims``, ``paper``).
Nothing here reads MLflow, writes a file or draws: ``report.query`` reads, ``report.build``
writes, ``report.parts`` and ``report.sections`` present, so every number can be recomputed
from two DataFrames (tests/test_structure.py keeps the package apart).
"""
