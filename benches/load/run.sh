#!/usr/bin/env bash
# Load against the example server (release build) with wrk (Debian package `wrk`): replays,
# fresh executions with the extension, and fresh executions with it off, in one run so the
# ratios compare like with like. Each server gets a fresh database in a temp dir.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/idem-target}"
cargo build --quiet --release --example a2a_server
bin="$CARGO_TARGET_DIR/release/examples/a2a_server"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
port="${PORT:-18090}"

run() {
  local mode=$1 script=$2
  "$bin" --listen "127.0.0.1:$port" --db "$dir/$mode-$script.db" --idempotency "$mode" >/dev/null 2>&1 &
  local pid=$!
  sleep 1
  printf '%-9s %-11s ' "$mode" "$script"
  wrk -t2 -c32 -d8s -s "$script" "http://127.0.0.1:$port/" | awk '/Requests\/sec/ {print $2 " req/s"}'
  kill -TERM "$pid"
  wait "$pid"
}

run required replay.lua
run required fresh.lua
run off fresh.lua
