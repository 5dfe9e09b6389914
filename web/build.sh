#!/usr/bin/env bash
# Builds the browser demo into web/pkg: the rill library for wasm32 with feature `web`, then
# wasm-bindgen's JS glue (--target web, loadable from a module worker). wasm-bindgen-cli must be
# exactly the version of the wasm-bindgen crate in Cargo.lock; it is installed once into
# web/.tools (git-ignored) and reused: the release binary where it can be downloaded, else built
# from source.
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
have_bindgen() { [ -x "$bindgen" ] && [ "$("$bindgen" --version | awk '{print $2}')" = "$version" ]; }
# First the project's own release build of that version (the tarball wasm-pack fetches too: a
# static musl binary; seconds), checked by its version; where it cannot be had (no network,
# another platform), built from source (~7 minutes on 2 cores).
if ! have_bindgen && [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] && command -v curl >/dev/null 2>&1; then
    echo "fetching wasm-bindgen $version (the wasm-bindgen project's release build) into web/.tools" >&2
    name="wasm-bindgen-$version-x86_64-unknown-linux-musl"
    tmp=$(mktemp -d)
    if curl -fsSL --retry 2 -o "$tmp/b.tar.gz" \
        "https://github.com/wasm-bindgen/wasm-bindgen/releases/download/$version/$name.tar.gz" &&
        tar -xzf "$tmp/b.tar.gz" -C "$tmp" && [ -x "$tmp/$name/wasm-bindgen" ]; then
        mkdir -p "$tools/bin"
        cp "$tmp/$name/wasm-bindgen" "$bindgen"
    fi
    rm -rf "$tmp"
    have_bindgen || { echo "the download did not give wasm-bindgen $version" >&2; rm -f "$bindgen"; }
fi
if ! have_bindgen; then
    echo "installing wasm-bindgen-cli $version into web/.tools (once; takes minutes)" >&2
    # Its own target folder, so the project's build cache is left alone.
    CARGO_TARGET_DIR="$root/web/.tools/target" \
        cargo install wasm-bindgen-cli --version "$version" --root "$tools"
    rm -rf "$root/web/.tools/target"
fi

# No debug info in the wasm, whatever the caller sets for native profiling.
CARGO_PROFILE_RELEASE_DEBUG=0 cargo rustc --release --lib --crate-type cdylib \
    --target wasm32-unknown-unknown --no-default-features --features web
wasm="target/wasm32-unknown-unknown/release/rill.wasm"
rm -rf web/pkg
"$bindgen" --target web --no-typescript --out-dir web/pkg "$wasm"
echo "built web/pkg ($(du -k web/pkg/rill_bg.wasm | cut -f1) KiB of wasm)" >&2
