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
# The CUDA backend's kernels must compile on every run, GPU or not: find nvcc (build.rs looks in
# NVCC, CUDA_HOME, CUDA_PATH, .cuda/, PATH, /usr/local/cuda) or install the pinned CUDA 13.0
# compiler from PyPI into the git-ignored .cuda/ (about 100 MB, once).
have_nvcc() {
    [ -n "${NVCC:-}" ] && [ -x "$NVCC" ] && return 0
    [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ] && return 0
    [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ] && return 0
    ls .cuda/lib/python3*/site-packages/nvidia/cu13/bin/nvcc >/dev/null 2>&1 && return 0
    command -v nvcc >/dev/null 2>&1 && return 0
    [ -x /usr/local/cuda/bin/nvcc ]
}
if ! have_nvcc; then
    echo "installing the pinned CUDA 13.0 nvcc into .cuda/ (PyPI)" >&2
    python3 -m venv .cuda
    .cuda/bin/pip install -q nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# Everything with the cuda feature (wgpu stays on): the CUDA op and end-to-end tests run where an
# NVIDIA GPU is and are skipped elsewhere.
cargo test --release --features cuda --lib --tests "$@" 2>&1 | tee "$log" || status=$?
# The CUDA weight decoders, compiled for the CPU, against ggml's dequantization (seconds; the
# whole-kernel emulation, dev/cuda/emulate.sh, runs before every GPU job in scripts/pack-gpu.sh).
bash dev/cuda/check_formats.sh 2>&1 | tee -a "$log" || status=1
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then
    echo "CUDA device tests skipped: no NVIDIA driver on this machine (the kernels were compiled)" | tee -a "$log"
fi
# The CPU hot loops are compiled twice (AVX2 and baseline x86-64, chosen at run time): run the
# numeric tests again on the baseline path (the CPU backend only: RILL_TEST_BACKENDS=cpu).
if [ "$status" -eq 0 ] && [ "$(uname -m)" = "x86_64" ]; then
    RILL_TEST_BACKENDS=cpu RILL_NO_AVX2=1 cargo test --release --features cuda --test quant_roundtrip --test quant_vectors --test cpu_ops \
        --test delta_rule --test e2e_fixtures "$@" 2>&1 | tee -a "$log" || status=$?
fi
# The wgpu kernels come in variants chosen from the adapter's features (subgroup reductions,
# cooperative matrices): run the device tests again on the plain path (what browsers get) and the
# fast-precision tests with the cooperative-matrix kernel emulated (lavapipe has no tensor cores),
# on wgpu only, with the features of the build above (no second build). The plain pass also turns
# naga's runtime checks back on (RILL_WGPU_SHADER_CHECKS=1), so every kernel runs both compiled
# with and without them.
if [ "$status" -eq 0 ]; then
    device_tests=()
    for f in tests/device_*.rs; do
        device_tests+=(--test "$(basename "$f" .rs)")
    done
    RILL_TEST_BACKENDS=wgpu RILL_WGPU_PLAIN=1 RILL_WGPU_SHADER_CHECKS=1 cargo test --release --features cuda "${device_tests[@]}" --test e2e_fixtures "$@" 2>&1 \
        | tee -a "$log" || status=$?
fi
# The decode kernels' geometry knobs (src/backend/wgpu/caps.rs) at their extremes: one row per
# invocation and one lane per row (no reduction) on the subgroup path, eight rows and a whole
# 256-invocation workgroup per row group (two-level reduction) on the plain path. (The MoE
# concurrency test checks for races between callers, which no geometry knob changes: it ran above.)
# Both with the packed-integer-dot K-quant units (RILL_WGPU_MV_DOT=1; off by default on lavapipe,
# a CPU adapter, so the passes above run the f32 units).
if [ "$status" -eq 0 ]; then
    RILL_TEST_BACKENDS=wgpu RILL_WGPU_MV_DOT=1 RILL_WGPU_MV_WG=64 RILL_WGPU_MV_ROWS=1 RILL_WGPU_MV_LANES=1 \
        cargo test --release --features cuda --test device_linear --test device_moe --test device_group "$@" \
        -- --skip concurrent_callers 2>&1 | tee -a "$log" || status=$?
fi
if [ "$status" -eq 0 ]; then
    RILL_TEST_BACKENDS=wgpu RILL_WGPU_MV_DOT=1 RILL_WGPU_PLAIN=1 RILL_WGPU_MV_WG=256 RILL_WGPU_MV_ROWS=8 \
        RILL_WGPU_MV_LANES=256 \
        cargo test --release --features cuda --test device_linear --test device_moe "$@" \
        -- --skip concurrent_callers 2>&1 | tee -a "$log" || status=$?
fi
# The fused decode dispatches' fallbacks where a kernel may bind only WebGPU's guaranteed 8
# storage buffers (browsers): matrix-vector groups of 3, the attention preparation in halves, the
# gates separate; on the subgroup path here, the plain one (with the full fused set) ran above.
# End to end, one dense row (a quantized file: every fallback of a layer) and the MoE row, by
# prefill, decode and greedy, and the prefill-then-decode split (the other rows run the same
# dispatches on other weight formats, which the op tests cover at this limit); the end-to-end
# rows with the packed-integer-dot K-quant units (RILL_WGPU_MV_DOT=1).
if [ "$status" -eq 0 ]; then
    RILL_TEST_BACKENDS=wgpu RILL_WGPU_MAX_STORAGE=8 cargo test --release --features cuda --test device_fused --test device_group \
        "$@" 2>&1 | tee -a "$log" || status=$?
fi
if [ "$status" -eq 0 ]; then
    RILL_TEST_BACKENDS=wgpu RILL_WGPU_MAX_STORAGE=8 RILL_WGPU_MV_DOT=1 cargo test --release --features cuda --test e2e_fixtures "$@" -- \
        q4_k_m_matches moe_f16_matches prefill_then_decode 2>&1 | tee -a "$log" || status=$?
fi
if [ "$status" -eq 0 ]; then
    RILL_TEST_BACKENDS=wgpu RILL_WGPU_COOP_EMULATE=1 cargo test --release --features cuda --test device_fast "$@" 2>&1 \
        | tee -a "$log" || status=$?
fi
# `rill serve` against the real OpenAI Python client (tests/server): the pinned client goes into a
# git-ignored virtual environment, made again whenever the pins change. `cargo test` above built
# target/release/rill.
py_passed=0
py_failed=0
if [ "$status" -eq 0 ]; then
    venv=.venv-test
    if ! cmp -s tests/server/requirements.txt "$venv/requirements.txt" 2>/dev/null; then
        echo "installing the server test requirements into $venv" >&2
        rm -rf "$venv"
        if ! python3 -m venv "$venv" 2>/dev/null; then
            # Debian's python3 ships venv support separately.
            sudo=""
            [ "$(id -u)" -eq 0 ] || sudo=sudo
            $sudo apt-get update -qq
            DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$venv"
            python3 -m venv "$venv"
        fi
        "$venv/bin/pip" install -q --disable-pip-version-check -r tests/server/requirements.txt
        cp tests/server/requirements.txt "$venv/requirements.txt"
    fi
    pylog=$(mktemp)
    RILL_BIN=target/release/rill "$venv/bin/python" -m pytest tests/server -q -p no:cacheprovider 2>&1 | tee "$pylog" || status=$?
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$pylog" | tail -1 || true)
    py_passed=$(echo "$summary" | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+' || echo 0)
    py_failed=$(echo "$summary" | grep -Eo '[0-9]+ failed' | grep -Eo '[0-9]+' || echo 0)
    rm -f "$pylog"
fi
# The browser demo in headless Chromium (web/test.sh installs Chromium, playwright-core and the
# wasm tools it needs; each of its checks prints one "[web-test] ok" or "[web-test] FAIL" line).
web_passed=0
web_failed=0
if [ "$status" -eq 0 ]; then
    weblog=$(mktemp)
    RILL_CARGO_FEATURES=cuda bash web/test.sh 2>&1 | tee "$weblog" || status=$?
    web_passed=$(grep -c '^\[web-test\] ok' "$weblog" || true)
    web_failed=$(grep -c '^\[web-test\] FAIL' "$weblog" || true)
    rm -f "$weblog"
fi
# One closing line for the whole run: the sum over every test binary, the server tests and the
# browser checks.
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' |
    awk -v p="$((py_passed + web_passed))" '{s+=$1} END {print s+p}')
failed=$(grep -Eo '; ([0-9]+) failed' "$log" | grep -Eo '[0-9]+' |
    awk -v f="$((py_failed + web_failed))" '{s+=$1} END {print s+f}')
if [ "$status" -eq 0 ] && [ "$passed" -eq 0 ]; then
    echo "no tests ran" >&2
    status=1
fi
echo "$passed passed, $failed failed"
exit "$status"
