// Build script: records the git commit for `rill bench`, and with the `cuda` feature compiles every
// `kernels-cuda/*.cu` with nvcc into a fatbin (sm_90 machine code plus compute_80 PTX that the
// driver compiles for other GPUs) that the binary embeds (src/backend/cuda/kernels.rs).
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    // `--no-optional-locks`: a plain `git status` refreshes and rewrites .git/index, which is
    // watched above, so every later cargo run would run this script again, recompile every
    // kernel and rebuild the crate (on a fresh clone that cost CI one whole rebuild per pass).
    let dirty = Command::new("git")
        .args(["--no-optional-locks", "status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=RILL_GIT_COMMIT={commit}{suffix}");

    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build_cuda_kernels();
    }
}

/// How to get nvcc, printed when it cannot be found.
const NVCC_HELP: &str = "nvcc not found: set NVCC=/path/to/nvcc or CUDA_HOME, or install the pinned CUDA 13.0 \
compiler into .cuda/ with `python3 -m venv .cuda && .cuda/bin/pip install nvidia-cuda-nvcc==13.0.88 \
nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85` \
(scripts/test.sh does this)";

/// nvcc from `NVCC`, `CUDA_HOME`, `CUDA_PATH`, the pinned PyPI install in `.cuda/`, `PATH` or
/// `/usr/local/cuda`.
fn find_nvcc(manifest: &Path) -> Option<PathBuf> {
    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-env-changed=PATH");
    if let Some(p) = std::env::var_os("NVCC") {
        return Some(PathBuf::from(p));
    }
    let mut candidates = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            candidates.push(PathBuf::from(home).join("bin/nvcc"));
        }
    }
    if let Ok(libs) = std::fs::read_dir(manifest.join(".cuda/lib")) {
        for py in libs.flatten() {
            candidates.push(py.path().join("site-packages/nvidia/cu13/bin/nvcc"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates.into_iter().find(|p| p.is_file())
}

fn build_cuda_kernels() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let dir = manifest.join("kernels-cuda");
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rerun-if-env-changed=RILL_CUDA_ARCHS");
    let Some(nvcc) = find_nvcc(&manifest) else {
        eprintln!("error: {NVCC_HELP}");
        std::process::exit(1);
    };
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", dir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }
    // Machine code for Hopper (and any extra architectures listed in RILL_CUDA_ARCHS, e.g.
    // "80,89,120"), plus compute_80 PTX that newer drivers JIT for every other GPU since Ampere.
    let mut gencode = vec!["-gencode".to_string(), "arch=compute_90,code=sm_90".to_string()];
    if let Ok(extra) = std::env::var("RILL_CUDA_ARCHS") {
        for a in extra.split(',').map(str::trim).filter(|a| !a.is_empty() && *a != "90") {
            gencode.push("-gencode".into());
            gencode.push(format!("arch=compute_{a},code=sm_{a}"));
        }
    }
    gencode.push("-gencode".into());
    gencode.push("arch=compute_80,code=compute_80".into());

    // The fatbins depend only on the kernel sources, the flags and the compiler: when none of
    // them changed since the last run (this script also runs on every commit, for the commit
    // id), keep the fatbins instead of recompiling (minutes on two cores).
    let key = kernels_key(&dir, &gencode, &nvcc);
    let key_file = out.join("kernels.key");
    let fresh = std::fs::read_to_string(&key_file).is_ok_and(|k| k == key)
        && sources.iter().all(|s| fatbin_path(&out, s).is_file());
    if !fresh {
        let _ = std::fs::remove_file(&key_file);
        compile_kernels(&nvcc, &dir, &out, &gencode, &sources);
        std::fs::write(&key_file, &key).unwrap_or_else(|e| fail(&format!("write {}: {e}", key_file.display())));
    }

    // The table of embedded modules, one per source file.
    let mut table = String::from("// Generated by build.rs: one fatbin per kernels-cuda/*.cu.\n");
    table.push_str("pub(crate) static FATBINS: &[(&str, &[u8])] = &[\n");
    for s in &sources {
        let stem = s.file_stem().and_then(|s| s.to_str()).unwrap_or("kernel");
        let path = fatbin_path(&out, s);
        table.push_str(&format!(
            "    ({stem:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    table.push_str("];\n");
    std::fs::write(out.join("cuda_fatbins.rs"), table).unwrap_or_else(|e| fail(&format!("write table: {e}")));
}

/// Compile every kernel source into `out/<stem>.fatbin`, the files in parallel (each nvcc is
/// single-threaded).
fn compile_kernels(nvcc: &Path, dir: &Path, out: &Path, gencode: &[String], sources: &[PathBuf]) {
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let mut pending: Vec<&PathBuf> = sources.iter().collect();
    let mut running: Vec<(String, std::process::Child)> = Vec::new();
    let mut failed = Vec::new();
    while !pending.is_empty() || !running.is_empty() {
        while running.len() < jobs {
            let Some(src) = pending.pop() else { break };
            let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("kernel").to_string();
            let child = Command::new(nvcc)
                .args(["-fatbin", "-O3", "-std=c++17"])
                .args(gencode)
                .arg("-I")
                .arg(dir)
                .arg(src)
                .arg("-o")
                .arg(fatbin_path(out, src))
                .spawn()
                .unwrap_or_else(|e| fail(&format!("cannot run {}: {e}", nvcc.display())));
            running.push((stem, child));
        }
        let (stem, mut child) = running.remove(0);
        match child.wait() {
            Ok(s) if s.success() => {}
            _ => failed.push(stem),
        }
    }
    if !failed.is_empty() {
        fail(&format!("nvcc failed on kernels-cuda/{{{}}}.cu", failed.join(",")));
    }
}

fn fatbin_path(out: &Path, src: &Path) -> PathBuf {
    let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("kernel");
    out.join(format!("{stem}.fatbin"))
}

/// A key of everything the fatbins depend on: every file in `dir` (the `.cu` sources and the
/// headers they include, by name and content), the nvcc flags, and nvcc's path, size and
/// modification time (a different compiler).
fn kernels_key(dir: &Path, gencode: &[String], nvcc: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", dir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        f.file_name().hash(&mut h);
        std::fs::read(f)
            .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", f.display())))
            .hash(&mut h);
    }
    gencode.hash(&mut h);
    nvcc.hash(&mut h);
    if let Ok(m) = std::fs::metadata(nvcc) {
        m.len().hash(&mut h);
        m.modified().ok().hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}
