#!/usr/bin/env bash
# The tensor-core prefill kernel sweep on the lent H200 (Vulkan), from the bundle of
# scripts/pack-gpu-wgpu.sh: for the first kernel (RILL_WGPU_COOP=1, matmul_coop.wgsl) and each
# geometry of the second (RILL_WGPU_COOP=2, matmul_coop2.wgsl; knobs in src/backend/wgpu/caps.rs:
# RILL_WGPU_COOP_TILE rows x tokens x k [/ subgroup piece], RILL_WGPU_COOP_BUF staging buffers,
# RILL_WGPU_COOP_DIRECT=0 full tiles through workgroup memory), in that order:
#   1. the fast-tier op tests (device_fast: the kernel against the CPU at the f16 tier; a
#      geometry that fails them has no trustworthy speed),
#   2. `rill bench -p 512 -n 0 -r 2 --precision fast` on the synthesized 9B Q4_K_M file (pp512),
#   3. a RILL_PROFILE=1 pp512 (per-kernel GPU time; its tokens/s are not the speed);
# then the matrix op tests (device_linear; the exact tier, which no coop knob touches) under the
# fastest geometry. The `prefill` column is what the backend says it runs: a geometry the device
# cannot hold falls back to the default, and that shows there. Alone:
#   bash scripts/pack-gpu-wgpu.sh    # here, then on the GPU machine:
#   run(command="bash scripts/gpu-wgpu-prefill-sweep.sh", carry=[".gpu-wgpu", ".gl"])
# or after scripts/gpu-wgpu.sh in the same call (it reuses the model that script left in
# $MODELS). Keeps to SWEEP_BUDGET_S (default 560 s; a variant that no longer fits is skipped and
# says so). Writes $OUT/prefill-sweep.txt (the table, the profiles' matmul lines) and
# $OUT/prefill-sweep-logs.tar.gz. SWEEP_MODEL=FILE sweeps another model, SWEEP_PROMPT=N another
# prompt length; SWEEP_VARIANTS="a b" picks variants by name (see `variants` below);
# RILL_GPU_SETUP=0 as in scripts/gpu-wgpu.sh (e.g. a dry run on lavapipe: RILL_GPU_SETUP=0
# RILL_WGPU_ADAPTER=llvmpipe RILL_WGPU_COOP_EMULATE=1 SWEEP_MODEL=tests/fixtures/tiny-dense.Q4_K_M.gguf
# SWEEP_PROMPT=70).
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
BUDGET=${SWEEP_BUDGET_S:-560}
PROMPT=${SWEEP_PROMPT:-512}
OUT=${OUT:-$PWD/out}
MODELS=${MODELS:-/tmp/rill-models}
mkdir -p "$OUT" "$MODELS"
logs=$(mktemp -d /tmp/rill-prefill-sweep.XXXXXX)
table=$OUT/prefill-sweep.txt
left() { echo $((BUDGET - (SECONDS - t0))); }
# shellcheck source=scripts/gpu-wgpu-setup.sh
. scripts/gpu-wgpu-setup.sh || exit 1
model=${SWEEP_MODEL:-$MODELS/qwen3.5-9b-q4_k_m.gguf}
if [ ! -s "$model" ]; then
    timeout 150 "$rill" synth --shape qwen3.5-9b --quant q4_k_m -o "$model.part" >"$logs/synth.log" 2>&1 &&
        mv "$model.part" "$model"
fi

# name, then the environment of the variant: the first kernel, then the second kernel's default
# (128 x 64 x 32, 64 x 32 pieces, two buffers), then the likeliest others.
variants=(
    "coop1 RILL_WGPU_COOP=1"
    "c2-128x64x32-b2 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=128x64x32 RILL_WGPU_COOP_BUF=2"
    "c2-128x128x32-b2 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=128x128x32 RILL_WGPU_COOP_BUF=2"
    "c2-128x64x32/32x64-b2 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=128x64x32/32x64 RILL_WGPU_COOP_BUF=2"
    "c2-64x128x32-b2 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=64x128x32 RILL_WGPU_COOP_BUF=2"
    "c2-128x64x32-b1 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=128x64x32 RILL_WGPU_COOP_BUF=1"
    "c2-128x64x64-b1 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=128x64x64 RILL_WGPU_COOP_BUF=1"
    "c2-128x128x64-b1 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=128x128x64 RILL_WGPU_COOP_BUF=1"
    "c2-256x64x32-b1 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=256x64x32 RILL_WGPU_COOP_BUF=1"
    "c2-64x64x32-b2 RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=64x64x32 RILL_WGPU_COOP_BUF=2"
    "c2-128x64x32-b2-staged RILL_WGPU_COOP=2 RILL_WGPU_COOP_TILE=128x64x32 RILL_WGPU_COOP_BUF=2 RILL_WGPU_COOP_DIRECT=0"
)
wanted() { [ -z "${SWEEP_VARIANTS:-}" ] || [[ " $SWEEP_VARIANTS " == *" $1 "* ]]; }
{
    echo "prefill tensor-core kernel sweep: commit $(cat .gpu-wgpu/commit), $(basename "$model"), pp$PROMPT --precision fast"
    echo
    echo "| variant | device_fast | pp$PROMPT t/s | matmul GPU s (profile) | prefill (as the backend reports it) |"
    echo "|---|---|---|---|---|"
} >"$table"
# The sum of the profile's matmul* lines (seconds, the 4th field) and the top lines.
matmul_secs() {
    awk '$1 ~ /^matmul/ { s += $4 } END { if (s > 0) printf "%.4f", s }' "$1"
}
best=""
best_tps=0
for v in "${variants[@]}"; do
    read -r name envs <<<"$v"
    wanted "$name" || continue
    tag=${name//\//_}
    # 60 s kept back for device_linear and the packing.
    if [ "$(left)" -lt 100 ]; then
        echo "| $name | skipped (budget) | | | |" >>"$table"
        continue
    fi
    # shellcheck disable=SC2086
    env RILL_TEST_BACKENDS=wgpu $envs timeout -k 5 60 "$bin/device_fast" --test-threads=4 \
        >"$logs/test-device_fast-$tag.log" 2>&1
    tst=$?
    tres=$(grep -E '^test result:' "$logs/test-device_fast-$tag.log" | tail -1 | sed 's/^test result: //; s/;.*//')
    # shellcheck disable=SC2086
    env $envs timeout -k 5 45 "$rill" bench -m "$model" --backend wgpu --precision fast -p "$PROMPT" -n 0 -r 2 \
        >"$logs/bench-$tag.log" 2>&1
    st=$?
    tps=$(sed -n "s/^pp$PROMPT: \([0-9.]*\) .*/\1/p" "$logs/bench-$tag.log" | tail -1)
    what=$(grep -o -m1 'prefill [^(,]*\(([^)]*)\)\?' "$logs/bench-$tag.log" | head -1)
    p="$logs/profile-$tag.txt"
    secs=""
    if [ "$(left)" -ge 90 ]; then
        # shellcheck disable=SC2086
        env RILL_PROFILE=1 $envs timeout -k 5 40 "$rill" bench -m "$model" --backend wgpu --precision fast \
            -p "$PROMPT" -n 0 -r 1 --no-warmup >"$p" 2>&1
        secs=$(matmul_secs "$p")
    fi
    echo "| $name | ${tres:-exit $tst} | ${tps:-exit $st} | ${secs:--} | ${what:-?} |" >>"$table"
    if [ "$tst" -eq 0 ] && [ -n "$tps" ] &&
        python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$tps" "$best_tps"; then
        best=$v
        best_tps=$tps
    fi
done
{
    echo
    echo "best (device_fast passed): ${best:-none} (${best_tps} t/s)"
    echo
    echo "profiles (matmul kernels; GPU timestamps):"
    for f in "$logs"/profile-*.txt; do
        [ -f "$f" ] || continue
        echo "-- $(basename "$f" .txt | sed 's/^profile-//')"
        grep -m1 '^wgpu profile' "$f"
        grep -E '^ +matmul' "$f" | head -4
    done
    echo
    echo "device_fast failures:"
    for f in "$logs"/test-device_fast-*.log; do
        [ -f "$f" ] || continue
        grep -E '^test .* FAILED$|panicked at' "$f" | head -4 | sed "s|^|$(basename "$f" .log): |"
    done
} >>"$table"
# The exact-tier matrix op tests under the winner's environment (the coop knobs must not touch
# them), so that making it the default is safe.
if [ -n "$best" ] && [ -x "$bin/device_linear" ] && [ "$(left)" -ge 20 ]; then
    read -r name envs <<<"$best"
    # shellcheck disable=SC2086
    env RILL_TEST_BACKENDS=wgpu $envs timeout -k 5 $(($(left) - 10)) "$bin/device_linear" --test-threads=4 \
        >"$logs/test-device_linear-best.log" 2>&1
    st=$?
    {
        echo
        echo "device_linear under $name: exit $st, $(grep -E '^test result:' "$logs/test-device_linear-best.log" | tail -1)"
        grep -E '^test .* FAILED$|panicked at' "$logs/test-device_linear-best.log" | head -6
    } >>"$table"
fi
echo "sweep: $((SECONDS - t0)) s" >>"$table"
tar -C "$logs" -czf "$OUT/prefill-sweep-logs.tar.gz" . && rm -rf "$logs"
cat "$table"
