#!/usr/bin/env bash
# Writes the compose cluster's three credentials, each random (32 bytes, hex) and never committed
# (secrets/ is git-ignored), unless they already exist:
#
#   admin-token     operators (cairnctl --token-file) and the submit-demo container
#   cluster-secret  replicas only: authenticates their Raft calls to each other
#   worker-token    workers only: authenticates their Attach at the leader
#
# The admin token goes to deploy/compose/secrets/admin-token, or to the path given as the first
# argument; the other two beside it. Every replica reads them as compose secrets.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
admin=${1:-$here/secrets/admin-token}
dir=$(dirname "$admin")
mkdir -p "$dir"
chmod 700 "$dir"

write_secret() {
  local file=$1 what=$2
  if [[ -s $file ]]; then
    echo "$what already in $file"
    return
  fi
  local value
  value=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  [[ ${#value} -eq 64 ]] || {
    echo "gen-secrets.sh: could not read 32 random bytes from /dev/urandom" >&2
    exit 1
  }
  (umask 077 && printf '%s\n' "$value" >"$file")
  # The containers run as uid 10001 and see the file through a bind mount with its host mode:
  # it must be readable by them. The directory above keeps other host users out.
  chmod 644 "$file"
  echo "$what written to $file"
}

write_secret "$admin" "admin token"
write_secret "$dir/cluster-secret" "cluster secret"
write_secret "$dir/worker-token" "worker token"
