#!/usr/bin/env bash
# The CUDA GPU job, in one device call (built here by scripts/pack-gpu.sh, carried in .gpu/):
#   1. the kernel harness (dev/cuda/matvec_bench): every decode matvec variant (exact and the fast
#      tier's q8, several geometries) checked against a double-precision CPU reference and timed in
#      GB/s against the copy bandwidth, ending with a winner table;
#   2. the CUDA test suite (device op tests, recorded steps, end-to-end fixtures, CLI, synthesized
#      models) with RILL_TEST_BACKENDS=cuda;
#   3. `rill synth` of qwen3.5-9b q4_k_m and q8_0 and qwen3.5-35b-a3b q4_k_m, then `rill bench`
#      (tg128, pp102, pp512) on cuda, RILL_PROFILE=1 runs (decode, prefill), and the logits of a short
#      prompt on cuda (recorded decode steps) against the CPU backend (batched prefill);
#   3b. decode variants end to end: tg128 with RILL_CUDA_MATVEC=exact and =q8 for each model, and the
#      q8 logits against the CPU's (the fast tier's drift);
#   4. a summary table, printed last; every text log also goes into $OUT/logs.tar.gz (a device call
#      returns only a few files: the tarball has them all).
# Every log goes to $OUT (default ./out). Run from the repository root:
#   bash scripts/gpu-cuda.sh            (about 5 minutes on an H200)
# SKIP_MODELS=1 leaves out step 3 (a dry run of the script's plumbing on a machine without a GPU).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
MODELS=${MODELS:-/tmp/rill-models}
mkdir -p "$MODELS"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt" >&2; }
: >"$OUT/summary.txt"

# ---- unpack -----------------------------------------------------------------------------------
if [ ! -f .gpu/bundle.tar.xz ]; then
    echo "no .gpu/bundle.tar.xz: run scripts/pack-gpu.sh first (on the build machine)" >&2
    exit 1
fi
python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('.')"
chmod +x target/release/rill target/release/matvec_bench $(cat .gpu/tests.txt)
# The test executables look for the fixtures and the rill binary under the directory they were
# built in: make that path lead here.
built=$(cat .gpu/manifest_dir)
if [ "$built" != "$PWD" ] && [ ! -e "$built" ]; then
    mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"
fi
log "commit $(cat .gpu/commit), tree at $PWD (built in $built)"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
head -15 "$OUT/nvidia-smi.txt" >&2

# ---- 1. kernel harness --------------------------------------------------------------------------
log "matvec harness"
timeout 240 target/release/matvec_bench >"$OUT/matvec_bench.log" 2>&1
echo "matvec_bench exit $?" >>"$OUT/matvec_bench.log"
sed -n '/==== winners/,$p' "$OUT/matvec_bench.log" | tee -a "$OUT/summary.txt"

# ---- 2. tests -----------------------------------------------------------------------------------
log "tests (RILL_TEST_BACKENDS=cuda)"
export RILL_TEST_BACKENDS=cuda RILL_TEST_REQUIRE_CUDA=1
for t in $(cat .gpu/tests.txt); do
    name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
    timeout 300 "$t" --test-threads=4 >"$OUT/test-$name.log" 2>&1
    st=$?
    res=$(grep -E "^test result:" "$OUT/test-$name.log" | tail -1)
    echo "test $name: exit $st: $res" | tee -a "$OUT/summary.txt"
    grep -E "^test .* FAILED$|panicked at" "$OUT/test-$name.log" | head -20 | tee -a "$OUT/summary.txt"
done
unset RILL_TEST_BACKENDS RILL_TEST_REQUIRE_CUDA

# ---- 3. real shapes -----------------------------------------------------------------------------
rill=target/release/rill
models=("qwen3.5-9b q4_k_m" "qwen3.5-9b q8_0" "qwen3.5-35b-a3b q4_k_m")
[ -n "${SKIP_MODELS:-}" ] && models=()
for m in "${models[@]}"; do
    set -- $m
    f="$MODELS/$1-$2.gguf"
    log "synth $1 $2"
    [ -f "$f" ] || timeout 300 $rill synth --shape "$1" --quant "$2" -o "$f" >"$OUT/synth-$1-$2.log" 2>&1
    ls -la "$f" >>"$OUT/synth-$1-$2.log" 2>&1
done
for m in "${models[@]}"; do
    set -- $m
    f="$MODELS/$1-$2.gguf"
    log "bench $1 $2"
    timeout 300 $rill bench -m "$f" --backend cuda -p 102,512 -n 128 -r 3 --json >"$OUT/bench-$1-$2.json" 2>"$OUT/bench-$1-$2.log"
    cat "$OUT/bench-$1-$2.log" >&2
done
profiled=("qwen3.5-9b q4_k_m" "qwen3.5-35b-a3b q4_k_m")
[ -n "${SKIP_MODELS:-}" ] && profiled=()
for m in "${profiled[@]}"; do
    set -- $m
    log "profile $1 $2 (RILL_PROFILE=1): 64 decoded tokens, then a 512-token prefill"
    RILL_PROFILE=1 timeout 300 $rill bench -m "$MODELS/$1-$2.gguf" --backend cuda -p "" -n 64 -r 1 --no-warmup \
        >"$OUT/profile-decode-$1-$2.txt" 2>&1
    RILL_PROFILE=1 timeout 300 $rill bench -m "$MODELS/$1-$2.gguf" --backend cuda -p 512 -n 0 -r 1 --no-warmup \
        >"$OUT/profile-prefill-$1-$2.txt" 2>&1
    grep -A 9 "by phase" "$OUT/profile-decode-$1-$2.txt" | tee -a "$OUT/summary.txt"
done
# Exact paths at real shapes: cuda (token by token, recorded steps) against cpu (batched prefill).
# The logits files (8 MB each) stay out of $OUT.
LOGITS=${LOGITS:-/tmp/rill-logits}
mkdir -p "$LOGITS"
compare_logits() { # cuda file, cpu file: rel L2, max abs, argmax agreement
    python3 - "$1" "$2" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import sys, json, struct
import numpy as np
def load(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    t = h['logits']
    s, e = t['data_offsets']
    return np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(t['shape'])
try:
    a, c = load(sys.argv[1]), load(sys.argv[2])
except Exception as e:
    print(f"logits compare: cannot read ({e})"); sys.exit(0)
rel = np.sqrt(((a - c) ** 2).sum(1) / (c ** 2).sum(1))
agree = (a.argmax(1) == c.argmax(1)).sum()
print(f"logits {sys.argv[1].split('/')[-1]} vs cpu(prefill): rel L2 max {rel.max():.2e}, "
      f"max abs {np.abs(a - c).max():.2e}, argmax {agree}/{len(rel)}")
EOF
}
toks=785,3974,293,4830,282,5131,7784,82
for m in "${models[@]}"; do
    set -- $m
    f="$MODELS/$1-$2.gguf"
    log "logits cuda vs cpu $1 $2"
    timeout 300 $rill logits -m "$f" --tokens $toks --decode --backend cuda -o "$LOGITS/logits-cuda-$1-$2.safetensors" >"$OUT/logits-$1-$2.log" 2>&1
    timeout 300 $rill logits -m "$f" --tokens $toks --backend cpu -o "$LOGITS/logits-cpu-$1-$2.safetensors" >>"$OUT/logits-$1-$2.log" 2>&1
    compare_logits "$LOGITS/logits-cuda-$1-$2.safetensors" "$LOGITS/logits-cpu-$1-$2.safetensors"
done

# ---- 3b. decode kernel variants end to end ---------------------------------------------------------
# RILL_CUDA_MATVEC picks the decode matvec kernels (src/backend/cuda/ops/linear.rs): exact (f32 on
# dequantized weights) or q8 (fast tier: 8-bit activations, dp4a). tg128 of each, then the q8
# logits against the CPU's exact ones (the fast tier's drift at real depth).
for m in "${models[@]}"; do
    set -- $m
    f="$MODELS/$1-$2.gguf"
    for v in exact q8; do
        log "decode variant $v: $1 $2"
        RILL_CUDA_MATVEC=$v timeout 300 $rill bench -m "$f" --backend cuda -p "" -n 128 -r 3 --json \
            >"$OUT/variant-$v-$1-$2.json" 2>"$OUT/variant-$v-$1-$2.log"
    done
    RILL_CUDA_MATVEC=q8 timeout 300 $rill logits -m "$f" --tokens $toks --decode --backend cuda \
        -o "$LOGITS/logits-cuda-q8-$1-$2.safetensors" >>"$OUT/logits-$1-$2.log" 2>&1
    compare_logits "$LOGITS/logits-cuda-q8-$1-$2.safetensors" "$LOGITS/logits-cpu-$1-$2.safetensors"
done
if [ -z "${SKIP_MODELS:-}" ]; then
    log "profile q8 decode qwen3.5-9b q4_k_m"
    RILL_CUDA_MATVEC=q8 RILL_PROFILE=1 timeout 300 $rill bench -m "$MODELS/qwen3.5-9b-q4_k_m.gguf" --backend cuda \
        -p "" -n 64 -r 1 --no-warmup >"$OUT/profile-decode-q8-qwen3.5-9b-q4_k_m.txt" 2>&1
    grep -A 9 "by phase" "$OUT/profile-decode-q8-qwen3.5-9b-q4_k_m.txt" | tee -a "$OUT/summary.txt"
fi

# ---- 4. summary ---------------------------------------------------------------------------------
log "summary"
python3 - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import json, os, sys, glob
out = sys.argv[1]
targets = {"qwen3.5-9b-q4_k_m": 340, "qwen3.5-9b-q8_0": 300, "qwen3.5-35b-a3b-q4_k_m": 400}
print(f"{'model':<26} {'tg128 t/s':>12} {'target':>7} {'pp102 t/s':>12} {'pp512 t/s':>12}")
for name, tgt in targets.items():
    p = os.path.join(out, f"bench-{name}.json")
    row = {"tg128": "-", "pp102": "-", "pp512": "-"}
    try:
        j = json.load(open(p))
        for r in j["tests"]:
            row[r["test"]] = f"{r['tokens_per_s_mean']:.1f}"
        if name == "qwen3.5-9b-q4_k_m":
            print(f"device: {j['device']}; {j['driver']}; commit {j['commit']}")
    except Exception as e:
        row["tg128"] = f"({type(e).__name__})"
    ok = "" if row["tg128"] in ("-",) or row["tg128"].startswith("(") else ("ok" if float(row["tg128"]) >= tgt else "BELOW")
    print(f"{name:<26} {row['tg128']:>12} {tgt:>7} {row['pp102']:>12} {row['pp512']:>12} {ok}")
print("decode variants (RILL_CUDA_MATVEC), tg128 tokens/s:")
for name, tgt in targets.items():
    cells = []
    for v in ("exact", "q8"):
        try:
            j = json.load(open(os.path.join(out, f"variant-{v}-{name}.json")))
            cells.append(f"{v} {j['tests'][0]['tokens_per_s_mean']:.1f}")
        except Exception as e:
            cells.append(f"{v} ({type(e).__name__})")
    print(f"  {name:<26} {' | '.join(cells)}   target {tgt}")
for f in sorted(glob.glob(os.path.join(out, "test-*.log"))):
    res = [l.strip() for l in open(f, errors="replace") if l.startswith("test result:")]
    print(f"{os.path.basename(f)[5:-4]:<26} {res[-1] if res else 'no result (crashed or timed out)'}")
mb = os.path.join(out, "matvec_bench.log")
if os.path.exists(mb):
    for l in open(mb, errors="replace"):
        if l.startswith(("estimated", "PASS", "FAIL", "device")):
            print(l.rstrip())
EOF
# Every text log in one tarball (the device call returns only a few files).
tar -czf "$OUT/logs.tar.gz" -C "$OUT" --exclude=logs.tar.gz . 2>/dev/null || true
