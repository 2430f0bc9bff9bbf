#!/usr/bin/env bash
# W1 with the `metrics` feature off and on, back to back (issue: "an unnamed queue, or the feature
# off, costs nothing measurable"). Each build runs W1 for an unnamed and a named queue; with the
# feature on, the named queue emits client-go's metrics to the no-op recorder.
set -euo pipefail
cd "$(dirname "$0")/.."
for round in 1 2; do
  for features in "" "--features metrics"; do
    if [ -n "$features" ]; then state=on; else state=off; fi
    echo "== round $round: metrics feature $state =="
    # shellcheck disable=SC2086
    cargo run -q --release -p workqueue-benches --bin report $features -- --only W1 | grep -E '^\| W1 .*\| (ours|naive)'
  done
done
