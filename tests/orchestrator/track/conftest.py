"""The real PostgreSQL and MLflow-server fixtures of tests/docker, shared with the track tests.

They live in tests/docker/conftest.py (the deployment tests start them the way
docker/compose.yaml does); a conftest's fixtures reach only its own folder, so this one
loads that module by path and exposes the two session fixtures here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SERVICES = Path(__file__).resolve().parents[2] / "docker" / "conftest.py"
_spec = importlib.util.spec_from_file_location("qkstudy_test_services", _SERVICES)
assert _spec is not None and _spec.loader is not None
_services = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _services  # dataclasses look their module up there
_spec.loader.exec_module(_services)

postgres_server = _services.postgres_server
mlflow_pg_server = _services.mlflow_pg_server
