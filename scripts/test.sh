#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it: the Rust toolchain must
# exist; the wgpu backend's tests need a Vulkan driver, so without a GPU this installs lavapipe
# (Mesa's Vulkan on the CPU). Extra arguments go to every test binary (a test name filter, say).
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
work=$(mktemp -d)
trap 'rm -rf "$log" "$work"' EXIT
status=0
# Every test binary is built once, with the cuda feature (wgpu stays on): the CUDA op and
# end-to-end tests run where an NVIDIA GPU is and are skipped elsewhere.
echo "building the test binaries (cargo test --release --features cuda --no-run)" >&2
if ! cargo test --release --features cuda --lib --tests --no-run --message-format=json-render-diagnostics \
    >"$work/build.json"; then
    echo "the build failed" >&2
    exit 1
fi
# name -> executable ("lib" for the library's unit tests).
python3 - "$work/build.json" >"$work/bins" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        print("lib" if kind == "lib" else m["target"]["name"], m["executable"])
PY
bin_of() { awk -v n="$1" '$1 == n { print $2 }' "$work/bins"; }
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then
    echo "CUDA device tests skipped: no NVIDIA driver on this machine (the kernels were compiled)" | tee -a "$log"
fi

# The jobs: one test binary under one environment each. Lavapipe runs one device per process
# (tests/common/mod.rs) and executes a small model's dispatches mostly on one core, so jobs run
# side by side, RILL_TEST_JOBS at a time (default: the number of cores), longest first, each into
# its own log. Extra arguments of this script go to every test binary (a name filter, say).
labels=()
envs=()
cmds=()
job() { # job LABEL "ENV=..." BINARY [ARGS...] (BINARY: a test target, or a command for `bash -c`)
    labels+=("$1")
    envs+=("$2")
    local b=$3
    shift 3
    if [ "$b" = "-c" ]; then
        cmds+=("$1")
    else
        local path
        path=$(bin_of "$b")
        if [ -z "$path" ]; then
            echo "no test binary named $b" >&2
            exit 1
        fi
        cmds+=("$(printf '%q ' "$path" "$@" "${extra[@]}")")
    fi
}
extra=("$@")
all_tests=$(awk '{ print $1 }' "$work/bins")
device_tests=$(printf '%s\n' $all_tests | grep '^device_' || true)
wgpu="RILL_TEST_BACKENDS=wgpu"
# The wgpu kernels come in variants chosen from the adapter's features (src/backend/wgpu/caps.rs)
# and fused decode dispatches chosen from its limits (policy.rs): each variant lavapipe can run
# gets the device op tests and the end-to-end fixtures, with the features of the build above (no
# second build), through the test harness's RILL_TEST_WGPU (tests/common: a comma list of
# `WgpuOptions`, which limit or override the adapter's capabilities; the library reads none of
# these from the environment).
#  - plain: what browsers get (no subgroups), with naga's runtime checks back on (`checks`) for
#    the op tests, so every kernel runs compiled with and without them; its end-to-end run (a job
#    of its own, the longest) without them, as the kernels ship.
#  - the decode kernels' geometry at its extremes: one row per invocation and one lane per row
#    (no reduction) on the subgroup path; eight rows (two for the formats decoded element by
#    element: kernels.rs MV_GENERIC_MAX_ROWS) and a whole 256-invocation workgroup per row group
#    (two-level reduction) on the plain path; both with the packed-integer-dot K-quant units
#    (`dot`, off by default on lavapipe, a CPU adapter). The MoE race test and the shared-expert
#    tests are left to the other passes (their prompt-sized cases compose kernels these passes
#    cover) except the fused decode shapes (moe_swiglu_sh and moe_down_sh take the geometry:
#    experts_shared_decode_shapes, route_experts_shared_decode_shapes). The SwiGLU that writes the
#    down product's planes (on with the dot units) runs in both passes and in the dot synth job.
#  - the fused decode dispatches off (`nofusion`, with the dot units): every fallback a fused
#    dispatch replaces (norms and the SwiGLU without planes and the products' own preparation, the
#    products one by one, the attention gate and preparation, the MoE shared expert composed).
#  - at most 8 storage buffers per kernel (browsers): the fused decode dispatches' fallbacks
#    (matrix-vector groups of 3, the attention preparation in halves, the gates separate), by op
#    test and end to end on one dense quantized row (every fallback of a layer), the MoE row and
#    the prefill-then-decode split, with the packed-integer-dot units.
#  - fast precision with the cooperative-matrix kernel emulated (lavapipe has no tensor cores).
plain="$wgpu RILL_TEST_WGPU=plain"
checked="$wgpu RILL_TEST_WGPU=plain,checks"
# (mv_min_wg=0: small products would otherwise widen their one lane again.)
mv_a="$wgpu RILL_TEST_WGPU=dot,mv_wg=64,mv_rows=1,mv_lanes=1,mv_min_wg=0"
mv_b="$wgpu RILL_TEST_WGPU=dot,plain,mv_wg=256,mv_rows=8,mv_lanes=256"
unfused="$wgpu RILL_TEST_WGPU=nofusion,dot"
narrow="$wgpu RILL_TEST_WGPU=max_storage=8"
# Longest first (minutes on a 2-core machine, roughly): the end-to-end runs, the MoE and synth
# suites, then the rest.
job "e2e_fixtures" "" e2e_fixtures
job "e2e_fixtures (plain)" "$plain" e2e_fixtures
job "device_moe" "" device_moe
# synth_runs in four jobs: the 24-layer models in two of three (a model's tests run a few minutes
# on lavapipe), the tiny MoE shape's every quant, the rest.
job "synth_runs (deep dense)" "" synth_runs deep_dense
job "synth_runs (deep moe)" "" synth_runs deep_moe
job "synth_runs (tiny moe)" "" synth_runs every_quant_of_tiny_moe
job "synth_runs (the rest)" "" synth_runs --skip deep_ --skip every_quant_of_tiny_moe
job "e2e_fixtures (8 bindings, dot)" "$wgpu RILL_TEST_WGPU=max_storage=8,dot" e2e_fixtures \
    q4_k_m_matches moe_f16_matches prefill_then_decode
job "device_moe (plain, checks)" "$checked" device_moe
# The dense FFN's SwiGLU writing the down product's planes (the fixtures' rows are too short for it).
job "synth_runs (dot)" "$wgpu RILL_TEST_WGPU=dot" synth_runs dense_ffn_planes_decode_matches_prefill
moe_skip=(--skip concurrent_callers --skip experts_shared_f32 --skip experts_shared_q4_k --skip experts_shared_q8_0
    --skip experts_shared_q6_k --skip experts_shared_mixed)
job "device_moe (mv extremes a)" "$mv_a" device_moe "${moe_skip[@]}"
job "device_moe (mv extremes b)" "$mv_b" device_moe "${moe_skip[@]}"
for t in device_linear device_group; do
    job "$t (mv extremes a)" "$mv_a" "$t"
done
job "device_linear (mv extremes b)" "$mv_b" device_linear
for t in device_linear device_group device_fused device_moe; do
    job "$t (no fusion, dot)" "$unfused" "$t"
done
job "prefix_cache" "" prefix_cache
for t in $device_tests; do
    [ "$t" = device_moe ] && continue
    job "$t" "" "$t"
    job "$t (plain, checks)" "$checked" "$t"
done
for t in device_fused device_group; do
    job "$t (8 bindings)" "$narrow" "$t"
done
job "device_fast (coop emulated)" "$wgpu RILL_TEST_WGPU=coop_emulate" device_fast
for t in $all_tests; do
    case "$t" in device_* | e2e_fixtures | synth_runs | prefix_cache) continue ;; esac
    job "$t" "" "$t"
done
# The CPU hot loops are compiled twice (AVX2 and baseline x86-64, chosen at run time): the numeric
# tests again on the baseline path (the CPU backend only).
if [ "$(uname -m)" = "x86_64" ]; then
    for t in quant_roundtrip quant_vectors cpu_ops delta_rule e2e_fixtures; do
        job "$t (baseline x86-64)" "RILL_TEST_BACKENDS=cpu RILL_NO_AVX2=1" "$t"
    done
fi
# The CUDA weight decoders, compiled for the CPU, against ggml's dequantization (seconds; the
# whole-kernel emulation, dev/cuda/emulate.sh, runs before every GPU job in scripts/pack-gpu.sh).
job "dev/cuda/check_formats.sh" "" -c "bash dev/cuda/check_formats.sh"

# `rill serve` against the real OpenAI Python client (tests/server): the pinned client goes into a
# git-ignored virtual environment, made again whenever the pins change. The build above made
# target/release/rill.
server_tests() {
    local venv=.venv-test
    if ! cmp -s tests/server/requirements.txt "$venv/requirements.txt" 2>/dev/null; then
        echo "installing the server test requirements into $venv"
        rm -rf "$venv"
        if ! python3 -m venv "$venv" 2>/dev/null; then
            # Debian's python3 ships venv support separately.
            local sudo=""
            [ "$(id -u)" -eq 0 ] || sudo=sudo
            $sudo apt-get update -qq
            DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$venv"
            python3 -m venv "$venv"
        fi
        "$venv/bin/pip" install -q --disable-pip-version-check -r tests/server/requirements.txt
        cp tests/server/requirements.txt "$venv/requirements.txt"
    fi
    RILL_BIN=target/release/rill "$venv/bin/python" -m pytest tests/server -q -p no:cacheprovider
}
export -f server_tests
job "tests/server (pytest)" "" -c server_tests
# The browser demo in headless Chromium (web/test.sh installs Chromium, playwright-core and the
# wasm tools it needs, builds the page and prints one "[web-test] ok" or "[web-test] FAIL" line
# per check). First in line: its downloads and builds overlap the lavapipe jobs.
labels=("web/test.sh (browser)" "${labels[@]}")
envs=("RILL_CARGO_FEATURES=cuda" "${envs[@]}")
cmds=("bash web/test.sh" "${cmds[@]}")

run_job() { # run_job INDEX: the job's output into its log, its exit status and seconds beside it
    local i=$1 start=$SECONDS rc=0
    env ${envs[$i]} bash -c "${cmds[$i]}" >"$work/job$i.log" 2>&1 </dev/null || rc=$?
    echo "$rc $((SECONDS - start))" >"$work/job$i.rc"
}
width=${RILL_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
n=${#labels[@]}
echo "running $n test jobs, $width at a time" >&2
done_jobs=0
report() { # the jobs that ended since the last call, one line each
    local i
    for ((i = 0; i < n; i++)); do
        if [ -f "$work/job$i.rc" ] && [ ! -f "$work/job$i.told" ]; then
            touch "$work/job$i.told"
            done_jobs=$((done_jobs + 1))
            read -r rc secs <"$work/job$i.rc"
            local result
            result=$(grep -E '^test result:' "$work/job$i.log" | tail -1 | sed 's/; finished in.*//' || true)
            [ "$rc" -eq 0 ] || result="FAILED (exit $rc) ${result}"
            printf '[%2d/%d] %4ss  %-42s %s\n' "$done_jobs" "$n" "$secs" "${labels[$i]}" "${result:-ok}" >&2
        fi
    done
}
# The server tests bound /health's latency while clients flood the server: they run alone, after
# the others, so that another job's CPU does not stand in for the server's own.
alone="tests/server (pytest)"
for ((i = 0; i < n; i++)); do
    [ "${labels[$i]}" = "$alone" ] && continue
    while [ "$(jobs -rp | wc -l)" -ge "$width" ]; do
        wait -n || true
        report
    done
    run_job "$i" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
    wait -n || true
    report
done
for ((i = 0; i < n; i++)); do
    [ "${labels[$i]}" = "$alone" ] && run_job "$i"
done
report
# Every job's output into the run's log (a failing job's in full on the terminal, at the end).
for ((i = 0; i < n; i++)); do
    rc=1 secs="?"
    [ -f "$work/job$i.rc" ] && read -r rc secs <"$work/job$i.rc"
    { echo "== ${labels[$i]}: exit $rc, ${secs} s"; cat "$work/job$i.log"; } >>"$log"
    if [ "$rc" -ne 0 ]; then
        status=1
        echo "== ${labels[$i]} failed (exit $rc); its output:"
        cat "$work/job$i.log"
    fi
done
# One closing line for the whole run: the sum over every test binary (`test result:` lines), the
# server tests (pytest's summary line) and the browser checks.
py_summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -1 || true)
py_passed=$(echo "$py_summary" | grep -Eo '[0-9]+ passed' | grep -Eo '[0-9]+' || echo 0)
py_failed=$(echo "$py_summary" | grep -Eo '[0-9]+ failed' | grep -Eo '[0-9]+' || echo 0)
web_passed=$(grep -c '^\[web-test\] ok' "$log" || true)
web_failed=$(grep -c '^\[web-test\] FAIL' "$log" || true)
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
