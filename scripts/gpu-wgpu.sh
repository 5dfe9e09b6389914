#!/usr/bin/env bash
# The wgpu backend on the lent H200 (Vulkan), in one call per phase; built and packed beforehand
# by scripts/pack-gpu.sh (no Rust on that machine). Logs go to $OUT (or ./out), a short summary
# is printed last.
#   bash scripts/gpu-wgpu.sh tests    # every wgpu test binary: subgroup path, plain path, Fast
#                                     # (cooperative matrices); ~3-5 min
#   bash scripts/gpu-wgpu.sh bench    # rill synth + rill bench: qwen3.5-9b q4_k_m and q8_0,
#                                     # qwen3.5-35b-a3b q4_k_m (pp102, pp512, tg128; exact and
#                                     # fast precision), and RILL_PROFILE=1 runs; ~6-9 min
#   bash scripts/gpu-wgpu.sh bench-9b / bench-35b   # the same, split (two shorter calls)
#   bash scripts/gpu-wgpu.sh all      # everything (may exceed a 10-minute command limit)
#   bash scripts/gpu-wgpu.sh smoke    # 1 minute: two test binaries and a tiny synth model's bench
# RILL_GPU_SETUP=0 skips the loader setup below (a dry run on a machine with its own Vulkan driver,
# e.g. RILL_GPU_SETUP=0 RILL_WGPU_ADAPTER=llvmpipe on lavapipe).
set -uo pipefail
cd "$(dirname "$0")/.."
phase=${1:-all}
out=${OUT:-$PWD/out}
mkdir -p "$out"
root=$PWD
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# Vulkan loader (TOOLCHAIN.md): the machine has the NVIDIA ICD but no loader.
if [ "${RILL_GPU_SETUP:-1}" = 1 ]; then
    for f in .gl/*.deb; do dpkg -x "$f" / ; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export RILL_WGPU_ADAPTER=${RILL_WGPU_ADAPTER:-h200}
export XDG_RUNTIME_DIR=/tmp

bin=/tmp/rill-gpu
rm -rf "$bin"
mkdir -p "$bin"
xz -dc .bin/wgpu/bins.tar.xz | tar -C "$bin" -xf -
# The test binaries read tests/fixtures from the directory they were built in: make that path
# this checkout.
manifest=$(cat "$bin/MANIFEST_DIR")
if [ "$manifest" != "$root" ] && [ ! -e "$manifest/tests/fixtures" ]; then
    mkdir -p "$(dirname "$manifest")"
    ln -sfn "$root" "$manifest"
fi
note "commit $(cat "$bin/COMMIT"), $(nvidia-smi -L 2>/dev/null | head -1)"

# One test binary in one environment; its result line goes to the summary.
run_test() {
    local name=$1 tag=$2
    shift 2
    local log="$out/test-$name-$tag.log"
    (cd "$root" && env "$@" timeout 600 "$bin/$name" --test-threads 4) >"$log" 2>&1
    local rc=$?
    note "$(printf '%-14s %-10s rc=%s %s' "$name" "$tag" "$rc" "$(grep -E '^test result' "$log" | tail -1)")"
    grep -E '^test .*FAILED|panicked' "$log" | head -5 | tee -a "$summary"
}

tests() {
    note "== tests (RILL_WGPU_ADAPTER=$RILL_WGPU_ADAPTER)"
    "$bin/rill" bench -m tests/fixtures/tiny-dense.F16.gguf --backend wgpu -p 8 -n 8 -r 1 2>&1 \
        | grep -E '^backend' | tee -a "$summary"
    for t in wgpu_smoke wgpu_ops wgpu_linear wgpu_moe wgpu_delta wgpu_pieces e2e_fixtures; do
        run_test "$t" subgroup
    done
    for t in wgpu_ops wgpu_linear wgpu_moe wgpu_pieces e2e_fixtures; do
        run_test "$t" plain RILL_WGPU_PLAIN=1
    done
    # Fast precision: the cooperative-matrix kernel on the H200 (its driver lists 16x16x16 f16).
    run_test wgpu_fast coop
    run_test wgpu_fast coop-emu RILL_WGPU_COOP_EMULATE=1
}

bench_model() {
    local shape=$1 quant=$2
    shift 2 # further arguments go to rill synth
    local model=/tmp/$shape-$quant.gguf
    "$bin/rill" synth --shape "$shape" --quant "$quant" -o "$model" "$@" >"$out/synth-$shape-$quant.log" 2>&1 \
        || { note "synth $shape $quant failed: $(tail -1 "$out/synth-$shape-$quant.log")"; return; }
    local md="$out/bench-$shape-$quant.md"
    timeout 300 "$bin/rill" bench -m "$model" --backend wgpu -p 102,512 -n 128 -r 2 >"$md" 2>"$out/bench-$shape-$quant.log"
    note "-- $shape $quant (exact): rc=$?"
    grep -E '^\| (pp|tg)' "$md" | tee -a "$summary"
    local fast="$out/bench-$shape-$quant-fast.md"
    RILL_PRECISION=fast timeout 200 "$bin/rill" bench -m "$model" --backend wgpu -p 102,512 -n 0 -r 2 \
        >"$fast" 2>"$out/bench-$shape-$quant-fast.log"
    note "-- $shape $quant (fast, cooperative matrices): rc=$?"
    grep -E '^backend|^\| pp' "$fast" | tee -a "$summary"
    # Per-kernel GPU time (timestamps inside the pass): one decode run, one prompt run. Tokens/s of
    # these runs are not the speed (profiling waits at every submission).
    RILL_PROFILE=1 timeout 200 "$bin/rill" bench -m "$model" --backend wgpu -p 0 -n 64 -r 1 --no-warmup \
        >"$out/profile-decode-$shape-$quant.md" 2>"$out/profile-decode-$shape-$quant.txt"
    RILL_PRECISION=fast RILL_PROFILE=1 timeout 200 "$bin/rill" bench -m "$model" --backend wgpu -p 512 -n 0 -r 1 \
        --no-warmup >"$out/profile-prefill-$shape-$quant.md" 2>"$out/profile-prefill-$shape-$quant.txt"
    note "   decode profile (top 6):"
    grep -A6 '^wgpu profile' "$out/profile-decode-$shape-$quant.txt" | tee -a "$summary"
    note "   prefill (fast) profile (top 6):"
    grep -A6 '^wgpu profile' "$out/profile-prefill-$shape-$quant.txt" | tee -a "$summary"
    rm -f "$model"
}

bench_9b() {
    note "== bench (rill bench, -r 2 after a warm-up)"
    bench_model qwen3.5-9b q4_k_m
    bench_model qwen3.5-9b q8_0
}

bench_35b() {
    note "== bench (rill bench, -r 2 after a warm-up)"
    bench_model qwen3.5-35b-a3b q4_k_m
}

smoke() {
    note "== smoke"
    for t in wgpu_smoke wgpu_ops; do
        run_test "$t" subgroup
    done
    bench_model tiny-dense q8_0 --tokenizer-from tests/fixtures/tiny-dense.F16.gguf
}

case "$phase" in
    smoke) smoke ;;
    tests) tests ;;
    bench)
        bench_9b
        bench_35b
        ;;
    bench-9b) bench_9b ;;
    bench-35b) bench_35b ;;
    all)
        tests
        bench_9b
        bench_35b
        ;;
    *)
        echo "usage: $0 smoke|tests|bench|bench-9b|bench-35b|all" >&2
        exit 2
        ;;
esac
echo
echo "==== summary ($out/summary.txt)"
cat "$summary"
