#!/usr/bin/env bash
# Before/after on the GPU machine: packs the current build (target/release/rill, cuda + wgpu) beside a
# base rill binary and the named CUDA/wgpu test executables into .gpu-ab/ (stripped, one xz stream).
# Usage: bash scripts/pack-ab.sh BASE_RILL TEST... ; then a device call carrying .gpu-ab and .gl runs
# `bash .gpu-ab/gpu-ab.sh cuda` or `bash .gpu-ab/gpu-ab.sh wgpu` (see that script). With BASE_RILL "" (no
# base) the bundle serves scripts/gpu-batch.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1; shift
rm -rf /tmp/ab-stage && mkdir -p /tmp/ab-stage
cp target/release/rill /tmp/ab-stage/rill-new
[ -f "$base" ] && cp "$base" /tmp/ab-stage/rill-base
export NVCC=${NVCC:-$(ls $PWD/.cuda/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -1)}
cargo test --release --features cuda --no-run --message-format=json 2>/dev/null > /tmp/ab-tests.json
for t in "$@"; do
  exe=$(python3 -c "
import json,sys
for l in open('/tmp/ab-tests.json'):
  try: m=json.loads(l)
  except: continue
  if m.get('reason')=='compiler-artifact' and m.get('executable') and m['target']['name']=='$t' and m['profile']['test']: print(m['executable'])
" | tail -1)
  cp "$exe" /tmp/ab-stage/$t-bin
done
strip /tmp/ab-stage/*
mkdir -p .gpu-ab
tar -C /tmp/ab-stage -cf - . | xz -9 -T1 > .gpu-ab/bundle.tar.xz
cp scripts/gpu-ab.sh .gpu-ab/; echo "$PWD" > .gpu-ab/manifest_dir
ls -la .gpu-ab/
