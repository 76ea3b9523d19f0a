#!/usr/bin/env bash
# Cairn's power-loss suite (see docs/POWER-LOSS.md): lints and mounting tests of crashfs (the
# FUSE file system that loses what was not synced), then a short cairn-powerloss run: a few
# trials per scenario of real replicas and a worker losing power on one replica, a majority and
# everything. Installs nothing; needs /dev/fuse, fusermount3 (Debian package fuse3) and root.
#
# Usage: tests/powerloss/run.sh [--trials N] [--seed S] [--release] [other cairn-powerloss args...]
#   --trials N   trials per scenario (default 2)
#   --seed S     seed of the run (default: random; printed, replay with it)
#   --release    build and run optimized binaries (slower to build, faster trials)
# Exit status: 0 when everything passed, 1 when a test or trial failed, 2 when the suite could
# not run here.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
case $target in /*) ;; *) target=$repo/$target ;; esac

trials=2
seed=""
profile=()
args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --trials) trials=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --release) profile=(--release); shift ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

missing=()
[[ -e /dev/fuse ]] || missing+=("/dev/fuse does not exist: load the fuse module (modprobe fuse); in a container pass --device /dev/fuse")
command -v fusermount3 >/dev/null 2>&1 || missing+=("fusermount3 is not installed: apt-get install fuse3")
[[ $(id -u) -eq 0 ]] || missing+=("not root: mounting crashfs with auto-unmount and cutting its power need root")
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "power-loss suite cannot run here:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 2
fi

cd "$repo"
started=$SECONDS
echo "== clippy: cairn-crashfs with its mounting tests"
cargo clippy -p cairn-crashfs --all-targets --features mount-tests --locked -- -D warnings || exit 1
echo "== cargo test -p cairn-crashfs --features mount-tests"
cargo test -p cairn-crashfs --features mount-tests --locked || exit 1
echo "== cairn-powerloss: $trials trial(s) per scenario"
cargo build "${profile[@]}" --workspace --bins --locked || exit 1
seed_args=()
[[ -n $seed ]] && seed_args=(--seed "$seed")
set +e
cargo run "${profile[@]}" --locked -q -p cairn-tests --bin cairn-powerloss -- \
  --trials "$trials" "${seed_args[@]}" --summary-every 0 --artifacts "$target/powerloss" "${args[@]}"
status=$?
set -e
echo "== power-loss suite: $((SECONDS - started)) s"
exit $status
