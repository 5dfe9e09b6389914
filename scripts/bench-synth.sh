#!/usr/bin/env bash
# Reproduces the BENCHMARKS.md rows: synthesize real-shaped models and run `rill bench` on them.
# Usage: scripts/bench-synth.sh RILL_BINARY OUT_DIR [BACKENDS] [SHAPE] [QUANTS] [BENCH_ARGS...]
#   defaults: BACKENDS="cpu", SHAPE=qwen3.5-9b, QUANTS="q4_k_m q8_0", BENCH_ARGS="-p 102,512 -n 128 -r 3"
# Model files go to ${RILL_BENCH_TMP:-/tmp}; logs, tables and JSON to OUT_DIR.
set -euo pipefail
bin=$1
out=$2
backends=${3:-cpu}
shape=${4:-qwen3.5-9b}
quants=${5:-q4_k_m q8_0}
shift $(( $# < 5 ? $# : 5 ))
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(-p 102,512 -n 128 -r 3)
tmp=${RILL_BENCH_TMP:-/tmp}
mkdir -p "$out"
{ nproc; grep -m1 'model name' /proc/cpuinfo || true; nvidia-smi -L 2>/dev/null || true; } > "$out/machine.txt"
for q in $quants; do
    model="$tmp/$shape-$q.gguf"
    "$bin" synth --shape "$shape" --quant "$q" -o "$model" > "$out/synth-$q.log" 2>&1
    "$bin" info -m "$model" > "$out/info-$q.txt"
    for b in $backends; do
        "$bin" bench -m "$model" --backend "$b" "${bench_args[@]}" > "$out/bench-$q-$b.md" 2> "$out/bench-$q-$b.log"
    done
    rm -f "$model"
done
