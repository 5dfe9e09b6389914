#!/usr/bin/env bash
# Before/after on the GPU machine (packed by scripts/pack-ab.sh into .gpu-ab/, run from there).
#   bash .gpu-ab/gpu-ab.sh cuda: the CUDA suites, then cuda benches of the three synth models, interleaved base/new;
#   bash .gpu-ab/gpu-ab.sh wgpu: the wgpu suites and benches on the 9B Q4_K_M, then the CUDA MoE suite.
# Writes summary.txt (as it goes), the test logs and logs.tar.gz under $OUT.
MODE=${1:-cuda}
set -u
cd "$(dirname "$0")/.."
FINAL_OUT=${OUT:-/tmp/final-out}; mkdir -p "$FINAL_OUT"
OUT=/tmp/ab-logs; rm -rf $OUT; mkdir -p $OUT
START=$SECONDS
finish() { tar -czf "$FINAL_OUT/logs.tar.gz" -C $OUT .; }
trap finish EXIT
log() { echo "== +$((SECONDS-START))s $*" | tee -a "$OUT/summary.txt" "$FINAL_OUT/summary.txt"; }
python3 -c "import tarfile; tarfile.open('.gpu-ab/bundle.tar.xz').extractall('.gpu-ab/x')"
X=.gpu-ab/x; chmod +x $X/*
NEW=$X/rill-new; BASE=$X/rill-base
M=/tmp/m; mkdir -p $M
nvidia-smi -L | tee -a "$OUT/summary.txt"
built=$(cat .gpu-ab/manifest_dir); [ "$built" != "$PWD" ] && [ ! -e "$built" ] && mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"
mkdir -p target/release && cp $NEW target/release/rill
MODELS="9b-q4"; [ "$MODE" = cuda ] && MODELS="9b-q4 9b-q8 35b-q4"
for m in $MODELS; do
  case $m in 9b-q4) a="qwen3.5-9b q4_k_m";; 9b-q8) a="qwen3.5-9b q8_0";; 35b-q4) a="qwen3.5-35b-a3b q4_k_m";; esac
  set -- $a; ( $NEW synth --shape $1 --quant $2 -o $M/$m.gguf > $OUT/synth-$m.log 2>&1 ) &
done
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp RILL_WGPU_ADAPTER=nvidia
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
ls /usr/local/nvidia/share/vulkan/icd.d/ >> $OUT/summary.txt 2>&1
runtest() { # runtest BACKEND NAME LIMIT
  local b=$X/$2-bin; [ -f "$b" ] || { log "no test $2"; return; }
  RILL_TEST_BACKENDS=$1 RILL_TEST_REQUIRE_CUDA=1 timeout $3 $b --test-threads=8 > $OUT/test-$1-$2.log 2>&1; st=$?
  log "test $1 $2 exit $st $(grep '^test result' $OUT/test-$1-$2.log | tail -1)"
  grep -E '^test .* FAILED|panicked|running for over' -A3 $OUT/test-$1-$2.log | head -8 | tee -a $OUT/summary.txt "$FINAL_OUT/summary.txt"
  cp $OUT/test-$1-$2.log "$FINAL_OUT/" 2>/dev/null
}
if [ "$MODE" = cuda ]; then
  for t in e2e_fixtures device_fused device_group cuda_steps device_plans; do runtest cuda $t 120; done
  runtest cuda device_moe 230
else
  for t in e2e_fixtures device_fused device_plans; do runtest wgpu $t 60; done
fi
wait
log "synth done"
bench() { # bench LABEL BIN BACKEND MODEL PREC ARGS...
  local tag=$1 bin=$2 be=$3 m=$4 p=$5; shift 5
  timeout 100 $bin bench -m $M/$m --backend $be --precision $p "$@" --json > $OUT/b-$tag.json 2> $OUT/b-$tag.log
  echo "$tag $(python3 -c "
import json
try:
  d=json.load(open('$OUT/b-$tag.json'))
  print(d.get('device','?')[:24], ' '.join(f\"{r['test']}={r['tokens_per_s_mean']:.1f}\" for r in d['tests']))
except Exception as e: print('parse error', e, open('$OUT/b-$tag.log').read()[-300:])
")" | tee -a $OUT/summary.txt
}
for m in $MODELS; do
  for round in 1 2; do
    for which in base new; do
      bin=$BASE; [ $which = new ] && bin=$NEW
      if [ "$MODE" = cuda ]; then
        bench "cuda-$m-tg-$which-$round" $bin cuda $m.gguf exact -p "" -n 128 -r 2
        bench "cuda-$m-fast-$which-$round" $bin cuda $m.gguf fast -p 512,4096 -n 0 -r 2
        bench "cuda-$m-exact-$which-$round" $bin cuda $m.gguf exact -p 512,4096 -n 0 -r 1
      else
        bench "wgpu-$m-$which-$round" $bin wgpu $m.gguf fast -p 512,4096 -n 128 -r 1
      fi
    done
  done
done
[ "$MODE" = wgpu ] && runtest cuda device_moe 230
log "done"
