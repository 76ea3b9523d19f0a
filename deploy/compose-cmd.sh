# Sourced by the deploy scripts: sets the array `compose_cmd` to the Compose command this machine
# has (`docker compose` v2, else `docker-compose` v1), or fails with a message naming the caller.
if docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose_cmd=(docker-compose)
else
  echo "$(basename "$0"): neither 'docker compose' nor 'docker-compose' is available; install Docker Compose" >&2
  exit 2
fi
