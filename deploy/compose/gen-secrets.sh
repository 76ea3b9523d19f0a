#!/usr/bin/env bash
# Writes the compose cluster's admin token to deploy/compose/secrets/admin-token (or to the
# path given as the first argument), unless it already exists. The token is random (32 bytes,
# hex) and never committed (secrets/ is git-ignored). Every replica reads the same file as a
# compose secret; cairnctl inside the containers uses it with --token-file.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
file=${1:-$here/secrets/admin-token}
if [[ -s $file ]]; then
  echo "admin token already in $file"
  exit 0
fi
dir=$(dirname "$file")
mkdir -p "$dir"
chmod 700 "$dir"
token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
[[ ${#token} -eq 64 ]] || {
  echo "gen-secrets.sh: could not read 32 random bytes from /dev/urandom" >&2
  exit 1
}
umask 077
printf '%s\n' "$token" >"$file"
# The replicas run as uid 10001 and see the file through a bind mount with its host mode: it
# must be readable by them. The directory above keeps other host users out.
chmod 644 "$file"
echo "admin token written to $file"
