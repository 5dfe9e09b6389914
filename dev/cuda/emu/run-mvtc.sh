#!/usr/bin/env bash
# Run dev/cuda/matvec_tc.cuh (tensor-core Q4_K matvec) on the CPU emulator with AddressSanitizer
# against double-precision references (dev/cuda/emu/mvtc_checks.cpp). No GPU needed.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../../.. && pwd)
INC=${CUDA_INC:-$ROOT/.cuda/lib/python3.11/site-packages/nvidia/cu13/include}
[ -d "$INC" ] || INC=/work/main/.cuda/lib/python3.11/site-packages/nvidia/cu13/include
OUTB=${BUILD:-/tmp/pf-emu}
mkdir -p "$OUTB"
g++ -std=c++17 -O1 -g -fsanitize=address -fno-omit-frame-pointer -ffp-contract=off -pthread \
    -I"$INC" -I. -I"$ROOT/kernels-cuda" -Wall -Wno-unused-function -Wno-unknown-pragmas -Wno-attributes \
    mvtc_checks.cpp -o "$OUTB/mvtc_checks"
ASAN_OPTIONS=detect_stack_use_after_return=0,detect_leaks=0 "$OUTB/mvtc_checks"
