#!/usr/bin/env bash
# Load against the example server (release build) with wrk (`apt-get install wrk`): replays,
# fresh executions with the extension, and fresh executions with it off, in one run so the
# ratios compare like with like. Each server gets a fresh database in a temp dir.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/idem-target}"
cargo build --quiet --release --example a2a_server
bin="$CARGO_TARGET_DIR/release/examples/a2a_server"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
command -v wrk >/dev/null || { echo "run.sh needs wrk: apt-get install wrk" >&2; exit 1; }

run() {
  local mode=$1 script=$2
  local out="$dir/$mode-$script.out" url=""
  "$bin" --listen 127.0.0.1:0 --db "$dir/$mode-$script.db" --idempotency "$mode" >"$out" 2>"$dir/stderr" &
  local pid=$!
  for _ in $(seq 100); do
    url=$(sed -n 's/^listening on //p' "$out")
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "the server did not start:" >&2; cat "$dir/stderr" >&2; exit 1; }
  printf '%-9s %-11s ' "$mode" "$script"
  wrk -t2 -c32 -d8s -s "$script" "$url/" | awk '/Requests\/sec/ {print $2 " req/s"}'
  kill -TERM "$pid"
  wait "$pid"
}

run required replay.lua
run required fresh.lua
run off fresh.lua
