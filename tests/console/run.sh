#!/usr/bin/env bash
# The web console's browser suite: headless Chromium against cairn-demo (three replicas, a
# worker and the demo job), driven by tests/src/bin/cairn-console-browser.rs. Installs Debian's
# chromium when it is missing. Screenshots go to <target dir>/console-screenshots/.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v chromium >/dev/null 2>&1; then
  echo "chromium missing; installing it"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
cargo build --locked -p cairn-demo -p cairn-tests --bins
target="${CARGO_TARGET_DIR:-target}"
"$target/debug/cairn-console-browser" --chromium "$(command -v chromium)" "$@"
