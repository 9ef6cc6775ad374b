# MLflow tracking server for the qkstudy stack: basic-auth app, Postgres backend store
# (psycopg 3), artifacts proxied to a volume. Same base and wheelhouse as the training image:
# the packages are pyproject's `server` extra at the versions of constraints.txt.
#
#   make wheelhouse && docker build -f docker/mlflow.Dockerfile -t qkstudy-mlflow:latest .
#
# The auth config baked in holds no secret: the admin password, the Postgres URI and the
# CSRF key come from the environment at run time (docker/.env, never committed).

ARG BASE_IMAGE=qkstudy-base:bookworm

FROM ${BASE_IMAGE} AS build

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

ENV PATH=/opt/venv/bin:${PATH} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INDEX=1 \
    PIP_FIND_LINKS=/wheels

COPY build/wheelhouse/ /wheels/
COPY pyproject.toml docker/requirements.py /src/
RUN python3 -m venv /opt/venv \
    && pip install -c /wheels/constraints.txt pip setuptools \
    && python /src/requirements.py /src/pyproject.toml --only-extras --extra server >/tmp/requirements.txt \
    && pip install -c /wheels/constraints.txt -r /tmp/requirements.txt \
    && pip check \
    && python -c "import mlflow.server.auth, psycopg"


FROM ${BASE_IMAGE} AS runtime

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini as PID 1: it forwards signals to, and reaps, the server's worker processes.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates python3 tini \
    && rm -rf /var/lib/apt/lists/*

COPY --from=build /opt/venv /opt/venv

RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin mlflow \
    && mkdir -p /mlflow/artifacts /mlflow/auth \
    && chown -R mlflow:mlflow /mlflow

COPY docker/mlflow/basic_auth.ini /etc/mlflow/basic_auth.ini
COPY docker/mlflow/create_user.py docker/check_env.py /usr/local/lib/qkstudy/

# No server-side job runner (MLflow's huey workers: prompt optimisation and the like), which
# the tracking store of a study never uses: three processes fewer, a faster start.
ENV PATH=/opt/venv/bin:${PATH} \
    MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    PYTHONUNBUFFERED=1

USER 10001:10001
WORKDIR /mlflow
EXPOSE 5000

HEALTHCHECK --interval=5s --timeout=5s --start-period=60s --retries=30 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=4)"]

# The container refuses to start while a secret in its environment is a placeholder.
ENTRYPOINT ["/usr/bin/tini", "--", "python3", "/usr/local/lib/qkstudy/check_env.py", "--exec"]
CMD ["mlflow", "server", "--app-name", "basic-auth", "--host", "0.0.0.0", "--port", "5000", \
     "--workers", "2", "--artifacts-destination", "/mlflow/artifacts"]
