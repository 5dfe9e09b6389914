#!/usr/bin/env bash
# Builds the browser demo into web/pkg: the rill library for wasm32 with feature `web`, then
# wasm-bindgen's JS glue (--target web, loadable from a module worker). wasm-bindgen-cli must be
# exactly the version of the wasm-bindgen crate in Cargo.lock; it is installed once into
# web/.tools (git-ignored; a build takes ~7 minutes on 2 cores) and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    echo "adding the wasm32-unknown-unknown target" >&2
    rustup target add wasm32-unknown-unknown
fi

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if [ -z "$version" ]; then
    echo "no wasm-bindgen in Cargo.lock" >&2
    exit 1
fi
tools="$root/web/.tools/wasm-bindgen-cli-$version"
bindgen="$tools/bin/wasm-bindgen"
if [ ! -x "$bindgen" ] || [ "$("$bindgen" --version | awk '{print $2}')" != "$version" ]; then
    echo "installing wasm-bindgen-cli $version into web/.tools (once; takes minutes)" >&2
    # Its own target folder, so the project's build cache is left alone.
    CARGO_TARGET_DIR="$root/web/.tools/target" \
        cargo install wasm-bindgen-cli --version "$version" --root "$tools"
    rm -rf "$root/web/.tools/target"
fi

# No debug info in the wasm (the release profile keeps it for native profiling).
CARGO_PROFILE_RELEASE_DEBUG=0 cargo rustc --release --lib --crate-type cdylib \
    --target wasm32-unknown-unknown --no-default-features --features web
wasm="target/wasm32-unknown-unknown/release/rill.wasm"
rm -rf web/pkg
"$bindgen" --target web --no-typescript --out-dir web/pkg "$wasm"
echo "built web/pkg ($(du -k web/pkg/rill_bg.wasm | cut -f1) KiB of wasm)" >&2
