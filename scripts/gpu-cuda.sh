#!/usr/bin/env bash
# The CUDA GPU job, in one device call of at most 600 s (built here by scripts/pack-gpu.sh, carried
# in .gpu/). Every stage has a deadline inside BUDGET (default 580 s), so the logs always come back:
#   0. `rill synth` of qwen3.5-9b q4_k_m and q8_0 and qwen3.5-35b-a3b q4_k_m starts at once, in the
#      background (CPU work, while the GPU runs the tests);
#   1. the CUDA test suite (device op tests, recorded steps, end-to-end fixtures, CLI, synthesized
#      models): every test runs the cuda backend at both precision tiers (tests/common DEVICES);
#   2. `rill bench` at --precision fast and exact: 9B q4_k_m and q8_0 -p 102,512,4096 -n 128,
#      35B-A3B q4_k_m -p 512 -n 128;
#   3. RILL_PROFILE=1 of one pp512 of 9B q4_k_m (fast, then exact) and 35B-A3B q4_k_m (fast): the
#      per-phase and per-class split (GEMMs with TFLOP/s, delta rule, attention, rest);
#   4. fast against exact on the real shapes: the logits of a 100-token prompt on the same file
#      (rel L2 and argmax agreement per position);
#   5. the fused variants end to end: tg128 of each model with them (the default) and without
#      (RILL_CUDA_FUSION=0), the unfused logits of token-by-token decode against the fused ones,
#      and decode profiles of the default kernels;
#   6. the prefill kernel harness (dev/cuda/prefill_bench all --quick), then the decode harness
#      (matvec_bench: every decode matvec variant checked and timed, its winner table), each in the
#      time left;
#   7. a summary (printed last, also $OUT/summary.txt) and every log in $OUT/gpu-logs.tar.gz.
# Run from the repository root, carrying .gpu:
#   bash scripts/gpu-cuda.sh
# SKIP_MODELS=1 leaves out the model stages (a dry run of the plumbing); BUDGET=N changes the budget.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/rill-gpu-logs.XXXXXX)
MODELS=${MODELS:-/tmp/rill-models}
mkdir -p "$MODELS"
BUDGET=${BUDGET:-580}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
# `limit N`: N seconds, or what is left of the budget minus a reserve for the summary, if less.
limit() {
    local l=$(($(left) - 25))
    [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"
}
log() { echo "== $(date +%T) +$((SECONDS - START))s $*" | tee -a "$LOGS/summary.txt" >&2; }
: >"$LOGS/summary.txt"
pack() {
    cp "$LOGS/summary.txt" "$OUT/summary.txt"
    tar -czf "$OUT/gpu-logs.tar.gz" -C "$LOGS" .
}
trap pack EXIT

# ---- unpack -----------------------------------------------------------------------------------
if [ ! -f .gpu/bundle.tar.xz ]; then
    echo "no .gpu/bundle.tar.xz: run scripts/pack-gpu.sh first (on the build machine)" >&2
    exit 1
fi
python3 -c "import tarfile; tarfile.open('.gpu/bundle.tar.xz').extractall('.')"
chmod +x target/release/rill target/release/matvec_bench target/release/prefill_bench $(cat .gpu/tests.txt)
# The test executables look for the fixtures and the rill binary under the directory they were
# built in: make that path lead here.
built=$(cat .gpu/manifest_dir)
if [ "$built" != "$PWD" ] && [ ! -e "$built" ]; then
    mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"
fi
log "commit $(cat .gpu/commit), tree at $PWD (built in $built), budget ${BUDGET}s"
nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1 || true
head -15 "$LOGS/nvidia-smi.txt" >&2

rill=target/release/rill
models=("qwen3.5-9b q4_k_m" "qwen3.5-9b q8_0" "qwen3.5-35b-a3b q4_k_m")
[ -n "${SKIP_MODELS:-}" ] && models=()
model_file() { echo "$MODELS/$1-$2.gguf"; }

# ---- 0. synthesize the models in the background -------------------------------------------------
synth_pids=()
for m in "${models[@]}"; do
    set -- $m
    f=$(model_file "$1" "$2")
    if [ -f "$f" ]; then continue; fi
    (timeout "$(limit 400)" $rill synth --shape "$1" --quant "$2" -o "$f.part" >"$LOGS/synth-$1-$2.log" 2>&1 &&
        mv "$f.part" "$f") &
    synth_pids+=($!)
done
log "synthesizing ${#synth_pids[@]} models in the background"
# `ready NAME QUANT`: wait (within the budget) for a model file; false if it is not there.
ready() {
    local f
    f=$(model_file "$1" "$2")
    while [ ! -f "$f" ] && [ "$(left)" -gt 60 ] && jobs -r | grep -q .; do sleep 2; done
    [ -f "$f" ]
}

# ---- 1. tests -----------------------------------------------------------------------------------
# The tests end by TESTS_END s into the budget (the benches need the rest).
TESTS_END=${TESTS_END:-250}
log "tests (cuda at both tiers; RILL_TEST_REQUIRE_CUDA=1), until +${TESTS_END}s"
export RILL_TEST_REQUIRE_CUDA=1
# Most telling first (a run out of time skips the last ones).
order="e2e_fixtures device_fused device_group device_linear device_ops device_delta device_moe cuda_steps device_fast concurrency"
tests=$(for n in $order; do grep "/$n-" .gpu/tests.txt; done; grep -v -E "/($(echo $order | tr ' ' '|'))-" .gpu/tests.txt)
for t in $tests; do
    name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
    room=$((TESTS_END - (SECONDS - START)))
    if [ "$room" -lt 5 ]; then
        echo "test $name: not run (tests' time used up)" | tee -a "$LOGS/summary.txt"
        continue
    fi
    timeout "$(limit "$room")" "$t" --test-threads=4 >"$LOGS/test-$name.log" 2>&1
    st=$?
    res=$(grep -E "^test result:" "$LOGS/test-$name.log" | tail -1)
    echo "test $name: exit $st: $res" | tee -a "$LOGS/summary.txt"
    grep -E "^test .* FAILED$|panicked at" "$LOGS/test-$name.log" | head -20 | tee -a "$LOGS/summary.txt"
    grep -A3 "panicked at" "$LOGS/test-$name.log" | grep -vE "^--$|panicked at|^note:" | head -10 >>"$LOGS/summary.txt"
done
# The product and MoE tests again with the fused variants off (RILL_CUDA_FUSION=0, src/backend/cuda/
# policy.rs): every op in launches of its own, so the unfused paths stay tested on the device.
for n in device_linear device_moe device_fused; do
    t=$(grep "/$n-" .gpu/tests.txt | head -1)
    [ -n "$t" ] || continue
    room=$((TESTS_END + 20 - (SECONDS - START)))
    [ "$room" -ge 5 ] || { echo "test $n (fusion off): not run (time used up)" | tee -a "$LOGS/summary.txt"; continue; }
    RILL_CUDA_FUSION=0 timeout "$(limit "$room")" "$t" --test-threads=4 >"$LOGS/test-$n-unfused.log" 2>&1
    st=$?
    echo "test $n (RILL_CUDA_FUSION=0): exit $st: $(grep -E "^test result:" "$LOGS/test-$n-unfused.log" | tail -1)" |
        tee -a "$LOGS/summary.txt"
    grep -E "^test .* FAILED$|panicked at" "$LOGS/test-$n-unfused.log" | head -10 | tee -a "$LOGS/summary.txt"
done
unset RILL_TEST_REQUIRE_CUDA

# ---- 2. bench -------------------------------------------------------------------------------------
bench() { # bench NAME QUANT PRECISION PROMPTS REPS
    local f tag
    f=$(model_file "$1" "$2")
    tag="$1-$2-$3"
    ready "$1" "$2" || { log "bench $tag: no model file (synth: $(tail -1 "$LOGS/synth-$1-$2.log" 2>/dev/null))"; return; }
    log "bench $tag -p $4 -n 128 -r $5"
    timeout "$(limit 120)" $rill bench -m "$f" --backend cuda --precision "$3" -p "$4" -n 128 -r "$5" --json \
        >"$LOGS/bench-$tag.json" 2>"$LOGS/bench-$tag.log"
    echo "exit $?" >>"$LOGS/bench-$tag.log"
}
# The fast tier first (the numbers of issue 8), then the exact tier as the baseline.
for prec in fast exact; do
    reps=3
    [ $prec = exact ] && reps=1
    bench qwen3.5-9b q4_k_m $prec 102,512,4096 $reps
    bench qwen3.5-9b q8_0 $prec 102,512,4096 $reps
    bench qwen3.5-35b-a3b q4_k_m $prec 512 $reps
done

# ---- 3. profiles of one 512-token prefill ------------------------------------------------------
profile() { # profile NAME QUANT PRECISION [PROMPT_TOKENS]
    local f tag p=${4:-512}
    f=$(model_file "$1" "$2")
    tag="$1-$2-$3"
    ready "$1" "$2" || return
    log "profile pp$p $tag (RILL_PROFILE=1)"
    RILL_PROFILE=1 timeout "$(limit 90)" $rill bench -m "$f" --backend cuda --precision "$3" -p "$p" -n 0 -r 1 \
        --no-warmup >"$LOGS/profile-pp$p-$tag.txt" 2>&1
    { echo "-- $tag pp$p"; sed -n '/by class/,/by kernel/p' "$LOGS/profile-pp$p-$tag.txt" | grep -v "by kernel"; } |
        tee -a "$LOGS/summary.txt"
}
profile qwen3.5-9b q4_k_m fast
profile qwen3.5-35b-a3b q4_k_m fast
profile qwen3.5-9b q4_k_m exact
# A short prompt, where the 15 ms target is tightest (Q8_0 reads the most weight bytes).
profile qwen3.5-9b q8_0 fast 102
profile qwen3.5-9b q4_k_m fast 102

# ---- 4. fast against exact on the real shapes ---------------------------------------------------
# `compare_logits A B`: rel L2 per position, max abs, argmax agreement of A against B.
compare_logits() {
    python3 - "$1" "$2" <<'EOF' 2>&1 | tee -a "$LOGS/summary.txt"
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
name = lambda p: p.split('/')[-1].replace('.safetensors', '')
print(f"logits {name(sys.argv[1])} vs {name(sys.argv[2])}: rel L2 max {rel.max():.2e} median {np.median(rel):.2e}, "
      f"max abs {np.abs(a - c).max():.2e}, argmax {agree}/{len(rel)}, non-finite {int((~np.isfinite(a)).sum())}")
EOF
}
toks=$(python3 -c "print(','.join(str((7919 * i + 13) % 150000 + 100) for i in range(100)))")
for m in "${models[@]}"; do
    set -- $m
    ready "$1" "$2" || continue
    [ "$(left)" -gt 90 ] || break
    f=$(model_file "$1" "$2")
    log "logits fast vs exact $1 $2 (100-token prompt, one batch)"
    for prec in fast exact; do
        timeout "$(limit 60)" $rill logits -m "$f" --tokens "$toks" --backend cuda --precision $prec \
            -o "$LOGS/logits-$prec-$1-$2.safetensors" >>"$LOGS/logits-$1-$2.log" 2>&1
    done
    compare_logits "$LOGS/logits-fast-$1-$2.safetensors" "$LOGS/logits-exact-$1-$2.safetensors"
    rm -f "$LOGS"/logits-*-"$1-$2".safetensors
done

# ---- 5. the fused variants end to end -------------------------------------------------------------
# `decode_profile QUANT SECONDS`: where a 9B decode step's time goes with the default kernels, per
# phase and per kernel (the prep launches and the kernels that prepare their output among them),
# if at least SECONDS of the budget are left.
decode_profile() {
    local f="$LOGS/profile-decode-exact-qwen3.5-9b-$1.txt"
    ready qwen3.5-9b "$1" && [ "$(left)" -gt "$2" ] || return 0
    log "profile exact decode qwen3.5-9b $1"
    RILL_PROFILE=1 timeout "$(limit 60)" $rill bench -m "$(model_file qwen3.5-9b "$1")" \
        --backend cuda -p "" -n 64 -r 1 --no-warmup >"$f" 2>&1
    grep -A 9 "by phase" "$f" | tee -a "$LOGS/summary.txt"
    grep -E "mvtc_prep|rms_norm|sigmoid_mul|gated_rms" "$f" | head -12 | tee -a "$LOGS/summary.txt"
}
decode_profile q8_0 90

# tg128 with the fused variants (the default) and without (RILL_CUDA_FUSION=0), then the unfused
# logits of 8 tokens decoded one by one against the fused ones (the drift at real depth).
short=785,3974,293,4830,282,5131,7784,82
for m in "${models[@]}"; do
    set -- $m
    ready "$1" "$2" || continue
    [ "$(left)" -gt 120 ] || break
    f=$(model_file "$1" "$2")
    for v in fused unfused; do
        fusion=1
        [ "$v" = unfused ] && fusion=0
        log "decode $v: $1 $2"
        RILL_CUDA_FUSION=$fusion timeout "$(limit 60)" $rill bench -m "$f" --backend cuda -p "" -n 128 -r 2 --json \
            >"$LOGS/variant-$v-$1-$2.json" 2>"$LOGS/variant-$v-$1-$2.log"
        RILL_CUDA_FUSION=$fusion timeout "$(limit 60)" $rill logits -m "$f" --tokens $short --decode --backend cuda \
            -o "$LOGS/logits-decode-$v-$1-$2.safetensors" >>"$LOGS/logits-$1-$2.log" 2>&1
    done
    compare_logits "$LOGS/logits-decode-unfused-$1-$2.safetensors" "$LOGS/logits-decode-fused-$1-$2.safetensors"
    rm -f "$LOGS"/logits-decode-*-"$1-$2".safetensors
done
decode_profile q4_k_m 110

# ---- 6. kernel harnesses --------------------------------------------------------------------------
if [ "$(left)" -gt 70 ]; then
    log "prefill harness (prefill_bench all --quick, $(limit 200) s at most)"
    mkdir -p "$LOGS/prefill"
    OUT="$LOGS/prefill" timeout "$(limit 200)" target/release/prefill_bench all --quick >"$LOGS/prefill_bench.txt" 2>&1
    echo "prefill_bench exit $? (124: stopped at its time limit)" | tee -a "$LOGS/summary.txt"
    grep -E "================ summary|FAIL|CUDA error" "$LOGS/prefill_bench.txt" | head -12 | tee -a "$LOGS/summary.txt"
fi
if [ "$(left)" -gt 60 ]; then
    log "matvec harness"
    MVB_PDL=1 timeout "$(limit 240)" target/release/matvec_bench >"$LOGS/matvec_bench.log" 2>&1
    echo "matvec_bench exit $? (124: stopped at its time limit)" | tee -a "$LOGS/matvec_bench.log" "$LOGS/summary.txt"
    sed -n '/==== winners/,$p' "$LOGS/matvec_bench.log" | tee -a "$LOGS/summary.txt"
fi
for p in "${synth_pids[@]}"; do kill "$p" 2>/dev/null; done

# ---- 7. summary ---------------------------------------------------------------------------------
log "summary"
python3 - "$LOGS" <<'EOF' | tee -a "$LOGS/summary.txt"
import json, os, sys, glob
out = sys.argv[1]
# issue 8 targets: pp512 and pp4096 >= 10,000 t/s, a 102-token prompt in <= 15 ms (9B, both
# quants); 35B-A3B pp512 >= 6,000.
targets = {"qwen3.5-9b-q4_k_m": {"pp512": 10000, "pp4096": 10000, "pp102": 102 / 0.015},
           "qwen3.5-9b-q8_0": {"pp512": 10000, "pp4096": 10000, "pp102": 102 / 0.015},
           "qwen3.5-35b-a3b-q4_k_m": {"pp512": 6000}}
cols = ["pp102", "pp512", "pp4096", "tg128"]
print(f"{'model':<24} {'prec':<6} " + " ".join(f"{c + ' t/s':>14}" for c in cols) + "  pp102 ms")
for name, tg in targets.items():
    for prec in ["fast", "exact"]:
        p = os.path.join(out, f"bench-{name}-{prec}.json")
        row, note = {}, ""
        try:
            j = json.load(open(p))
            for r in j["tests"]:
                row[r["test"]] = r["tokens_per_s_mean"]
            if name == "qwen3.5-9b-q4_k_m" and prec == "fast":
                print(f"device: {j.get('device')}; {j.get('driver')}; commit {j.get('commit')}; precision {j.get('precision', '?')}")
        except Exception as e:
            note = f"({type(e).__name__})"
        cells = []
        for c in cols:
            v = row.get(c)
            mark = ""
            if v is not None and c in tg:
                mark = "+" if v >= tg[c] else "-"
            cells.append(f"{(f'{v:.1f}' if v is not None else '-') + mark:>14}")
        ms = f"{102 / row['pp102'] * 1000:.1f}" if row.get("pp102") else "-"
        print(f"{name:<24} {prec:<6} " + " ".join(cells) + f"  {ms:>8} {note}")
print("(+ / -: at or above / below the issue 8 target)")
print("fused variants (default) and RILL_CUDA_FUSION=0, tg128 tokens/s:")
for name in targets:
    cells = []
    for v in ("fused", "unfused"):
        try:
            j = json.load(open(os.path.join(out, f"variant-{v}-{name}.json")))
            cells.append(f"{v} {j['tests'][0]['tokens_per_s_mean']:.1f}")
        except Exception as e:
            cells.append(f"{v} ({type(e).__name__})")
    print(f"  {name:<26} {' | '.join(cells)}")
for f in sorted(glob.glob(os.path.join(out, "test-*.log"))):
    res = [l.strip() for l in open(f, errors="replace") if l.startswith("test result:")]
    print(f"{os.path.basename(f)[5:-4]:<26} {res[-1] if res else 'no result (crashed or timed out)'}")
EOF
