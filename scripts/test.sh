#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it: the Rust toolchain must
# exist; the wgpu backend's tests need a Vulkan driver, so without a GPU this installs lavapipe
# (Mesa's Vulkan on the CPU). Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
if [ "$(uname -s)" = Linux ] && ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then
    echo "installing lavapipe (mesa-vulkan-drivers) for the wgpu tests" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} # quiets Mesa
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --lib --tests "$@" 2>&1 | tee "$log" || status=$?
# The CPU hot loops are compiled twice (AVX2 and baseline x86-64, chosen at run time): run the
# numeric tests again on the baseline path.
if [ "$status" -eq 0 ] && [ "$(uname -m)" = "x86_64" ]; then
    RILL_NO_AVX2=1 cargo test --release --test quant_roundtrip --test quant_vectors --test cpu_ops \
        --test delta_rule --test e2e_fixtures "$@" 2>&1 | tee -a "$log" || status=$?
fi
# The wgpu kernels come in variants chosen from the adapter's features (subgroup reductions,
# cooperative matrices): run the device tests again on the plain path (what browsers get) and the
# fast-precision tests with the cooperative-matrix kernel emulated (lavapipe has no tensor cores).
if [ "$status" -eq 0 ]; then
    wgpu_tests=()
    for f in tests/wgpu_*.rs; do
        wgpu_tests+=(--test "$(basename "$f" .rs)")
    done
    RILL_WGPU_PLAIN=1 cargo test --release "${wgpu_tests[@]}" --test e2e_fixtures "$@" 2>&1 | tee -a "$log" || status=$?
fi
if [ "$status" -eq 0 ]; then
    RILL_WGPU_COOP_EMULATE=1 cargo test --release --test wgpu_fast "$@" 2>&1 | tee -a "$log" || status=$?
fi
# One closing line for the whole run: the sum over every test binary.
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '; ([0-9]+) failed' "$log" | grep -Eo '[0-9]+' | awk '{s+=$1} END {print s+0}')
if [ "$status" -eq 0 ] && [ "$passed" -eq 0 ]; then
    echo "no tests ran" >&2
    status=1
fi
echo "$passed passed, $failed failed"
exit "$status"
