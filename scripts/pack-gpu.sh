#!/usr/bin/env bash
# Builds and packs what scripts/gpu-wgpu.sh runs on the lent GPU machine, which has no Rust: the
# rill binary and the wgpu test binaries, stripped and xz-compressed into .bin/wgpu/bins.tar.xz
# (~20 MB), plus the Vulkan loader packages in .gl/ (../shared/TOOLCHAIN.md). Both folders are
# git-ignored; pass them to the device tool's `carry`:
#   bash scripts/pack-gpu.sh
#   run(command="bash scripts/gpu-wgpu.sh tests", carry=[".bin", ".gl"], kind="nvidia-h200")
#   run(command="bash scripts/gpu-wgpu.sh bench", carry=[".bin", ".gl"])
set -euo pipefail
cd "$(dirname "$0")/.."
tests=(wgpu_ops wgpu_linear wgpu_moe wgpu_delta wgpu_smoke wgpu_pieces wgpu_fast e2e_fixtures)
args=()
for t in "${tests[@]}"; do
    args+=(--test "$t")
done
cargo build --release
cargo test --release --no-run "${args[@]}" --message-format=json >/tmp/pack-gpu.json
stage=.bin/wgpu/stage
rm -rf .bin/wgpu
mkdir -p "$stage"
cp target/release/rill "$stage/rill"
# The executables of the named test targets (cargo prints one JSON line per artifact).
python3 - /tmp/pack-gpu.json "$stage" "${tests[@]}" <<'EOF'
import json, shutil, sys
log, stage, wanted = sys.argv[1], sys.argv[2], set(sys.argv[3:])
found = set()
for line in open(log):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("name") in wanted and "test" in t.get("kind", []):
        shutil.copy(m["executable"], f"{stage}/{t['name']}")
        found.add(t["name"])
missing = wanted - found
if missing:
    sys.exit(f"test binaries not found: {sorted(missing)}")
EOF
strip "$stage"/*
# Test binaries find tests/fixtures through the compile-time CARGO_MANIFEST_DIR: record it so
# gpu-wgpu.sh can point that path at its own checkout.
pwd >"$stage/MANIFEST_DIR"
git rev-parse --short=12 HEAD >"$stage/COMMIT"
tar -C "$stage" -cf - . | xz -T2 -6 >.bin/wgpu/bins.tar.xz
rm -rf "$stage"
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
    mkdir -p .gl /tmp/amd64/partial
    o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
    apt-get "${o[@]}" update -qq
    (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .bin/wgpu/bins.tar.xz .gl
