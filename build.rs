// Build script. The CUDA backend (feature `cuda`, not yet implemented) will compile
// `kernels-cuda/*.cu` to fatbins here; today there is nothing to build.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
