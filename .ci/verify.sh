#!/usr/bin/env bash
# Verification beyond `cargo test`: loom models of the blocking driver, a fuzzing smoke run of
# every cargo-fuzz target, and soak runs of the blocking and the async queue. Stable Rust only.
#
# About 10 minutes on 2 cores from a clean checkout (cargo-fuzz install ~2 min, loom build ~3 min,
# fuzz build ~1.5 min + 1 min of fuzzing, soak builds ~2 min + 2 x 20 s). Knobs (environment):
#   LOOM_MAX_PREEMPTIONS (2)   FUZZ_SECONDS (60, per target, all targets at once)
#   SOAK_SECONDS (20)          SOAK_THREADS (4)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
SOAK_SECONDS="${SOAK_SECONDS:-20}"
SOAK_THREADS="${SOAK_THREADS:-4}"
FUZZ_TARGETS=(state_differential limiters blocking_queue)

step() { printf '\n=== verify: %s ===\n' "$*"; }
mkdir -p target

step "loom models (workqueue-core, --cfg workqueue_loom, LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2})"
# Own target dir (the cfg changes every crate's build); no LTO and more codegen units to build
# faster; debug assertions on, as tokio's loom CI does.
RUSTFLAGS="--cfg workqueue_loom" \
  LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" \
  CARGO_TARGET_DIR=target/loom \
  CARGO_PROFILE_RELEASE_LTO=false \
  CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  CARGO_PROFILE_RELEASE_DEBUG=0 \
  CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true \
  cargo test -p workqueue-core --release --lib loom -- --nocapture --test-threads=1

step "cargo-fuzz"
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi
cargo fuzz --version

step "fuzz build (stable, -s none)"
(cd fuzz && cargo fuzz build -s none)

step "fuzz: ${FUZZ_TARGETS[*]} for ${FUZZ_SECONDS}s each, concurrently"
declare -A pids
for t in "${FUZZ_TARGETS[@]}"; do
  (cd fuzz && exec cargo fuzz run -s none "$t" -- \
    -max_total_time="$FUZZ_SECONDS" -print_final_stats=1) >"target/fuzz-$t.log" 2>&1 &
  pids[$t]=$!
done
fuzz_failed=0
for t in "${FUZZ_TARGETS[@]}"; do
  if wait "${pids[$t]}"; then
    runs=$(grep -m1 '^stat::number_of_executed_units' "target/fuzz-$t.log" | awk '{print $2}' || true)
    cov=$(grep -E '^#[0-9]+[[:space:]]+DONE' "target/fuzz-$t.log" | tail -n1 |
      grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)
    echo "fuzz $t: ok, ${runs:-?} runs, ${cov:-cov ?}"
  else
    fuzz_failed=1
    echo "fuzz $t: FAILED (log target/fuzz-$t.log):"
    tail -n 60 "target/fuzz-$t.log"
    ls -1 "fuzz/artifacts/$t" 2>/dev/null | sed 's/^/  artifact: /' || true
  fi
done
if [ "$fuzz_failed" -ne 0 ]; then
  echo "verify: a fuzz target found a failure; reproduce with: (cd fuzz && cargo fuzz run -s none TARGET artifacts/TARGET/crash-...)"
  exit 1
fi

step "soak: ${SOAK_SECONDS}s, ${SOAK_THREADS} threads (release)"
cargo run --release -p workqueue-core --example soak -- \
  --seconds "$SOAK_SECONDS" --threads "$SOAK_THREADS"

step "async soak: ${SOAK_SECONDS}s, tokio queue (release)"
cargo run --release -p workqueue-tokio --example soak_async -- --seconds "$SOAK_SECONDS"

step "all verification passed"
