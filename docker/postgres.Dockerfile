# PostgreSQL for the stack (MLflow's backend store), from the same base as the other images
# and Debian's own package. The server runs as the `postgres` account, data in the volume
# mounted at /var/lib/postgresql/data, created on first start by entrypoint.sh from
# POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB (docker/.env at run time, never baked in).
#
#   docker build -f docker/postgres.Dockerfile -t qkstudy-postgres:latest docker/postgres

ARG BASE_IMAGE=qkstudy-base:bookworm

FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The `postgres` account with a fixed uid (the package keeps an existing one), and no cluster
# from the package's postinst: entrypoint.sh creates it in the volume at first start.
RUN groupadd --system --gid 10002 postgres \
    && useradd --system --uid 10002 --gid postgres --home-dir /var/lib/postgresql --shell /bin/bash postgres \
    && mkdir -p /etc/postgresql-common/createcluster.d \
    && echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/qkstudy.conf \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* \
    && for bin in /usr/lib/postgresql/*/bin; do ln -sfn "$bin" /usr/lib/postgresql/bin; done \
    && install -d -o postgres -g postgres -m 700 /var/lib/postgresql/data

COPY entrypoint.sh /usr/local/bin/qkstudy-postgres

ENV PATH=/usr/lib/postgresql/bin:${PATH} \
    PGDATA=/var/lib/postgresql/data

USER 10002:10002
# SIGINT is PostgreSQL's fast shutdown (SIGTERM would wait for every client to disconnect).
STOPSIGNAL SIGINT
HEALTHCHECK --interval=3s --timeout=5s --start-period=30s --retries=20 \
    CMD ["pg_isready", "-h", "127.0.0.1", "-q"]
ENTRYPOINT ["/usr/local/bin/qkstudy-postgres"]
