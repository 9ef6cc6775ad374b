"""One retry setting for every MLflow HTTP call a study makes: the driver, its local Ray
workers and the workers of a submitted job on a cluster.

Why: MLflow's client retries each request itself (``MLFLOW_HTTP_REQUEST_*``, read per
request). Its defaults (7 retries, backoff factor 2, 120 s timeout) block one call for ~4
minutes, while the CLI used 2 retries / 30 s so that an unreachable server fails in seconds;
a cluster job's workers, which do not inherit the driver's environment, got the defaults.
Now each request fails within ~seconds everywhere and the long wait belongs to the caller
that can keep its data meanwhile: the run's ``MetricBuffer`` keeps points and retries with
backoff for ``QKSTUDY_MLFLOW_OUTAGE_S`` (``track.metric_buffer``). A value a user set wins.
No MLflow import: the CLI calls this at start-up.
"""

from __future__ import annotations

import os

__all__ = ["MLFLOW_HTTP_ENV", "OUTAGE_ENV", "apply_http_env", "forwarded_http_env"]

# Per request: 2 retries with backoff 1 s then 2 s (urllib3: factor * 2^(n-1), none before
# the first retry), each try waiting at most 30 s for an answer.
MLFLOW_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}
OUTAGE_ENV = "QKSTUDY_MLFLOW_OUTAGE_S"  # how long a run rides out a tracking server that takes no writes


def apply_http_env() -> None:
    """Set `MLFLOW_HTTP_ENV` in this process's environment where the user set nothing."""
    for k, v in MLFLOW_HTTP_ENV.items():
        os.environ.setdefault(k, v)


def forwarded_http_env() -> dict[str, str]:
    """The retry settings (and ``OUTAGE_ENV`` when set) as this process has them, for a
    cluster job's ``runtime_env.env_vars``: its workers then use the driver's values."""
    out = {k: os.environ.get(k, v) for k, v in MLFLOW_HTTP_ENV.items()}
    if os.environ.get(OUTAGE_ENV):
        out[OUTAGE_ENV] = os.environ[OUTAGE_ENV]
    return out
