#!/usr/bin/env bash
# PID 1 of the postgres service. Roles:
#   postgres        the bootstrap superuser: no password, reachable only over the container's
#                   unix socket by its own OS account (peer; `docker exec` for dumps, restores)
#   $POSTGRES_USER  the role MLflow connects as, password $POSTGRES_PASSWORD: not a superuser,
#                   cannot create roles or databases; owns the database $POSTGRES_DB
# On an empty data volume: create the cluster, the role and its database. On every start: write pg_hba.conf (the role, to its database only, from the server's own subnets: the
# compose backend network; nothing else over TCP) and re-key the role from $POSTGRES_PASSWORD,
# then exec the server in the foreground. The password reaches the server through stdin of
# single-user mode, never argv or the data directory's config files.
set -euo pipefail

: "${PGDATA:?}" "${POSTGRES_USER:?set POSTGRES_USER}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
db="${POSTGRES_DB:-$POSTGRES_USER}"
if [ "$POSTGRES_USER" = postgres ] || [ "$db" = postgres ]; then
  echo "error: POSTGRES_USER / POSTGRES_DB must not be 'postgres' (the bootstrap superuser" \
       "and its maintenance database): MLflow's role and database are separate" >&2
  exit 2
fi

ident() { printf '"%s"' "${1//\"/\"\"}"; }   # SQL identifier
literal() { printf "'%s'" "${1//\'/\'\'}"; } # SQL string literal

single() {  # run SQL statements (";\n\n"-separated) in single-user mode; fail on any ERROR
  local out rc=0  # only the message lines are shown: a STATEMENT line would hold the password
  out=$(postgres --single -D "$PGDATA" -j "$1" 2>&1 >/dev/null <<<"$2") || rc=$?
  if [ "$rc" != 0 ] || grep -qE '^(ERROR|FATAL|PANIC):' <<<"$out"; then
    grep -E '^(ERROR|FATAL|PANIC|DETAIL|HINT):' <<<"$out" >&2 || true
    echo "error: qkstudy-postgres: single-user setup failed (exit $rc)" >&2
    return 1
  fi
}

role=$(ident "$POSTGRES_USER")
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  initdb -D "$PGDATA" -U postgres --encoding=UTF8 --auth-local=peer --auth-host=reject >/dev/null
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  single postgres "CREATE ROLE $role LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;

CREATE DATABASE $(ident "$db") OWNER $role;

REVOKE ALL ON DATABASE $(ident "$db") FROM PUBLIC;

REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;
"
  echo "qkstudy-postgres: created the cluster, role $POSTGRES_USER and database $db" >&2
fi

# pg_hba.conf is this script's, rewritten at every start (a volume from an older image had
# `host all all all`). First match wins: the superuser over the socket only, the role over TCP
# to its database only, from samenet (the subnets of this container's interfaces: compose's
# internal backend network, which the Ray containers are not on).
cat >"$PGDATA/pg_hba.conf" <<EOF
# Written by /usr/local/bin/qkstudy-postgres at every start: edits are lost.
local  all            postgres                  peer
local  $(ident "$db")  $role                    scram-sha-256
host   $(ident "$db")  $role     samenet         scram-sha-256
EOF
chmod 600 "$PGDATA/pg_hba.conf"

# Re-key from the env file at every start (a rotated POSTGRES_PASSWORD applies on restart).
# A volume made by an older image has $POSTGRES_USER as its bootstrap superuser and no role
# `postgres`: it gets one (peer login, for make backup), so it can be migrated by backup, purge
# and restore (docker/README.md).
single postgres "SET password_encryption = 'scram-sha-256';

DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'postgres') THEN CREATE ROLE postgres SUPERUSER LOGIN; END IF; END\$\$;

ALTER ROLE $role WITH LOGIN PASSWORD $(literal "$POSTGRES_PASSWORD");
"
unset POSTGRES_PASSWORD
exec postgres -D "$PGDATA"
