#!/usr/bin/env bash
# Kernel variants of the wgpu decode products on the GPU machine, in one device call (llm.c's
# dev/cuda style, for WGSL): dumps the composed shaders of this build, makes the variants of
# dev/wgpu/variants.py from them, and times each with examples/mv_bench (checked against the CPU)
# over ROUNDS interleaved rounds. Build here, carry .gpu-mv, .gpu-wgpu (for the Vulkan set-up) and .gl:
#   CARGO_TARGET_DIR=... cargo build --release --example mv_bench
#   mkdir -p .gpu-mv && objcopy --strip-debug $CARGO_TARGET_DIR/release/examples/mv_bench .gpu-mv/mv_bench
#   run(command="OUT=$OUT bash dev/wgpu/run.sh", carry=[".gpu-mv", ".gpu-wgpu", ".gl"])
# Cases: MV_CASES (default: mv_bench's qwen3.5-9b products); variants: MV_VARIANTS (default all).
# GEOMS: launch geometries to time with this build's shaders, `;`-separated, each a list of
# environment assignments (e.g. "RILL_WGPU_MV_ROWS=1;RILL_WGPU_MV_LANES=64"), in the same rounds.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
ROUNDS=${ROUNDS:-2}
ITERS=${ITERS:-300}
mkdir -p "$OUT/dump"
# shellcheck source=scripts/gpu-wgpu-setup.sh
. scripts/gpu-wgpu-setup.sh || exit 1
mv=.gpu-mv/mv_bench
chmod +x "$mv"
# shellcheck disable=SC2086
RILL_WGPU_SHADER_DUMP=$OUT/dump "$mv" --iters 20 ${MV_CASES:-} | tee "$OUT/base0.txt"
RILL_PROFILE=1 "$mv" --iters "$ITERS" ${MV_CASES:-} >"$OUT/profile.txt" 2>&1
python3 dev/wgpu/variants.py "$OUT/dump" "$OUT/var" || exit 1
variants=${MV_VARIANTS:-$(ls "$OUT/var")}
for r in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    "$mv" --iters "$ITERS" ${MV_CASES:-} | sed "s/^/r$r base    /" | tee -a "$OUT/mv.txt"
    for v in $variants; do
        # shellcheck disable=SC2086
        RILL_WGPU_SHADER_DIR=$OUT/var/$v "$mv" --iters "$ITERS" ${MV_CASES:-} | sed "s/^/r$r $v    /" | tee -a "$OUT/mv.txt"
    done
    IFS=';' read -ra geoms <<<"${GEOMS:-}"
    for g in "${geoms[@]}"; do
        # shellcheck disable=SC2086
        env $g "$mv" --iters "$ITERS" ${MV_CASES:-} | sed "s/^/r$r [$g]    /" | tee -a "$OUT/mv.txt"
    done
done
# The LM head (Q6_K 248320 x 4096, 834 MB) once per variant.
for v in base ${HEAD_VARIANTS:-$variants}; do
    dir=
    [ "$v" = base ] || dir=$OUT/var/$v
    # shellcheck disable=SC2086
    env ${dir:+RILL_WGPU_SHADER_DIR=$dir} "$mv" --iters 50 --copies-mb 1 ${MV_HEAD:-q6_k:248320:4096} |
        sed "s/^/head $v    /" | tee -a "$OUT/mv.txt"
done
for g in "${geoms[@]}"; do
    # shellcheck disable=SC2086
    env $g "$mv" --iters 50 --copies-mb 1 ${MV_HEAD:-q6_k:248320:4096} | sed "s/^/head [$g]    /" | tee -a "$OUT/mv.txt"
done
