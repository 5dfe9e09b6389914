#!/usr/bin/env bash
# The browser demo's end-to-end test: installs what it needs (Chromium, playwright-core, the
# wasm32 target, wasm-bindgen-cli), builds web/pkg, computes the expected tokens natively (CPU
# backend), serves the page on 127.0.0.1 and drives headless Chromium through it (web/test.mjs).
# Exits non-zero on any failure. Writes web/out/demo.png and web/out/results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
out=web/out
cache=web/.cache
mkdir -p "$out" "$cache"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
apt_install() {
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
chromium=${CHROMIUM:-$(command -v chromium || true)}
if [ -z "$chromium" ]; then
    echo "installing chromium" >&2
    apt_install chromium
    chromium=$(command -v chromium)
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "installing node and npm" >&2
    apt_install nodejs npm
fi
if [ ! -d web/node_modules/playwright-core ]; then
    (cd web && npm ci --no-audit --no-fund --silent)
fi

bash web/build.sh

# The reference: the same chat turn, greedy, on the native CPU backend. RILL_CARGO_FEATURES: the
# features of the caller's release build (scripts/test.sh builds with `cuda`), so that it is reused.
cargo build --release --bin rill --example greedy_tokens ${RILL_CARGO_FEATURES:+--features "$RILL_CARGO_FEATURES"}
prompt="Write a haiku about rivers."
greedy() { target/release/examples/greedy_tokens "$1" "$prompt" 16 --backend cpu; }
dense=tests/fixtures/tiny-dense.Q4_K_M.gguf
moe=tests/fixtures/tiny-moe.F16.gguf
# Served next to the page for the URL download test.
cp "$dense" "$cache/tiny-dense.Q4_K_M.gguf"
synth="$cache/synth-qwen3.5-0.8b.Q4_K_M.gguf"
trap 'rm -f "$synth"' EXIT
target/release/rill synth --shape qwen3.5-0.8b --quant q4_k_m -o "$synth"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$out/expected.json" <<JSON
{
  "prompt": "$prompt",
  "models": [
    {"path": "$PWD/$dense", "tokens": $(greedy "$dense")},
    {"path": "$PWD/$moe", "tokens": $(greedy "$moe")}
  ],
  "url": {"href": "http://127.0.0.1:$port/.cache/tiny-dense.Q4_K_M.gguf", "tokens": $(greedy "$dense")},
  "synth": {"path": "$PWD/$synth", "prompt": "Hi",
            "tokens": $(target/release/examples/greedy_tokens "$synth" Hi 1 --raw --backend cpu)}
}
JSON

bash web/serve.sh "$port" >"$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$synth"' EXIT
for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" 2>/dev/null && break
    sleep 0.2
done

BASE_URL="http://127.0.0.1:$port/" EXPECTED="$out/expected.json" OUT="$out" CHROMIUM="$chromium" \
    node web/test.mjs
