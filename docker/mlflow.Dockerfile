# syntax=docker/dockerfile:1
# MLflow tracking server for the qkstudy stack: basic-auth app, Postgres backend store
# (psycopg 3), artifacts proxied to a volume. Pins must satisfy pyproject.toml's constraints
# (mlflow in the dependencies, psycopg in the `server` extra; tests/docker checks).
#
#   docker build -f docker/mlflow.Dockerfile -t qkstudy-mlflow:latest .
#
# The auth config baked in holds no secret: the admin password, the Postgres URI and the
# CSRF key come from the environment at run time (docker/.env, never committed).

FROM python:3.12-slim-bookworm

ARG MLFLOW_VERSION=3.17.2
ARG PSYCOPG_VERSION=3.3.9

RUN pip install --no-cache-dir \
        "mlflow[auth]==${MLFLOW_VERSION}" "psycopg[binary]==${PSYCOPG_VERSION}"

RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin mlflow \
    && mkdir -p /mlflow/artifacts /mlflow/auth \
    && chown -R mlflow:mlflow /mlflow

COPY docker/mlflow/basic_auth.ini /etc/mlflow/basic_auth.ini

ENV MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini \
    PYTHONUNBUFFERED=1

USER 10001:10001
WORKDIR /mlflow
EXPOSE 5000

HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=4)"]

CMD ["mlflow", "server", "--app-name", "basic-auth", "--host", "0.0.0.0", "--port", "5000", \
     "--workers", "2", "--artifacts-destination", "/mlflow/artifacts"]
