#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
# Today the tests need only the Rust toolchain (CPU backend); GPU-backend tests will add their
# installs here (e.g. lavapipe for wgpu).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
cargo test --release --all-targets "$@"
