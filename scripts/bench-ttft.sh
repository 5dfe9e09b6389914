#!/usr/bin/env bash
# Time to first token of the 10th turn of a long chat, with and without the prefix cache
# (BENCHMARKS.md "Time to first token"), on each backend given. Needs python3 (standard library only).
# Usage: scripts/bench-ttft.sh RILL_BINARY OUT_DIR [BACKENDS] [SHAPE] [QUANT] [LAYERS] [TTFT_ARGS...]
#   defaults: BACKENDS=cpu, SHAPE=qwen3.5-0.8b, QUANT=q4_k_m, LAYERS=all,
#             TTFT_ARGS="--turns 10 --user-words 250 --reply-tokens 32 --ctx 8192"
# On the GPU machine, from the repository root:
#   bash scripts/bench-ttft.sh target/release/rill "$OUT" "wgpu cuda" qwen3.5-0.8b q4_k_m
# Model files go to ${RILL_BENCH_TMP:-/tmp}; per backend OUT_DIR/<backend>/{ttft.json,serve-*.log,run.log}.
set -euo pipefail
bin=$1
out=$2
backends=${3:-cpu}
shape=${4:-qwen3.5-0.8b}
quant=${5:-q4_k_m}
layers=${6:-all}
shift $(( $# < 6 ? $# : 6 ))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--turns 10 --user-words 250 --reply-tokens 32 --ctx 8192)
tmp=${RILL_BENCH_TMP:-/tmp}
mkdir -p "$out"
{ nproc; grep -m1 'model name' /proc/cpuinfo || true; nvidia-smi -L 2>/dev/null || true; } > "$out/machine.txt"
model="$tmp/ttft-$shape-$quant-$layers.gguf"
layer_args=()
[ "$layers" = all ] || layer_args=(--layers "$layers")
"$bin" synth --shape "$shape" --quant "$quant" "${layer_args[@]}" -o "$model" > "$out/synth.log" 2>&1
"$bin" info -m "$model" > "$out/info.txt"
here=$(cd "$(dirname "$0")" && pwd)
status=0
for b in $backends; do
    mkdir -p "$out/$b"
    python3 "$here/ttft.py" --rill "$bin" --model "$model" --backend "$b" --out "$out/$b" "${args[@]}" \
        > "$out/$b/run.log" 2>&1 || { status=$?; echo "backend $b failed (status $status), see $out/$b/run.log" >&2; }
    tail -1 "$out/$b/run.log"
done
rm -f "$model"
exit "$status"
