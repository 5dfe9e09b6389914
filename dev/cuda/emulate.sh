#!/usr/bin/env bash
# Run every CUDA kernel on the CPU (dev/cuda/emulate.cpp: one OS thread per CUDA thread, real
# barriers and warp shuffles, the Rust backend's launch geometry) against double-precision
# references. No GPU needed; a few minutes on two cores. An argument runs only the groups whose
# name contains it (matvec, group, moe, norm, conv, delta, gdn_step, attention, attn_prep, route,
# rows).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g++ -O2 -std=c++20 -pthread -ffp-contract=off -Wall -Wno-unknown-pragmas -DRILL_EMULATE_THREADS -I kernels-cuda \
    -include dev/cuda/host_shim.h dev/cuda/emulate.cpp -o "$tmp/emulate"
"$tmp/emulate" "$@"
