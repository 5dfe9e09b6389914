#!/usr/bin/env bash
# The wgpu GPU job on the lent H200 (Vulkan), built here by scripts/pack-gpu-wgpu.sh and carried
# in .gpu-wgpu/ (with the Vulkan loader packages in .gl/). Made to follow scripts/gpu-cuda.sh in
# the same device call: it reuses the synthesized models that script left in $MODELS
# (/tmp/rill-models/<shape>-<quant>.gguf; made here if missing) and keeps to its own time budget
# (WGPU_BUDGET_S, default 290 s: every step gets a timeout within what is left, and steps that no
# longer fit are skipped and say so).
#   1. the device op suite and the end-to-end fixtures on wgpu (RILL_TEST_BACKENDS=wgpu): the
#      subgroup path, then the plain path (RILL_TEST_WGPU=plain, what browsers run) for the matrix
#      kernels, and Fast precision (cooperative matrices where the driver lists them);
#   2. `rill bench --backend wgpu`: 9B q4_k_m (pp102, pp512, tg128; exact, then Fast prefill),
#      35B-A3B q4_k_m (tg128, pp512), 9B q8_0 (tg128, pp512);
#   3. wgpu's logits against the CPU backend's at the real shapes (9B and 35B-A3B q4_k_m: a
#      70-token prefill, and 8 tokens decoded through recorded steps);
#   4. RILL_PROFILE=1 decode runs (per-kernel GPU time and GB/s) of 9B q4_k_m and 35B-A3B, a
#      9B q4_k_m decode with the fused dispatches off (RILL_WGPU_FUSION=0), and a Fast prefill
#      profile of 9B q4_k_m (the tuning numbers and kernel variants are measured per product by
#      examples/mv_bench.rs --wgpu);
#   5. a summary, printed last.
# Everything lands in ONE file, $OUT/wgpu.tar.gz (logs, bench JSON, profiles, summary.txt),
# refreshed after each phase. After the CUDA job in one 600 s call, give it what is left (at most
# the default):
#   bash scripts/gpu-cuda.sh; left=$((585 - SECONDS)); WGPU_BUDGET_S=$((left < 290 ? left : 290)) bash scripts/gpu-wgpu.sh
# Alone, the models are synthesized first (minutes): give it the whole call, WGPU_BUDGET_S=580.
# RILL_GPU_SETUP=0 skips the Vulkan loader setup (a dry run on a machine with its own driver,
# e.g. RILL_GPU_SETUP=0 RILL_WGPU_ADAPTER=llvmpipe on lavapipe); SKIP_MODELS=1 leaves out the
# models, SKIP_TESTS=1 the tests.
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
BUDGET=${WGPU_BUDGET_S:-290}
OUT=${OUT:-$PWD/out}
MODELS=${MODELS:-/tmp/rill-models}
mkdir -p "$OUT" "$MODELS"
logs=$(mktemp -d /tmp/rill-wgpu-logs.XXXXXX)
summary=$logs/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary" >&2; }
left() { echo $((BUDGET - (SECONDS - t0))); }
# `step CAP LOG cmd...`: run cmd with a timeout of CAP seconds or what is left of the budget
# (minus 15 s for packing), stdout and stderr to LOG; skipped when under 10 s are left.
step() {
    local cap=$1 log=$2
    shift 2
    local t
    t=$(($(left) - 15))
    [ "$t" -gt "$cap" ] && t=$cap
    if [ "$t" -lt 10 ]; then
        note "skipped (budget): $*"
        echo "skipped (budget)" >"$log"
        return 124
    fi
    timeout -k 5 "$t" "$@" >"$log" 2>&1
}
# The tarball is refreshed after every phase: a call cut short still brings back what was done.
save() {
    tar -C "$logs" -czf "$OUT/wgpu.tar.gz.part" . && mv "$OUT/wgpu.tar.gz.part" "$OUT/wgpu.tar.gz"
}
finish() {
    note "wgpu job: $((SECONDS - t0)) s"
    save
    echo "==== wgpu summary (all logs in $OUT/wgpu.tar.gz)"
    cat "$summary"
    rm -rf "$logs"
}
trap finish EXIT

# ---- unpack and set up Vulkan ----------------------------------------------------------------
# shellcheck source=scripts/gpu-wgpu-setup.sh
if ! . scripts/gpu-wgpu-setup.sh 2>>"$summary"; then
    note "setup failed (see above)"
    exit 1
fi
note "wgpu job: commit $(cat .gpu-wgpu/commit), tree at $PWD (built in $built), budget ${BUDGET} s"
step 30 "$logs/adapter.txt" "$rill" bench -m tests/fixtures/tiny-dense.F16.gguf --backend wgpu -p 8 -n 8 -r 1
grep -E '^backend' "$logs/adapter.txt" | tee -a "$summary" >&2 || tail -3 "$logs/adapter.txt" | tee -a "$summary" >&2

# ---- 1. tests ---------------------------------------------------------------------------------
# `run_test CAP NAME TAG [VAR=value...]`: one test executable in one environment.
run_test() {
    local cap=$1 name=$2 tag=$3
    shift 3
    local log="$logs/test-$name-$tag.log"
    step "$cap" "$log" env RILL_TEST_BACKENDS=wgpu "$@" "$bin/$name" --test-threads=4
    local st=$?
    note "$(printf 'test %-14s %-9s exit %3s: %s' "$name" "$tag" "$st" "$(grep -E '^test result:' "$log" | tail -1)")"
    grep -E '^test .* FAILED$|panicked at' "$log" | head -8 | tee -a "$summary" >&2
}
plain_tests() {
    for t in device_linear device_moe e2e_fixtures; do
        run_test 30 "$t" plain RILL_TEST_WGPU=plain
    done
}
if [ -z "${SKIP_TESTS:-}" ]; then
    for t in device_ops device_linear device_moe device_delta device_pieces device_fused device_group e2e_fixtures prefix_cache; do
        run_test 45 "$t" subgroup
    done
    run_test 45 device_fast fast
    # The f32 K-quant decode units (the packed-integer-dot ones are the default here; caps.rs).
    for t in device_linear device_group e2e_fixtures; do
        run_test 45 "$t" nodot RILL_TEST_WGPU=nodot
    done
    # Every fused decode dispatch off (policy.rs): the fallbacks, on the packed-dot units.
    for t in device_moe device_linear e2e_fixtures; do
        run_test 45 "$t" nofusion RILL_TEST_WGPU=nofusion
    done
else
    plain_tests() { :; }
fi
if [ -n "${SKIP_MODELS:-}" ]; then
    plain_tests
    exit 0
fi

save
# ---- 2. bench ---------------------------------------------------------------------------------
model() { # the synthesized model $1 $2, made if gpu-cuda.sh did not leave it
    local f="$MODELS/$1-$2.gguf"
    # Written under another name first: a synth cut short leaves no file that looks complete.
    if [ ! -s "$f" ] && step 150 "$logs/synth-$1-$2.log" "$rill" synth --shape "$1" --quant "$2" -o "$f.part"; then
        mv "$f.part" "$f"
    fi
    echo "$f"
}
# `bench SHAPE QUANT TAG CAP [rill bench args...]`
bench() {
    local shape=$1 quant=$2 tag=$3 cap=$4
    shift 4
    local f
    f=$(model "$shape" "$quant")
    local base="$logs/bench-$shape-$quant-$tag"
    step "$cap" "$base.log" "$rill" bench -m "$f" --backend wgpu --json "$@"
    local st=$?
    # The log holds stderr's lines and the pretty-printed JSON (the only `{` in column 0).
    python3 - "$base.log" "$base.json" <<'EOF' 2>/dev/null
import json, re, sys
s = open(sys.argv[1], errors="replace").read()
i = [m.start() for m in re.finditer(r"^\{", s, re.M)][-1]
json.dump(json.loads(s[i:s.rindex("}") + 1]), open(sys.argv[2], "w"), indent=1)
EOF
    note "$(python3 - "$base.json" "$shape $quant $tag" "$st" <<'EOF' 2>/dev/null || echo "bench $shape $quant $tag: exit $st (no result)"
import json, sys
j = json.load(open(sys.argv[1]))
rows = ", ".join(f"{r['test']} {r['tokens_per_s_mean']:.1f}" for r in j["tests"])
print(f"bench {sys.argv[2]:<28} [{j.get('precision', '?')}] {rows} t/s (exit {sys.argv[3]})")
EOF
)"
}
note "== bench (rill bench --backend wgpu, tokens/s)"
bench qwen3.5-9b q4_k_m exact 90 -p 102,512 -n 128 -r 2
bench qwen3.5-35b-a3b q4_k_m exact 75 -p 512 -n 128 -r 2
bench qwen3.5-9b q4_k_m fast 45 -p 102,512 -n 0 -r 2 --precision fast
bench qwen3.5-9b q8_0 exact 60 -p 512 -n 128 -r 2

save
# ---- correctness at the real shapes -------------------------------------------------------------
# wgpu's logits against the CPU backend's on the 9B and 35B-A3B files: a 70-token prefill (crosses
# a 64-token tile) and the first 8 tokens decoded one by one (recorded, replayed steps), each
# against the CPU's prefill (strict tier: rel L2 around 1e-5, argmax equal except near-ties).
logits_check() { # SHAPE QUANT
    local f
    f=$(model "$1" "$2")
    local toks8=785,3974,293,4830,282,5131,7784,82
    local toks=$toks8
    for i in $(seq 0 61); do toks="$toks,$(((i * 977 + 31) % 8166))"; done
    local tmp=/tmp/rill-wgpu-logits
    rm -rf "$tmp" && mkdir -p "$tmp"
    local log="$logs/logits-$1-$2"
    step 60 "$log-cpu.log" "$rill" logits -m "$f" --tokens "$toks" --backend cpu -o "$tmp/cpu.safetensors"
    step 40 "$log-prefill.log" "$rill" logits -m "$f" --tokens "$toks" --backend wgpu -o "$tmp/prefill.safetensors"
    step 40 "$log-decode.log" "$rill" logits -m "$f" --tokens "$toks8" --decode --backend wgpu \
        -o "$tmp/decode.safetensors"
    python3 - "$tmp" "$1 $2" <<'EOF' 2>&1 | tee -a "$summary" >&2
import json, os, struct, sys
try:
    import numpy as np
except ImportError:
    np = None
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + n])["logits"]
    s, e = t["data_offsets"]
    rows, v = t["shape"]
    if np is not None:
        return np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4").reshape(rows, v)
    flat = struct.unpack(f"<{rows * v}f", b[8 + n + s:8 + n + e])
    return [flat[r * v:(r + 1) * v] for r in range(rows)]
def row_stats(g, c):
    if np is not None:
        g, c = g.astype(np.float64), c.astype(np.float64)
        return (np.sqrt(((g - c) ** 2).sum() / max((c ** 2).sum(), 1e-300)), np.abs(g - c).max(),
                int(g.argmax() == c.argmax()))
    num = sum((a - b) ** 2 for a, b in zip(g, c))
    den = sum(b * b for b in c) or 1.0
    am = lambda x: max(range(len(x)), key=x.__getitem__)
    return (num / den) ** 0.5, max(abs(a - b) for a, b in zip(g, c)), int(am(g) == am(c))
d, name = sys.argv[1], sys.argv[2]
try:
    ref = load(os.path.join(d, "cpu.safetensors"))
except Exception as e:
    print(f"logits {name}: no CPU reference ({type(e).__name__})")
    sys.exit(0)
for tag in ("prefill", "decode"):
    try:
        got = load(os.path.join(d, f"{tag}.safetensors"))
    except Exception as e:
        print(f"logits {name} wgpu {tag}: none ({type(e).__name__})")
        continue
    # Without numpy only the first 8 rows (pure Python is slow at 248K logits a row).
    rows = len(got) if np is not None else min(len(got), 8)
    stats = [row_stats(got[r], ref[r]) for r in range(rows)]
    print(f"logits {name} wgpu {tag} vs cpu prefill: {rows} rows, rel L2 max {max(s[0] for s in stats):.2e}, "
          f"max abs {max(s[1] for s in stats):.2e}, argmax {sum(s[2] for s in stats)}/{rows}")
EOF
    rm -rf "$tmp"
}
logits_check qwen3.5-9b q4_k_m
logits_check qwen3.5-35b-a3b q4_k_m

save
# ---- 3. profiles ------------------------------------------------------------------------------
# Per-kernel GPU time from timestamps inside the pass; tokens/s of these runs are not the speed.
profile() { # SHAPE QUANT TAG CAP [rill bench args...]
    local shape=$1 quant=$2 tag=$3 cap=$4
    shift 4
    local f
    f=$(model "$shape" "$quant")
    local p="$logs/profile-$tag-$shape-$quant.txt"
    RILL_PROFILE=1 step "$cap" "$p" "$rill" bench -m "$f" --backend wgpu -r 1 --no-warmup "$@"
    note "-- profile $tag $shape $quant (exit $?)"
    grep -A12 '^wgpu profile' "$p" | tee -a "$summary" >&2
}
profile qwen3.5-9b q4_k_m decode 40 -p "" -n 32
profile qwen3.5-35b-a3b q4_k_m decode 40 -p "" -n 32
# The fused decode dispatches off (RILL_WGPU_FUSION=0) against the defaults: 9B q4_k_m decode.
# The defaults at tg64 -r 1, the A/Bs' baseline (tg128 above includes no step recording).
bench qwen3.5-9b q4_k_m tg64 30 -p "" -n 64 -r 1
bench qwen3.5-35b-a3b q4_k_m tg64 30 -p "" -n 64 -r 1
RILL_WGPU_FUSION=0 bench qwen3.5-9b q4_k_m nofuse 30 -p "" -n 64 -r 1
save
# After the numbers: the plain path's tests (the kernels browsers run).
plain_tests
profile qwen3.5-9b q4_k_m prefill-fast 40 -p 512 -n 0 --precision fast

# ---- 4. targets -------------------------------------------------------------------------------
python3 - "$logs" <<'EOF' 2>&1 | tee -a "$summary" >&2
import glob, json, os, sys
got = {}
for p in glob.glob(os.path.join(sys.argv[1], "bench-*.json")):
    j = json.load(open(p))
    tag = os.path.basename(p)[6:-5]
    for r in j["tests"]:
        got[(tag, r["test"])] = r["tokens_per_s_mean"]
targets = [("qwen3.5-9b-q4_k_m-exact", "tg128", 200), ("qwen3.5-9b-q4_k_m-exact", "pp512", 4000),
           ("qwen3.5-9b-q4_k_m-fast", "pp512", 4000), ("qwen3.5-9b-q4_k_m-exact", "pp102", 1500),
           ("qwen3.5-9b-q4_k_m-fast", "pp102", 1500), ("qwen3.5-35b-a3b-q4_k_m-exact", "tg128", 200)]
print("targets (issue 9):")
for tag, test, want in targets:
    v = got.get((tag, test))
    print(f"  {tag:<30} {test:<6} {'-' if v is None else f'{v:9.1f}'} (target {want}) "
          f"{'' if v is None else ('ok' if v >= want else 'BELOW')}")
EOF
