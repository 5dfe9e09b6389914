#!/usr/bin/env bash
# Build everything the CUDA GPU job needs on this (GPU-less) machine and pack it into the
# git-ignored folder .gpu/, which the device call carries (scripts/gpu-cuda.sh unpacks and runs it):
#   - target/release/rill (cuda only, no wgpu: the GPU machine has no Vulkan loader),
#   - the test executables of the device op suite, the CUDA step tests, the end-to-end fixtures,
#     the CLI and the synthesized-model runs,
#   - dev/cuda/matvec_bench and dev/cuda/prefill_bench (the standalone decode and prefill kernel
#     harnesses, static CUDA runtime).
# Binaries lose their debug info (symbols stay, for backtraces) and travel as one xz tar, which
# python3's tarfile unpacks there (no zstd/xz tools needed on the GPU machine).
# Usage: bash scripts/pack-gpu.sh        (prints the sizes; the tree plus .gpu must stay < 64 MiB)
# Before building, the kernels are checked on the CPU (about 8 minutes on two cores;
# SKIP_CPU_CHECKS=1 skips that when the same kernels were just checked).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
features=(--release --no-default-features --features cuda)
tests=(device_ops device_linear device_delta device_moe device_pieces device_fast concurrency prefix_cache cuda_steps e2e_fixtures cli synth_runs nonfinite device_fused device_group)

nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
    for c in "${CUDA_HOME:-/nonexistent}/bin/nvcc" .cuda/lib/python3*/site-packages/nvidia/cu13/bin/nvcc "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
        if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
    done
fi
[ -n "$nvcc" ] || { echo "nvcc not found: run scripts/test.sh once (it installs the pinned nvcc into .cuda/)" >&2; exit 1; }
nvcc=$(cd "$(dirname "$nvcc")" && pwd)/$(basename "$nvcc") # absolute: some builds below change directory
export NVCC=$nvcc

# GPU time is scarce: the kernels first pass on the CPU (decoders bit for bit against ggml, every
# kernel emulated against double-precision references).
# SKIP_CPU_CHECKS=1: they already passed on this commit (a second pack after a packing error).
if [ -z "${SKIP_CPU_CHECKS:-}" ]; then
    echo "checking the kernels on the CPU (dev/cuda/check_formats.sh, dev/cuda/emulate.sh, dev/cuda/emu/run-emu.sh all and mvtc)" >&2
    bash dev/cuda/check_formats.sh
    bash dev/cuda/emulate.sh
    bash dev/cuda/emu/run-emu.sh all | tail -3
    # The tensor-core matvec candidate that matvec_bench times (kernels-cuda/matvec_tc.cuh).
    bash dev/cuda/emu/run-emu.sh mvtc | tail -1
fi

echo "building rill and the test executables (cuda feature, no wgpu)" >&2
cargo build "${features[@]}" --bin rill
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
cargo test "${features[@]}" "${args[@]}" --no-run --message-format=json >/tmp/rill-pack-tests.json
exes=$(python3 - <<'EOF'
import json
for line in open('/tmp/rill-pack-tests.json'):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['kind'] == ['test']:
        print(m['executable'])
EOF
)

echo "building dev/cuda/matvec_bench and dev/cuda/prefill_bench" >&2
nvcc_lib=$(dirname "$(dirname "$nvcc")")/lib
"$nvcc" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I kernels-cuda -L "$nvcc_lib" \
    dev/cuda/matvec_bench.cu -o target/release/matvec_bench
# As dev/cuda/run-prefill.sh builds it there (built here, the GPU call spends no time compiling).
(cd dev/cuda && "$nvcc" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -lineinfo -L "$nvcc_lib" \
    -Xcompiler -ffp-contract=off,-pthread -diag-suppress 177 prefill_bench.cu -o "$root/target/release/prefill_bench")

rm -rf .gpu && mkdir -p .gpu/stage
stage=.gpu/stage
copy() { # copy $1 (absolute) to the stage under its path relative to the repo root, without debug info
    local rel=${1#"$root"/}
    mkdir -p "$stage/$(dirname "$rel")"
    objcopy --strip-debug "$1" "$stage/$rel"
}
copy "$root/target/release/rill"
copy "$root/target/release/matvec_bench"
copy "$root/target/release/prefill_bench"
: >.gpu/tests.txt
for e in $exes; do
    copy "$e"
    echo "${e#"$root"/}" >>.gpu/tests.txt
done
# The test executables look for fixtures (and the rill binary) under the directory they were built
# in; the GPU script links that path to wherever the tree lands there.
echo "$root" >.gpu/manifest_dir
git rev-parse --short=12 HEAD >.gpu/commit 2>/dev/null || echo unknown >.gpu/commit
(cd "$stage" && tar -cf - .) | xz -9 -T2 >.gpu/bundle.tar.xz
rm -rf "$stage"

tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
gpu_bytes=$(du -cb .gpu | tail -1 | cut -f1)
total=$((tree_bytes + gpu_bytes))
printf 'tests packed: %s\n' "$(wc -l <.gpu/tests.txt)"
printf 'working tree %.1f MiB + .gpu %.1f MiB = %.1f MiB (limit 64 MiB)\n' \
    "$(echo "$tree_bytes / 1048576" | bc -l)" "$(echo "$gpu_bytes / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
if [ "$total" -ge $((64 * 1024 * 1024)) ]; then
    echo "too large for one device call" >&2
    exit 1
fi
