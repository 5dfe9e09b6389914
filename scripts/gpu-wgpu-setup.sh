# Sourced by the wgpu GPU jobs (scripts/gpu-wgpu.sh, scripts/gpu-wgpu-ab.sh) from the tree's
# root: unpacks .gpu-wgpu/bundle.tar.xz (scripts/pack-gpu-wgpu.sh) into $bin, links the directory
# the test executables were built in to this tree, installs the Vulkan loader of .gl/ for the
# NVIDIA driver (RILL_GPU_SETUP=0 skips it: a machine with its own driver, e.g. lavapipe) and
# sets $rill (RILL_WGPU_BIN: another unpack directory than /tmp/rill-wgpu-bin). Returns 1, saying
# why, when there is no bundle.
if [ ! -f .gpu-wgpu/bundle.tar.xz ]; then
    echo "no .gpu-wgpu/bundle.tar.xz: run scripts/pack-gpu-wgpu.sh first (on the build machine)" >&2
    return 1
fi
bin=${RILL_WGPU_BIN:-/tmp/rill-wgpu-bin}
rm -rf "$bin" && mkdir -p "$bin"
python3 -c "import sys, tarfile; tarfile.open('.gpu-wgpu/bundle.tar.xz').extractall(sys.argv[1])" "$bin"
chmod +x "$bin"/*
built=$(cat .gpu-wgpu/manifest_dir)
if [ "$built" != "$PWD" ] && [ ! -e "$built" ]; then
    mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"
fi
if [ "${RILL_GPU_SETUP:-1}" = 1 ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export RILL_WGPU_ADAPTER=${RILL_WGPU_ADAPTER:-h200}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
rill=$bin/rill
