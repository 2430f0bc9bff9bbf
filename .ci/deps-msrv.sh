#!/usr/bin/env bash
# Fails if a dependency declares a `rust-version` newer than that of a workspace member that
# reaches it (each member is checked against its own: workqueue-kube needs 1.89 for kube, the
# others keep the workspace's 1.88). Ours would otherwise be a
# promise the build cannot keep. Other toolchains cannot be installed here, so this reads what
# `cargo metadata` reports for every package in Cargo.lock that the workspace (including
# dev-dependencies) resolves to on this platform. Packages without a `rust-version` are listed.
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
cargo metadata --format-version 1 --locked --filter-platform "$host" | python3 .ci/deps_msrv.py
