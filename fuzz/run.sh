#!/usr/bin/env bash
# Runs each fuzz target for SECONDS (default 60), from the seeds in fuzz/seeds/TARGET, with a
# corpus kept outside the clone. Needs cargo-fuzz (`cargo install cargo-fuzz`); the machine's
# toolchain is stable, so RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags, and no
# sanitizer is used (`-s none`: Rust's own checks and the targets' assertions find the bugs).
# A crash leaves its input in fuzz/artifacts/TARGET/; the last line of each run says how
# many executions it made.
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request_hash message_id rpc_admission)
export RUSTC_BOOTSTRAP=1
target_dir="${FUZZ_TARGET_DIR:-$HOME/.cache/idem-fuzz-target}"
corpus_root="${FUZZ_CORPUS_DIR:-$HOME/.cache/idem-fuzz-corpus}"
failed=0
for target in "${targets[@]}"; do
    mkdir -p "$corpus_root/$target"
    log="$corpus_root/$target.log"
    echo "== $target, ${seconds} s (log: $log)"
    status=0
    cargo fuzz run -s none --fuzz-dir fuzz --target-dir "$target_dir" "$target" \
        "$corpus_root/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        >"$log" 2>&1 || status=$?
    grep -E "^stat::number_of_executed_units|^stat::new_units_added|panicked at|Test unit written" "$log" || true
    if [ "$status" -ne 0 ]; then
        echo "$target: CRASH (exit $status); see $log" >&2
        failed=1
    fi
done
exit $failed
