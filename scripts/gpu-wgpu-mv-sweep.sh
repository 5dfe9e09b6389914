#!/usr/bin/env bash
# The decode matrix-vector geometry sweep on the lent H200 (Vulkan), from the bundle of
# scripts/pack-gpu-wgpu.sh: `rill bench -p "" -n 32 -r 1` on the synthesized 9B Q4_K_M file once
# per geometry of the knobs (src/backend/wgpu/caps.rs: RILL_WGPU_MV_WG invocations per workgroup,
# RILL_WGPU_MV_ROWS rows per invocation, RILL_WGPU_MV_LANES lanes per row group), then a
# RILL_PROFILE=1 decode of the fastest (per-kernel GPU time and GB/s) and of the default, and the
# matrix op tests (device_linear) under the fastest geometry. Alone:
#   bash scripts/pack-gpu-wgpu.sh    # here, then on the GPU machine:
#   run(command="bash scripts/gpu-wgpu-mv-sweep.sh", carry=[".gpu-wgpu", ".gl"])
# or after scripts/gpu-wgpu.sh in the same call (it reuses the model that script left in
# $MODELS). Keeps to SWEEP_BUDGET_S (default 150 s; a variant that no longer fits is skipped and
# says so). Writes $OUT/mv-sweep.txt (the table, the best geometry, both profiles) and
# $OUT/mv-sweep-logs.tar.gz. SWEEP_MODEL=FILE sweeps another model; RILL_GPU_SETUP=0 as in
# scripts/gpu-wgpu.sh (e.g. a dry run on lavapipe: RILL_GPU_SETUP=0 RILL_WGPU_ADAPTER=llvmpipe
# SWEEP_MODEL=tests/fixtures/tiny-dense.Q4_K_M.gguf).
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
BUDGET=${SWEEP_BUDGET_S:-150}
OUT=${OUT:-$PWD/out}
MODELS=${MODELS:-/tmp/rill-models}
mkdir -p "$OUT" "$MODELS"
logs=$(mktemp -d /tmp/rill-mv-sweep.XXXXXX)
table=$OUT/mv-sweep.txt
left() { echo $((BUDGET - (SECONDS - t0))); }
# shellcheck source=scripts/gpu-wgpu-setup.sh
. scripts/gpu-wgpu-setup.sh || exit 1
model=${SWEEP_MODEL:-$MODELS/qwen3.5-9b-q4_k_m.gguf}
if [ ! -s "$model" ]; then
    timeout 60 "$rill" synth --shape qwen3.5-9b --quant q4_k_m -o "$model.part" >"$logs/synth.log" 2>&1 &&
        mv "$model.part" "$model"
fi
{
    echo "decode matvec geometry sweep: commit $(cat .gpu-wgpu/commit), $(basename "$model"), tg32 -r 1"
    echo
    echo "| workgroup | rows/inv | lanes | tg32 t/s |"
    echo "|---|---|---|---|"
} >"$table"

# Workgroup, rows per invocation, lanes per row group; the default (128 2 32, src/backend/wgpu/caps.rs)
# first, then the likeliest others (a short budget skips the tail).
variants=(
    "128 2 32" "128 4 32" "128 8 32" "128 4 16" "128 4 64" "128 2 64"
    "128 8 128" "256 4 32" "256 8 64" "64 4 32" "128 1 32" "256 4 128"
)
best=""
best_tps=0
for v in "${variants[@]}"; do
    read -r wg rows lanes <<<"$v"
    log="$logs/tg-$wg-$rows-$lanes.log"
    # 50 s kept back for the two profiles and the test run.
    if [ "$(left)" -lt 50 ]; then
        echo "| $wg | $rows | $lanes | skipped (budget) |" >>"$table"
        continue
    fi
    RILL_WGPU_MV_WG=$wg RILL_WGPU_MV_ROWS=$rows RILL_WGPU_MV_LANES=$lanes \
        timeout -k 5 25 "$rill" bench -m "$model" --backend wgpu -p "" -n 32 -r 1 >"$log" 2>&1
    st=$?
    tps=$(sed -n 's/^tg32: \([0-9.]*\) .*/\1/p' "$log" | tail -1)
    echo "| $wg | $rows | $lanes | ${tps:-exit $st} |" >>"$table"
    if [ -n "$tps" ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$tps" "$best_tps"; then
        best=$v
        best_tps=$tps
    fi
done

profile() { # TAG WG ROWS LANES
    local p="$logs/profile-$1.txt"
    if [ "$(left)" -lt 20 ]; then
        echo "profile $1: skipped (budget)" >>"$table"
        return
    fi
    RILL_PROFILE=1 RILL_WGPU_MV_WG=$2 RILL_WGPU_MV_ROWS=$3 RILL_WGPU_MV_LANES=$4 \
        timeout -k 5 30 "$rill" bench -m "$model" --backend wgpu -p "" -n 32 -r 1 --no-warmup >"$p" 2>&1
    local st=$?
    {
        echo
        echo "profile $1 (workgroup $2, rows $3, lanes $4; exit $st):"
        grep -A14 '^wgpu profile' "$p"
    } >>"$table"
}
{
    echo
    echo "best: ${best:-none} (${best_tps} t/s; workgroup rows lanes)"
} >>"$table"
if [ -n "$best" ]; then
    # shellcheck disable=SC2086
    profile best $best
fi
[ "$best" != "128 2 32" ] && profile default 128 2 32
# The op tests of the matrix kernels under the winner's geometry (the default's ran in
# scripts/gpu-wgpu.sh), so that making it the default is safe.
if [ -n "$best" ] && [ -x "$bin/device_linear" ] && [ "$(left)" -ge 20 ]; then
    read -r wg rows lanes <<<"$best"
    RILL_TEST_BACKENDS=wgpu RILL_WGPU_MV_WG=$wg RILL_WGPU_MV_ROWS=$rows RILL_WGPU_MV_LANES=$lanes \
        timeout -k 5 $(($(left) - 5)) "$bin/device_linear" --test-threads=4 >"$logs/test-device_linear-best.log" 2>&1
    st=$?
    {
        echo
        echo "device_linear under the best geometry: exit $st, $(grep -E '^test result:' "$logs/test-device_linear-best.log" | tail -1)"
        grep -E '^test .* FAILED$|panicked at' "$logs/test-device_linear-best.log" | head -6
    } >>"$table"
fi
echo "sweep: $((SECONDS - t0)) s" >>"$table"
tar -C "$logs" -czf "$OUT/mv-sweep-logs.tar.gz" . && rm -rf "$logs"
cat "$table"
