#!/usr/bin/env bash
# Build and run the prefill kernel harness on the GPU machine in one call: compile the kernels
# the way the backend will (one cubin per kernels-cuda file, registers and spills reported),
# build prefill_bench, run the correctness checks under compute-sanitizer (memcheck, when
# present), then every check and timing. Logs go to $OUT (default dev/cuda/out); the last thing
# printed is the summary table.
#
#   bash dev/cuda/run-prefill.sh            # everything (estimated 4-7 min; stops itself at 590 s)
#   bash dev/cuda/run-prefill.sh --quick    # Q4_K and Q8_0 timings only, fewer checks (~2-3 min)
#   SANITIZE=0 bash dev/cuda/run-prefill.sh # skip compute-sanitizer (saves up to 150 s)
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}
BUILD=${BUILD:-/tmp/pf-build}  # binaries and cubins stay out of $OUT (only logs come back)
mkdir -p "$OUT" "$BUILD"
export OUT

NVCC=${NVCC:-$(command -v nvcc || true)}
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then echo "run-prefill: no nvcc (set NVCC)"; exit 1; fi
BIN=$(dirname "$NVCC")
{ nvidia-smi; "$NVCC" --version; } > "$OUT/env.txt" 2>&1

# 1. Each kernel file alone, as build.rs compiles it: registers, spills, stack.
for f in gemm_q flash_attn delta_chunked moe_group; do
    "$NVCC" -cubin -O3 -arch=sm_90 -std=c++17 -Xptxas -v ../../kernels-cuda/$f.cu -o "$BUILD/$f.cubin" \
        > "$OUT/ptxas-$f.txt" 2>&1 || { cat "$OUT/ptxas-$f.txt"; exit 1; }
done
spills=$(grep -h "spill" "$OUT"/ptxas-*.txt | grep -v " 0 bytes spill stores, 0 bytes spill loads" | wc -l)
echo "kernels compiled; entries with spills: $spills (details: ptxas-*.txt)"
if [ -x "$BIN/cuobjdump" ]; then
    "$BIN/cuobjdump" -sass "$BUILD/gemm_q.cubin" > "$BUILD/gemm_q.sass" 2>/dev/null &&
        echo "gemm_q SASS: $(grep -c HMMA "$BUILD/gemm_q.sass") HMMA, $(grep -cE 'LDL|STL' "$BUILD/gemm_q.sass") local-memory ops"
fi

# 2. The harness (one translation unit that includes the kernel files).
start=$(date +%s)
"$NVCC" -O3 -arch=sm_90 -std=c++17 -lineinfo -Xcompiler -ffp-contract=off,-pthread -diag-suppress 177 \
    prefill_bench.cu -o "$BUILD/prefill_bench" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "prefill_bench built in $(( $(date +%s) - start )) s"

# 3. Correctness parts under compute-sanitizer memcheck (out-of-bounds and misaligned accesses).
SAN=${SANITIZE:-1}
CS=$(command -v compute-sanitizer || ls "$BIN"/compute-sanitizer /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
if [ "$SAN" = 1 ] && [ -n "$CS" ]; then
    start=$(date +%s)
    OUT="$OUT/sanitize" && mkdir -p "$OUT"
    timeout 150 "$CS" --tool memcheck --error-exitcode 9 --print-limit 20 "$BUILD/prefill_bench" checks --quick \
        > "$OUT/memcheck.txt" 2>&1
    rc=$?
    OUT=$(dirname "$OUT")
    echo "compute-sanitizer memcheck (checks --quick): rc=$rc in $(( $(date +%s) - start )) s; $(grep -c 'Invalid' "$OUT/sanitize/memcheck.txt") invalid accesses"
    grep -m 8 -E "Invalid|ERROR SUMMARY|FAIL" "$OUT/sanitize/memcheck.txt"
else
    echo "compute-sanitizer skipped"
fi

# 4. Everything: checks and timings. Full log in $OUT/prefill.log, stdout in $OUT/run.txt.
start=$(date +%s)
left=$(( ${LIMIT:-590} - SECONDS ))  # the device tool stops a command at 600 s
timeout "$left" "$BUILD/prefill_bench" all "$@" > "$OUT/run.txt" 2>&1
rc=$?
echo "prefill_bench rc=$rc in $(( $(date +%s) - start )) s (124: stopped at the time limit; partial log in run.txt)"
grep -E "FAIL|CUDA error|pf_emu" "$OUT/run.txt" | head -20
if grep -q "================ summary" "$OUT/run.txt"; then
    sed -n '/================ summary/,$p' "$OUT/run.txt"
else
    echo "---- no final summary (run stopped); rows so far:"
    cat "$OUT/summary.txt" 2>/dev/null
fi
exit $rc
