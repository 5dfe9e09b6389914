#!/usr/bin/env bash
# Build everything the wgpu GPU job needs on this (GPU-less) machine and pack it into the
# git-ignored folder .gpu-wgpu/, which the device call carries (scripts/gpu-wgpu.sh unpacks and
# runs it there; the GPU machine has no Rust):
#   - target/release/rill (default features: wgpu),
#   - the test executables of the device op suite and the end-to-end fixtures,
#   - the Vulkan loader packages in .gl/ (the GPU machine has the NVIDIA ICD but no loader;
#     ../shared/TOOLCHAIN.md), downloaded once if missing.
# Binaries lose their debug info (symbols stay, for backtraces) and travel as one xz tar, which
# python3's tarfile unpacks there. Independent of scripts/pack-gpu.sh (the CUDA job's .gpu/):
#   bash scripts/pack-gpu.sh; bash scripts/pack-gpu-wgpu.sh
#   run(command="bash scripts/gpu-cuda.sh; bash scripts/gpu-wgpu.sh", carry=[".gpu", ".gpu-wgpu", ".gl"])
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tests=(device_ops device_linear device_moe device_delta device_pieces device_fused device_group device_fast e2e_fixtures
    prefix_cache)

echo "building rill and the wgpu test executables" >&2
cargo build --release --bin rill
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
cargo test --release "${args[@]}" --no-run --message-format=json >/tmp/rill-pack-wgpu.json
# The executables of the named test targets (cargo prints one JSON line per artifact).
exes=$(python3 - /tmp/rill-pack-wgpu.json "${tests[@]}" <<'EOF'
import json, sys
log, wanted = sys.argv[1], set(sys.argv[2:])
found = {}
for line in open(log):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("kind") == ["test"] and t.get("name") in wanted:
        found[t["name"]] = m["executable"]
missing = wanted - set(found)
if missing:
    sys.exit(f"test executables not found: {sorted(missing)}")
for name in sorted(found):
    print(f"{name} {found[name]}")
EOF
)

rm -rf .gpu-wgpu && mkdir -p .gpu-wgpu/stage
stage=.gpu-wgpu/stage
objcopy --strip-debug target/release/rill "$stage/rill"
: >.gpu-wgpu/tests.txt
while read -r name exe; do
    objcopy --strip-debug "$exe" "$stage/$name"
    echo "$name" >>.gpu-wgpu/tests.txt
done <<<"$exes"
# The test executables read tests/fixtures under the directory they were built in; the GPU
# script links that path to wherever the tree lands there.
echo "$root" >.gpu-wgpu/manifest_dir
git rev-parse --short=12 HEAD >.gpu-wgpu/commit 2>/dev/null || echo unknown >.gpu-wgpu/commit
(cd "$stage" && tar -cf - .) | xz -9 -T2 >.gpu-wgpu/bundle.tar.xz
rm -rf "$stage"

# The loader and the GL dispatch libraries the NVIDIA ICD (libGLX_nvidia.so.0) needs: without
# libglvnd's, the loader finds the ICD but cannot get vkCreateInstance from it.
gl_pkgs=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
missing=()
for p in "${gl_pkgs[@]}"; do
    ls .gl/"${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    mkdir -p .gl /tmp/amd64/partial
    o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
    apt-get "${o[@]}" update -qq
    (cd .gl && apt-get "${o[@]}" download "${missing[@]}")
fi

tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
pack_bytes=$(du -cb .gpu-wgpu .gl | tail -1 | cut -f1)
cuda_bytes=0
[ -d .gpu ] && cuda_bytes=$(du -cb .gpu | tail -1 | cut -f1)
total=$((tree_bytes + pack_bytes + $cuda_bytes))
printf 'tests packed: %s\n' "$(wc -l <.gpu-wgpu/tests.txt)"
printf 'working tree %.1f MiB + .gpu-wgpu and .gl %.1f MiB + .gpu %.1f MiB = %.1f MiB (limit 64 MiB)\n' \
    "$(echo "$tree_bytes / 1048576" | bc -l)" "$(echo "$pack_bytes / 1048576" | bc -l)" \
    "$(echo "$cuda_bytes / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
if [ "$total" -ge $((64 * 1024 * 1024)) ]; then
    echo "too large for one device call" >&2
    exit 1
fi
