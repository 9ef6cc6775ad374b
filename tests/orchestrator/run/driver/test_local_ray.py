"""A local Ray started by the driver: no dashboard unless asked (it costs seconds per start)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import driver_env

PROBE = (
    "import ray; from orchestrator.run.driver.runner import init_ray; init_ray(); "
    "from ray._private.worker import get_dashboard_url; print('URL=' + (get_dashboard_url() or '')); ray.shutdown()"
)


def _dashboard_url(**env: str) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE], env=driver_env(**env), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return next(line for line in out.stdout.splitlines() if line.startswith("URL="))[4:]


@pytest.mark.slow
def test_local_ray_starts_without_a_dashboard_unless_asked():
    assert _dashboard_url(QKSTUDY_RAY_DASHBOARD="") == ""  # not this shell's setting: the default
    assert _dashboard_url(QKSTUDY_RAY_DASHBOARD="1").startswith("127.0.0.1:")  # the control: asked for, it is there
