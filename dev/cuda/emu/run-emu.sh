#!/usr/bin/env bash
# Run the prefill kernels on the CPU emulator (no GPU needed): g++ with AddressSanitizer, the CUDA
# headers of the pinned nvcc for the f16 types. Usage: bash dev/cuda/emu/run-emu.sh [deq|gemm|attn|delta|moe|all|mvtc]
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../../.. && pwd)
INC=${CUDA_INC:-$ROOT/.cuda/lib/python3.11/site-packages/nvidia/cu13/include}
[ -d "$INC" ] || INC=/work/main/.cuda/lib/python3.11/site-packages/nvidia/cu13/include
OUTB=${BUILD:-/tmp/pf-emu}
mkdir -p "$OUTB"
# `mvtc`: the tensor-core matvec candidate's checks (mvtc_checks.cpp, kernels-cuda/matvec_tc.cuh) instead.
prog=emu_checks
[ "${1:-all}" = mvtc ] && prog=mvtc_checks
g++ -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer -ffp-contract=off -pthread \
    -I"$INC" -I. -I"$ROOT/kernels-cuda" -Wall -Wno-unused-function -Wno-unknown-pragmas -Wno-attributes \
    $prog.cpp -o "$OUTB/$prog"
ASAN_OPTIONS=detect_stack_use_after_return=0,detect_leaks=0 "$OUTB/$prog" "${1:-all}"
