"""qkstudy report: MLflow runs -> sample-efficiency curves, token ratio, scaling laws.

Why a package of small modules: query.py reads MLflow in bulk (SQL tables when the tracking
URI is a database, the client API otherwise), curves.py reduces runs to finals and seed-mean
curves, ratio.py and scaling.py hold the statistics (DESIGN.md "Token ratio"), plots.py and
render.py draw and write, build.py puts it together atomically and logs the report to MLflow.
Every number can be recomputed from `load_study`'s tidy table.
"""

from orchestrator.report.build import build_report
from orchestrator.report.errors import ReportError
from orchestrator.report.query import export_study, load_study

__all__ = ["ReportError", "build_report", "export_study", "load_study"]
