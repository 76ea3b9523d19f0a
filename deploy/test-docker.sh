#!/usr/bin/env bash
# Docker suite: the image and the compose cluster, for real.
#
#  1. builds the image (deploy/build-image.sh; reuses the cargo target directory),
#  2. starts deploy/compose/docker-compose.yml under a unique project name with a fresh admin
#     token, waits until the three replicas are healthy and the demo job was submitted,
#  3. waits until the demo job has completed checkpoints,
#  4. restarts the replicas one at a time, waiting after each until it is healthy again and the
#     job has completed more checkpoints,
#  5. stops the workers and checks the job's committed output is exactly once,
#  6. removes everything it created (also on failure or Ctrl-C; logs are printed on failure).
#
# Usage: deploy/test-docker.sh [--skip-build]   (--skip-build: use the existing image)
# Environment: CAIRN_IMAGE (default cairn:dev), CARGO_TARGET_DIR.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
compose_file=$here/compose/docker-compose.yml
export CAIRN_IMAGE=${CAIRN_IMAGE:-cairn:dev}
skip_build=false
for arg in "$@"; do
  case $arg in
    --skip-build) skip_build=true ;;
    *)
      echo "test-docker.sh: unknown argument $arg (usage: test-docker.sh [--skip-build])" >&2
      exit 2
      ;;
  esac
done

# shellcheck source=deploy/compose-cmd.sh
source "$here/compose-cmd.sh"

project=cairntest$$$RANDOM
work=$(mktemp -d)
export CAIRN_ADMIN_TOKEN_FILE=$work/secrets/admin-token
export CAIRN_CLUSTER_SECRET_FILE=$work/secrets/cluster-secret
export CAIRN_WORKER_TOKEN_FILE=$work/secrets/worker-token
compose() { "${compose_cmd[@]}" -p "$project" -f "$compose_file" "$@"; }
replicas=(cairn-1 cairn-2 cairn-3)
endpoints=cairn-1:7400,cairn-2:7400,cairn-3:7400
started=$SECONDS

log() { printf '[%4ds] %s\n' $((SECONDS - started)) "$*"; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $rc -ne 0 ]]; then
    log "FAILED (exit $rc); logs of project $project:"
    compose logs --no-color --tail 60 2>&1 || true
  fi
  log "removing project $project"
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

container() { compose ps -q "$1"; }

# Polls `$@` until it succeeds, at most $2 seconds; exit status 3 from `$@` means "will never
# succeed" and stops at once. Prints the last answer either way.
wait_for() {
  local what=$1 limit=$2
  shift 2
  local deadline=$((SECONDS + limit)) out rc
  while true; do
    if out=$("$@" 2>&1); then
      [[ -n $out ]] && log "$out"
      return 0
    else
      rc=$?
    fi
    if ((rc == 3)); then
      log "$out"
      return 1
    fi
    if ((SECONDS >= deadline)); then
      log "gave up waiting ${limit}s for $what; last answer: $out"
      return 1
    fi
    sleep 1
  done
}

healthy() {
  local id status
  id=$(container "$1")
  [[ -n $id ]] || return 1
  status=$(docker inspect -f '{{.State.Health.Status}}' "$id")
  [[ $status == healthy ]] || {
    echo "$1 is $status"
    return 1
  }
}

submitted() {
  local id state
  id=$(container submit-demo)
  state=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$id")
  case $state in
    "exited 0") echo "demo job submitted: $(docker logs "$id" 2>&1 | tail -n 1)" ;;
    exited*)
      # Not worth waiting for: show why and stop.
      echo "submit-demo failed ($state): $(docker logs "$id" 2>&1 | tail -n 5)"
      return 3
      ;;
    *)
      echo "submit-demo is $state"
      return 1
      ;;
  esac
}

# Runs cairn-probe inside worker-1 (same image, on the cluster network; the token is passed by
# name, so its value never appears on a command line).
probe() {
  CAIRN_ADMIN_TOKEN=$(cat "$CAIRN_ADMIN_TOKEN_FILE") docker exec -e CAIRN_ADMIN_TOKEN \
    "$(container worker-1)" cairn-probe --timeout 10s "$@"
}

completed() {
  local out
  out=$(probe checkpoints --job demo --min 0 ${endpoints//,/ } 2>&1) || {
    echo "$out" >&2
    return 1
  }
  sed -n 's/^job demo: \([0-9]*\) checkpoints completed.*/\1/p' <<<"$out"
}

at_least() { probe checkpoints --job demo --min "$1" ${endpoints//,/ }; }

if ! $skip_build; then
  log "building the image $CAIRN_IMAGE"
  "$here/build-image.sh"
fi
docker image inspect "$CAIRN_IMAGE" >/dev/null

"$here/compose/gen-secrets.sh" "$CAIRN_ADMIN_TOKEN_FILE" >/dev/null
log "starting project $project (${compose_cmd[*]})"
compose up -d 2>&1 | sed 's/^/    /'

for r in "${replicas[@]}"; do
  wait_for "$r to be healthy" 90 healthy "$r"
done
wait_for "the demo job to be submitted" 90 submitted
wait_for "3 completed checkpoints" 120 at_least 3

for r in "${replicas[@]}"; do
  before=$(completed)
  log "restarting $r (job demo: $before checkpoints completed so far)"
  compose restart "$r" 2>&1 | sed 's/^/    /'
  wait_for "$r to be healthy again" 90 healthy "$r"
  wait_for "checkpoints to keep completing after restarting $r" 120 at_least $((before + 3))
done

log "stopping the workers; checking the committed output is exactly once"
compose stop worker-1 worker-2 2>&1 | sed 's/^/    /'
docker run --rm --network none -v "${project}_output:/output:ro" "$CAIRN_IMAGE" \
  cairn-worker verify --output /output/demo | sed 's/^/    /'

log "docker suite passed"
