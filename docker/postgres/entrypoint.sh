#!/usr/bin/env bash
# PID 1 of the postgres service: on an empty data volume, create the cluster (scram-sha-256
# everywhere, superuser $POSTGRES_USER with $POSTGRES_PASSWORD, database $POSTGRES_DB), then
# exec the server in the foreground. The password passes through a 0600 file that is deleted
# before the server starts; it never appears in argv or in the data directory's config.
set -euo pipefail

: "${PGDATA:?}" "${POSTGRES_USER:?set POSTGRES_USER}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
db="${POSTGRES_DB:-$POSTGRES_USER}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  trap 'rm -f "$pwfile"' EXIT
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 \
    --auth-local=scram-sha-256 --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  # Reached only over the compose network (the service publishes no port).
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    # Single-user mode: no server listening while the database is created.
    echo "CREATE DATABASE \"$db\" OWNER \"$POSTGRES_USER\";" \
      | postgres --single -D "$PGDATA" -j postgres >/dev/null
  fi
fi
unset POSTGRES_PASSWORD
exec postgres -D "$PGDATA"
