#!/usr/bin/env bash
# Runs Cairn's container chaos suite: builds the image (deploy/build-image.sh) and
# target/release/cairn-chaos, brings up the compose cluster with the demo job under a unique
# project name (deploy/compose/docker-compose.yml + deploy/chaos/docker-compose.chaos.yml),
# runs the nemesis and the invariant checks, tears everything down, and exits with the
# verdict: 0 all checks passed, 1 a check failed, 2 the run could not be made.
#
# Usage: deploy/chaos/run.sh [--skip-build] [--keep] [cairn-chaos args...]
#   --quick            every fault kind once (~2-3 minutes), for CI
#   --seed N           replay the schedule of a previous run (its seed is printed first)
#   --duration D       how long to inject faults (default 10m)
#   --skip-build       use the image and release binaries already built
#   --keep             leave the compose project running afterwards (for debugging)
# The history (JSON) and the containers' logs of every run go to
# $CHAOS_ARTIFACTS (default <target>/chaos/<project>/).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
case $target in /*) ;; *) target=$repo/$target ;; esac
export CAIRN_IMAGE=${CAIRN_IMAGE:-cairn:dev}
skip_build=false
keep=false
args=()
for arg in "$@"; do
  case $arg in
    --skip-build) skip_build=true ;;
    --keep) keep=true ;;
    -h | --help)
      sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) args+=("$arg") ;;
  esac
done

# shellcheck source=deploy/compose-cmd.sh
source "$repo/deploy/compose-cmd.sh"
if [[ $(id -u) -ne 0 ]]; then
  echo "run.sh: run as root: the nemesis fills the checkpoint volume through its host directory" >&2
  exit 2
fi

if $skip_build; then
  docker image inspect "$CAIRN_IMAGE" >/dev/null 2>&1 || {
    echo "run.sh: image $CAIRN_IMAGE not found; run without --skip-build" >&2
    exit 2
  }
else
  "$repo/deploy/build-image.sh"
  echo "==> cargo build --release -p cairn-tests --bin cairn-chaos"
  (cd "$repo" && cargo build --release --locked -p cairn-tests --bin cairn-chaos)
fi
chaos=$target/release/cairn-chaos
[[ -x $chaos ]] || {
  echo "run.sh: $chaos is missing; run without --skip-build" >&2
  exit 2
}

# Compose v1 keeps only [a-z0-9_-] of a project name: use exactly those.
project=cairnchaos$$$(date +%s)
artifacts=${CHAOS_ARTIFACTS:-$target/chaos/$project}
mkdir -p "$artifacts"
export CAIRN_ADMIN_TOKEN_FILE=$artifacts/secrets/admin-token
export CAIRN_CLUSTER_SECRET_FILE=$artifacts/secrets/cluster-secret
export CAIRN_WORKER_TOKEN_FILE=$artifacts/secrets/worker-token
"$repo/deploy/compose/gen-secrets.sh" "$CAIRN_ADMIN_TOKEN_FILE" >/dev/null
compose() {
  "${compose_cmd[@]}" -p "$project" -f "$repo/deploy/compose/docker-compose.yml" \
    -f "$here/docker-compose.chaos.yml" "$@"
}

teardown() {
  compose logs --no-color >"$artifacts/containers.log" 2>&1 || true
  if $keep; then
    echo "run.sh: project $project left running (docker-compose -p $project ... down -v to remove)"
  else
    compose down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  echo "run.sh: history and container logs in $artifacts"
}
trap teardown EXIT

echo "==> compose project $project up"
compose up -d
status=0
"$chaos" --project "$project" --token-file "$CAIRN_ADMIN_TOKEN_FILE" \
  --history "$artifacts/history.json" "${args[@]}" || status=$?
exit $status
