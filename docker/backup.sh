#!/usr/bin/env bash
# `make backup` / `make restore`: the compose stack's data, to and from a folder.
#
#   docker/backup.sh backup    (stack up, at least postgres) into BACKUP_DIR, a new folder:
#       postgres.dump             pg_dump -Fc of MLflow's database, taken inside the postgres
#                                 container as the superuser (peer login over its socket)
#       mlflow-artifacts.tar.gz   the MLflow artifact store (weights logged as artifacts)
#       mlflow-auth.tar.gz        MLflow's users and their permissions (basic auth sqlite)
#       qkstudy-shared.tar.gz     /shared: corpora, shard cache, checkpoints, final weights
#       SHA256SUMS                written last: a folder without it is a partial backup
#     each file is written under a .partial name and renamed once complete. Take it while no
#     study runs (the volumes are read live); the database dump is consistent by itself.
#   docker/backup.sh restore   BACKUP_DIR into a stack with no containers and no volumes
#     (make stack-down PURGE=1, or another COMPOSE_PROJECT_NAME): it never overwrites data.
#     Creates the stack's volumes, starts postgres alone, loads the dump into the database as
#     MLflow's role owns it, unpacks the three tarballs, takes the containers down again
#     (volumes kept): then make stack-up. Use the env file the backup was taken with (the
#     restored MLflow users keep their passwords).
#
# Env: BACKUP_DIR (required), ENV_FILE (default docker/.env). Exit 2 on a missing option, a
# missing or partial backup, a backup folder already used, or a stack in the way; 1 when a
# step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

action="${1:-}"
dir="${BACKUP_DIR:-}"
env_file="${ENV_FILE:-docker/.env}"
FILES=(postgres.dump mlflow-artifacts.tar.gz mlflow-auth.tar.gz qkstudy-shared.tar.gz)
VOLUMES=(mlflow-artifacts mlflow-auth qkstudy-shared)  # tarball NAME.tar.gz <-> volume NAME

die() { echo "error: ${*:2}" >&2; exit "$1"; }

case "$action" in backup | restore) ;; *) die 2 "usage: BACKUP_DIR=DIR $0 backup|restore" ;; esac
[ -n "$dir" ] || die 2 "set BACKUP_DIR (make $action BACKUP_DIR=DIR)"
[ -f "$env_file" ] || die 2 "$env_file not found (ENV_FILE): the stack's env file"

env_get() {  # VAR DEFAULT: the env file's value
  local v
  v=$(grep -E "^$1=" "$env_file" | tail -n1 | cut -d= -f2- || true)
  echo "${v:-$2}"
}
project=$(env_get COMPOSE_PROJECT_NAME qkstudy)
db=$(env_get POSTGRES_DB mlflow)
role=$(env_get POSTGRES_USER mlflow)
image=$(env_get QKSTUDY_POSTGRES_IMAGE qkstudy-postgres:latest)  # tar, gzip: the helper's image
label="label=com.docker.compose.project=$project"

volume_of() { docker volume ls -q --filter "$label" --filter "label=com.docker.compose.volume=$1"; }
running() { docker ps -q --filter "$label" --filter "label=com.docker.compose.service=$1"; }

# A throwaway container on one volume: no network, root with only the capabilities tar needs.
volume_tar() {  # VOLUME CAP... -- TAR-ARGS...
  local vol=$1 caps=()
  shift
  while [ "$1" != -- ]; do caps+=(--cap-add "$1"); shift; done
  shift
  docker run --rm -i --network none --user 0:0 --cap-drop ALL "${caps[@]}" \
    --security-opt no-new-privileges:true \
    --entrypoint tar -v "$vol:/data" "$image" -C /data "$@"
}

if [ "$action" = backup ]; then
  [ ! -e "$dir/SHA256SUMS" ] || die 2 "$dir already holds a backup: give a new BACKUP_DIR"
  pg=$(running postgres)
  [ -n "$pg" ] || die 2 "postgres of stack $project is not running: make stack-up (ENV_FILE=$env_file) first"
  mkdir -p "$dir"
  trap 'rm -f "$dir"/*.partial' EXIT
  docker exec "$pg" pg_dump -Fc -d "$db" >"$dir/postgres.dump.partial" || die 1 "pg_dump failed"
  mv "$dir/postgres.dump.partial" "$dir/postgres.dump"
  for name in "${VOLUMES[@]}"; do
    vol=$(volume_of "$name")
    [ -n "$vol" ] || die 1 "stack $project has no volume $name"
    volume_tar "$vol" DAC_READ_SEARCH -- -czf - . >"$dir/$name.tar.gz.partial" || die 1 "archiving $name failed"
    mv "$dir/$name.tar.gz.partial" "$dir/$name.tar.gz"
  done
  (cd "$dir" && sha256sum "${FILES[@]}" >SHA256SUMS.partial && mv SHA256SUMS.partial SHA256SUMS)
  echo "backup of stack $project in $dir: $(du -sh "$dir" | cut -f1)"
  exit 0
fi

# restore: a complete backup, an empty stack.
[ -d "$dir" ] || die 2 "$dir: no such backup folder"
[ -f "$dir/SHA256SUMS" ] || die 2 "$dir has no SHA256SUMS: not a backup, or a partial one (interrupted make backup)"
for f in "${FILES[@]}"; do
  grep -qE "^[0-9a-f]{64}  $f\$" "$dir/SHA256SUMS" && [ -f "$dir/$f" ] || die 2 "$dir: $f missing: a partial backup"
done
(cd "$dir" && sha256sum --quiet -c SHA256SUMS) >&2 || die 2 "$dir: a file does not match SHA256SUMS"
left=$(docker ps -aq --filter "$label")
[ -z "$left" ] || die 2 "stack $project has containers: make stack-down first (restore fills an empty stack)"
for name in "${VOLUMES[@]}" postgres-data; do
  [ -z "$(volume_of "$name")" ] || die 2 "stack $project already has its volume $name: restore never" \
    "overwrites data; make stack-down PURGE=1 (after make backup), or restore under another COMPOSE_PROJECT_NAME"
done

read -r -a cli <<<"$(docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)"
dc=("${cli[@]}" -p "$project" --env-file "$env_file" -f docker/compose.yaml)
trap '"${dc[@]}" down --remove-orphans --timeout 20 >/dev/null 2>&1 || true' EXIT
# The services that mount the volumes, created (not started; --no-deps: compose 1.29 would
# wait on their dependencies' health), then postgres started alone.
timeout 300 "${dc[@]}" up --no-start --no-deps mlflow ray-head >/dev/null 2>&1 \
  || die 1 "could not create the stack's volumes: ${dc[*]} up --no-start --no-deps mlflow ray-head"
timeout 300 "${dc[@]}" up -d --no-deps postgres >/dev/null 2>&1 || die 1 "postgres did not start"
pg=$(running postgres)
for _ in $(seq 1 60); do
  [ "$(docker inspect --format '{{.State.Health.Status}}' "$pg")" = healthy ] && break
  sleep 2
done
[ "$(docker inspect --format '{{.State.Health.Status}}' "$pg")" = healthy ] || die 1 "postgres not healthy"
# Objects owned by MLflow's role, whoever owned them when dumped (a volume from an older image).
docker exec -i "$pg" pg_restore -d "$db" --no-owner --no-privileges --role="$role" \
  --single-transaction --exit-on-error <"$dir/postgres.dump" || die 1 "pg_restore failed"
for name in "${VOLUMES[@]}"; do
  volume_tar "$(volume_of "$name")" CHOWN DAC_OVERRIDE FOWNER -- \
    -xzpf - --same-owner --numeric-owner <"$dir/$name.tar.gz" || die 1 "unpacking $name failed"
done
"${dc[@]}" down --remove-orphans --timeout 20 >/dev/null 2>&1 || die 1 "could not take postgres down"
trap - EXIT
echo "restored $dir into stack $project (volumes only): make stack-up ENV_FILE=$env_file"
