#!/usr/bin/env bash
# Public-API snapshot check: fails when a published crate's public API differs from the listing
# committed in api/<crate>.txt, so that a change of surface is always deliberate.
#
#   bash .ci/api.sh           check (CI)
#   bash .ci/api.sh --bless   rewrite api/*.txt from the current code; commit the diff with the change
#
# The listing comes from rustdoc's JSON output (all features), built on the stable toolchain with
# RUSTC_BOOTSTRAP=1, and rendered by .ci/api.py. Its own target dir: RUSTC_BOOTSTRAP is part of
# cargo's fingerprint, so sharing `target/` would rebuild dependencies on every switch.
set -euo pipefail
cd "$(dirname "$0")/.."

CRATES=(workqueue-ratelimit workqueue-core workqueue-tokio workqueue-kube)
bless=0
case "${1:-}" in
  --bless) bless=1 ;;
  "") ;;
  *) echo "usage: $0 [--bless]" >&2; exit 2 ;;
esac

target="${CARGO_TARGET_DIR:-target}/api"
mkdir -p api "$target"
failed=0
built=()
for crate in "${CRATES[@]}"; do
  json="$target/doc/${crate//-/_}.json"
  rm -f "$json"
  RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$target" cargo rustdoc --quiet -p "$crate" --all-features \
    -- -Z unstable-options --output-format json
  # Earlier crates' JSON lets a dependency's items appear under their public paths.
  python3 .ci/api.py "$json" "${built[@]}" >"$target/$crate.txt"
  built+=("$json")
  if [ "$bless" -eq 1 ]; then
    cp "$target/$crate.txt" "api/$crate.txt"
    echo "api/$crate.txt: $(grep -vc '^\(unsafe \)\?impl' "api/$crate.txt") items, $(grep -c '^\(unsafe \)\?impl' "api/$crate.txt") trait impls"
  elif ! diff -u "api/$crate.txt" "$target/$crate.txt"; then
    failed=1
  fi
done
if [ "$failed" -ne 0 ]; then
  echo "The public API changed (diff above: - committed, + now). If that is intended, run" >&2
  echo "  bash .ci/api.sh --bless" >&2
  echo "and commit api/*.txt with the change." >&2
  exit 1
fi
[ "$bless" -eq 1 ] || echo "public API matches api/*.txt"
