#!/usr/bin/env bash
# A/B decode runs of the packed wgpu build (scripts/pack-gpu-wgpu.sh) on the GPU machine: one
# `rill bench -n N -r 1` per variant, the variants interleaved over ROUNDS rounds so that drift of
# the card or the host hits each alike (single runs of one job varied by several t/s). Variants are
# the lines of $AB: "SHAPE QUANT TAG [ENV=VALUE ...]". Writes $OUT/ab.txt (every run, then each
# variant's median) and the bench logs into $OUT/ab.tar.gz. A variant with BIN=PATH among its
# settings runs that rill instead (e.g. a previous pack's bundle, unpacked by hand into /tmp/old:
# BIN=/tmp/old/rill), for an A/B across commits (how kernel variants are measured end to end:
# the losing ones do not ship behind switches).
#   AB=$'qwen3.5-9b q4_k_m default\nqwen3.5-9b q4_k_m nofusion RILL_WGPU_FUSION=0' ROUNDS=3 \
#       bash scripts/gpu-wgpu-ab.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
MODELS=${MODELS:-/tmp/rill-models}
ROUNDS=${ROUNDS:-3}
N=${N:-64}
mkdir -p "$OUT" "$MODELS"
logs=$(mktemp -d /tmp/rill-ab-logs.XXXXXX)
# shellcheck source=scripts/gpu-wgpu-setup.sh
. scripts/gpu-wgpu-setup.sh || exit 1
echo "commit $(cat .gpu-wgpu/commit), $ROUNDS rounds of tg$N" | tee "$OUT/ab.txt"
mapfile -t variants <<<"${AB:?set AB to the variant lines}"
for v in "${variants[@]}"; do
    read -r shape quant _ <<<"$v"
    f="$MODELS/$shape-$quant.gguf"
    [ -s "$f" ] || "$rill" synth --shape "$shape" --quant "$quant" -o "$f" >"$logs/synth-$shape-$quant.log" 2>&1
done
for r in $(seq "$ROUNDS"); do
    for v in "${variants[@]}"; do
        read -r shape quant tag envs <<<"$v"
        log="$logs/$tag-$r.log"
        # BIN=path in a variant's line: another rill (an older build unpacked beside this one).
        exe=$rill
        for e in $envs; do
            case $e in BIN=*) exe=${e#BIN=} ;; esac
        done
        # shellcheck disable=SC2086
        env $envs timeout 120 "$exe" bench -m "$MODELS/$shape-$quant.gguf" --backend wgpu -p "" -n "$N" -r 1 \
            >"$log" 2>&1
        ts=$(grep -o "tg$N: [0-9.]*" "$log" | head -1 | cut -d' ' -f2)
        echo "round $r $tag ${ts:-failed}" | tee -a "$OUT/ab.txt"
    done
done
python3 - "$OUT/ab.txt" <<'PY' | tee -a "$OUT/ab.txt"
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    p = line.split()
    if p[:1] == ["round"] and p[3] != "failed":
        runs.setdefault(p[2], []).append(float(p[3]))
for tag, v in runs.items():
    print(f"median {tag:<16} {statistics.median(v):7.1f} t/s  (runs: {', '.join(f'{x:.1f}' for x in v)})")
PY
tar -C "$logs" -czf "$OUT/ab.tar.gz" .
