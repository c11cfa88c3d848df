#!/usr/bin/env bash
# Load against the example server (release build) with wrk (`apt-get install wrk`): replays,
# fresh executions with the extension, and fresh executions with it off, in one run so the
# ratios compare like with like. Each server gets a fresh database in a temp dir; the most
# threads each server process had while under load is sampled from /proc.
#   CONNECTIONS (default 64), DURATION (seconds, default 10), A2A_SERVER_BIN (see below),
#   POSTGRES_URL (a server on which to create one database per load: measures PostgreSQL)
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/idem-target}"
connections=${CONNECTIONS:-64}
duration=${DURATION:-10}
# A2A_SERVER_BIN: measure that binary instead (e.g. an older build, for a before/after).
bin="${A2A_SERVER_BIN:-$CARGO_TARGET_DIR/release/examples/a2a_server}"
[ -n "${A2A_SERVER_BIN:-}" ] || cargo build --quiet --release --example a2a_server
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
command -v wrk >/dev/null || { echo "run.sh needs wrk: apt-get install wrk" >&2; exit 1; }

# Prints "REQ_PER_SEC MAX_THREADS" for one load.
load() {
  local mode=$1 script=$2
  local out="$dir/$mode-$script.out" url="" db="$dir/$mode-$script.db"
  if [ -n "${POSTGRES_URL:-}" ]; then
    local name="idem_load_${mode}_${script%.lua}_$$"
    psql -q "$POSTGRES_URL" -c "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name" >/dev/null
    db="${POSTGRES_URL%/*}/$name"
  fi
  "$bin" --listen 127.0.0.1:0 --db "$db" --idempotency "$mode" >"$out" 2>"$dir/stderr" &
  local pid=$!
  for _ in $(seq 100); do
    url=$(sed -n 's/^listening on //p' "$out")
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "the server did not start:" >&2; cat "$dir/stderr" >&2; exit 1; }
  (while kill -0 "$pid" 2>/dev/null; do
     awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null
     sleep 0.2
   done) >"$dir/threads" &
  local sampler=$!
  local rps
  rps=$(wrk -t2 -c"$connections" -d"${duration}s" -s "$script" "$url/" | awk '/Requests\/sec/ {print $2}')
  kill -TERM "$pid"
  wait "$pid"
  wait "$sampler" || true
  echo "$rps $(sort -n "$dir/threads" | tail -1)"
}

report() {
  printf '%-9s %-11s %10s req/s  %4s threads\n' "$1" "$2" $3 $4
}

printf '%s connections, %s s each, on %s\n' "$connections" "$duration" "$([ -n "${POSTGRES_URL:-}" ] && echo PostgreSQL || echo SQLite)"
read -r replay_rps replay_threads < <(load required replay.lua)
report required replay.lua "$replay_rps" "$replay_threads"
read -r fresh_rps fresh_threads < <(load required fresh.lua)
report required fresh.lua "$fresh_rps" "$fresh_threads"
read -r off_rps off_threads < <(load off fresh.lua)
report off fresh.lua "$off_rps" "$off_threads"
awk -v f="$fresh_rps" -v o="$off_rps" -v r="$replay_rps" \
  'BEGIN { printf "fresh with the extension / off = %.2f; replay / fresh = %.1f\n", f / o, r / f }'
