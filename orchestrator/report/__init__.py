"""qkstudy report: MLflow runs -> sample-efficiency curves, token ratio, verdicts, scaling fits.

Why a package of small modules, one per step of the data flow: query.py reads MLflow in bulk
(SQL tables when the tracking URI is a database, the client API otherwise); curves.py reduces
runs to finals and seed-mean curves; the statistics (DESIGN.md "Token ratio and verdicts")
are solve.py (the monotone log-log solver), interval.py (the seed-paired interval and its
measured coverage), ratio.py (the token ratio and its neighbours), verdict.py with power.py
(seed-paired differences and their power) and scaling.py (fits that refuse what the data
cannot support); gaps.py turns what a partial store lacks into sentences; tables.py,
sections.py, plots.py and render.py present; build.py puts it together and output.py
writes it atomically. Every number can be recomputed from `load_study`'s tidy table;
synthetic.py writes studies with known answers for the tests and the benchmark.
"""

from orchestrator.report.build import build_report
from orchestrator.report.errors import ReportError
from orchestrator.report.query import export_study, load_study

__all__ = ["ReportError", "build_report", "export_study", "load_study"]
