#!/usr/bin/env bash
# `make stack-up` / `make stack-down`: the compose stack with its checks and waits.
#
#   docker/stack.sh up     check the env file's secrets, start every service, wait until all
#                          are healthy and every Ray worker has joined; print where things are
#   docker/stack.sh down   remove the containers and the networks; the volumes (shards,
#                          checkpoints, MLflow's database, artifacts and users) stay for the
#                          next up. PURGE=1 deletes them too: all data (make backup first)
#
# Env: ENV_FILE (default docker/.env), WORKERS (CPU Ray workers, default 1), GPU=1 (add
# docker/compose.gpu.yaml: one worker holding all GPUs), PURGE=1 (down deletes the volumes;
# KEEP_DATA=1, the old opt-in to keeping them, is accepted and changes nothing),
# UP_TIMEOUT_S (default 600). Exit 2 on a bad env file or option, 1 when the stack fails to
# come up (its services' last log lines are printed).
set -euo pipefail
cd "$(dirname "$0")/.."

action="${1:-}"
env_file="${ENV_FILE:-docker/.env}"
workers="${WORKERS:-1}"

compose_cli() {
  if docker compose version >/dev/null 2>&1; then
    echo "docker compose"
  elif command -v docker-compose >/dev/null 2>&1; then
    echo "docker-compose"
  else
    echo "error: no compose: install the docker compose plugin or docker-compose" >&2
    exit 2
  fi
}

project_of() {  # COMPOSE_PROJECT_NAME from the env file, default qkstudy
  local p
  p=$(grep -E '^COMPOSE_PROJECT_NAME=' "$1" 2>/dev/null | tail -n1 | cut -d= -f2-)
  echo "${p:-qkstudy}"
}

files=(-f docker/compose.yaml)
[ "${GPU:-0}" = 1 ] && files+=(-f docker/compose.gpu.yaml)

case "$action" in
  up)
    python3 docker/check_env.py "$env_file"  # exits 2, naming each bad secret
    if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
      echo "error: WORKERS=$workers: expected a positive integer" >&2; exit 2
    fi
    if [ "${GPU:-0}" = 1 ] && [ "$workers" != 1 ]; then
      echo "error: GPU=1 WORKERS=$workers: a GPU worker holds all of its host's GPUs, so replicas" \
           "on one host would share them; run one per host (docker/README.md)" >&2
      exit 2
    fi
    ;;
  down) [ -f "$env_file" ] || env_file=docker/.env.example ;;  # values only need to render
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

project=$(project_of "$env_file")
read -r -a cli <<<"$(compose_cli)"
dc=("${cli[@]}" -p "$project" --env-file "$env_file" "${files[@]}")

if [ "$action" = down ]; then
  case "${PURGE:-0}" in
    1) purge=(--volumes) ;;
    0 | "") purge=() ;;
    *) echo "error: PURGE=${PURGE}: expected 1 (delete the volumes) or 0" >&2; exit 2 ;;
  esac
  "${dc[@]}" down --remove-orphans "${purge[@]}" --timeout 20
  left=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
  [ -z "$left" ] || { echo "error: containers left: $left" >&2; exit 1; }
  if [ "${#purge[@]}" -gt 0 ]; then
    echo "stack $project down (volumes deleted)"
  else
    echo "stack $project down (volumes kept for the next stack-up; PURGE=1 deletes them)"
  fi
  exit 0
fi

if ! "${dc[@]}" up -d --no-build --scale "ray-worker=$workers"; then
  echo "error: the stack did not come up; last log lines:" >&2
  "${dc[@]}" logs --tail 40 >&2 || true
  exit 1
fi

# Healthy means: every long-running service's healthcheck passes, mlflow-users exited 0, and
# the head counts the expected number of alive worker nodes.
deadline=$(( $(date +%s) + ${UP_TIMEOUT_S:-600} ))
head=$("${dc[@]}" ps -q ray-head)
while :; do
  states=$(docker inspect --format '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}:{{.State.ExitCode}}{{end}}' \
             $("${dc[@]}" ps -aq))
  bad=$(grep -vE ' (healthy|exited:0)$' <<<"$states" || true)
  if [ -z "$bad" ]; then
    alive=$(docker exec "$head" python3 -c "import ray; ray.init(address='auto', logging_level='ERROR'); \
print(sum(1 for n in ray.nodes() if n['Alive'] and not n['Resources'].get('node:__internal_head__')))" 2>/dev/null || echo 0)
    [ "$alive" = "$workers" ] && break
    bad="ray: $alive of $workers workers joined"
  fi
  if [ "$(date +%s)" -gt "$deadline" ] || grep -qE 'exited:[1-9]|unhealthy' <<<"$bad"; then
    echo "error: the stack did not come up: $bad" >&2
    "${dc[@]}" logs --tail 40 >&2 || true
    exit 1
  fi
  sleep 3
done

port() { grep -E "^$1=" "$env_file" | tail -n1 | cut -d= -f2- ; }
echo "stack $project up: Ray dashboard / Jobs API http://127.0.0.1:$(port RAY_DASHBOARD_PORT || echo 8265)," \
     "MLflow http://127.0.0.1:$(port MLFLOW_PORT || echo 5000), $workers worker(s)"
