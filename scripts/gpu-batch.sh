#!/usr/bin/env bash
# Batched decode and serving on the GPU machine. Here: `cargo build --release --features cuda`, then
# `bash scripts/pack-ab.sh "" device_rows batch` (no base
# binary); there, carrying .gpu-ab and .gl: `bash scripts/gpu-batch.sh`. It runs:
#   1. the batch suites on cuda (tests/device_rows.rs, tests/batch.rs) and on wgpu;
#   2. `rill bench --batch` on the 9B Q4_K_M at B = 1..256 (fast, the default, and exact at B = 64), the
#      35B-A3B at B = 1 and 64, wgpu at B = 64;
#   3. `rill serve --parallel 64` on the 9B driven by `rill bench-serve` (512 prompt + 128 output tokens).
# Writes summary.txt as it goes, the test logs and logs.tar.gz under $OUT.
set -u
cd "$(dirname "$0")/.."
FINAL_OUT=${OUT:-/tmp/final-out}; mkdir -p "$FINAL_OUT"
OUT=/tmp/batch-logs; rm -rf $OUT; mkdir -p $OUT
START=$SECONDS
finish() { tar -czf "$FINAL_OUT/logs.tar.gz" -C $OUT .; }
trap finish EXIT
log() { echo "== +$((SECONDS-START))s $*" | tee -a "$OUT/summary.txt" "$FINAL_OUT/summary.txt"; }
python3 -c "import tarfile; tarfile.open('.gpu-ab/bundle.tar.xz').extractall('.gpu-ab/x')"
X=.gpu-ab/x; chmod +x $X/*
RILL=$X/rill-new
M=/tmp/m; mkdir -p $M
nvidia-smi -L | tee -a "$OUT/summary.txt" "$FINAL_OUT/summary.txt"
built=$(cat .gpu-ab/manifest_dir); [ "$built" != "$PWD" ] && [ ! -e "$built" ] && mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"
( $RILL synth --shape qwen3.5-9b --quant q4_k_m -o $M/9b-q4.gguf > $OUT/synth-9b.log 2>&1 ) &
( $RILL synth --shape qwen3.5-35b-a3b --quant q4_k_m -o $M/35b-q4.gguf > $OUT/synth-35b.log 2>&1 ) &
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp RILL_WGPU_ADAPTER=nvidia
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
runtest() { # runtest BACKEND NAME LIMIT
  local b=$X/$2-bin; [ -f "$b" ] || { log "no test $2"; return; }
  RILL_TEST_BACKENDS=$1 RILL_TEST_REQUIRE_CUDA=1 timeout $3 $b --test-threads=8 > $OUT/test-$1-$2.log 2>&1; st=$?
  log "test $1 $2 exit $st $(grep '^test result' $OUT/test-$1-$2.log | tail -1)"
  grep -E '^test .* FAILED|panicked|running for over' -A3 $OUT/test-$1-$2.log | head -8 | tee -a $OUT/summary.txt "$FINAL_OUT/summary.txt"
  cp $OUT/test-$1-$2.log "$FINAL_OUT/" 2>/dev/null
}
for t in device_rows batch; do runtest cuda $t 120; done
for t in device_rows batch; do runtest wgpu $t 90; done
wait
log "synth done"
bench() { # bench LABEL BACKEND MODEL PREC LIMIT ARGS...
  local tag=$1 be=$2 m=$3 p=$4 lim=$5; shift 5
  timeout $lim $RILL bench -m $M/$m --backend $be --precision $p "$@" --json > $OUT/b-$tag.json 2> $OUT/b-$tag.log
  echo "$tag $(python3 -c "
import json
try:
  d=json.load(open('$OUT/b-$tag.json'))
  print(d.get('device','?')[:24], d.get('precision'), ' '.join(f\"{r['test']}={r['tokens_per_s_mean']:.1f}\" for r in d['tests']))
except Exception as e: print('parse error', e, open('$OUT/b-$tag.log').read()[-300:])
")" | tee -a $OUT/summary.txt "$FINAL_OUT/summary.txt"
}
bench cuda-9b-fast cuda 9b-q4.gguf fast 150 -p "" -n 128 -b 1,8,32,64,128,256 -r 2
bench cuda-9b-exact cuda 9b-q4.gguf exact 60 -p "" -n 128 -b 64 -r 1
bench cuda-35b-fast cuda 35b-q4.gguf fast 90 -p "" -n 128 -b 1,64 -r 1
bench wgpu-9b-fast wgpu 9b-q4.gguf fast 90 -p "" -n 64 -b 1,64 -r 1
log "serving"
$RILL serve -m $M/9b-q4.gguf --backend cuda --parallel 64 --port 8123 --ctx 1024 --max-queue 512 --cache-mem 0 > $OUT/serve.log 2>&1 &
SERVER=$!
for _ in $(seq 60); do grep -q "listening on" $OUT/serve.log && break; sleep 1; done
head -5 $OUT/serve.log | tee -a $OUT/summary.txt "$FINAL_OUT/summary.txt"
timeout 150 $RILL bench-serve --url http://127.0.0.1:8123 -c 1,16,64 -p 512 -n 128 --vocab 100000 \
  > $OUT/serve-bench.md 2> $OUT/serve-bench.log
cat $OUT/serve-bench.md $OUT/serve-bench.log | tail -12 | tee -a $OUT/summary.txt "$FINAL_OUT/summary.txt"
kill $SERVER; wait $SERVER 2>/dev/null
log "done"
