//! Helpers shared by the integration tests: one deterministic random generator, the backends a
//! test runs on (one instance per name per process), the tolerance check, fixture paths.
#![allow(dead_code)]

pub mod delta;
pub mod device;
pub mod gguf;
pub mod weights;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use rill::backend::{self, Backend, BackendOptions, Precision, Tensor};

/// xorshift64* with Box-Muller normals: deterministic, no dependencies. Every test draws its
/// random data from this one generator (f64 draws; `normals` rounds to f32).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in (0, 1), never 0 (so `ln` is finite).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// `n` normals of standard deviation `scale`, as f32.
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() as f32 * scale).collect()
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

// ---- backends -----------------------------------------------------------------------------------

/// What the tests do when a compiled device backend cannot start on this machine
/// (`RILL_TEST_REQUIRE_CUDA=1`, set by the GPU job, makes a missing CUDA device a failure).
#[derive(Clone, Copy, PartialEq, Eq)]
enum IfMissing {
    /// Fail every test that uses it.
    Fail,
    /// Test the other backends, saying once that this one was skipped.
    Skip,
}

/// Every device backend rill can be built with. A test suite over `device_backends()` runs on
/// those compiled into this build: adding a backend to rill is adding its line here.
const DEVICES: &[(&str, IfMissing)] = &[
    // lavapipe (Mesa's Vulkan on the CPU) runs it on any machine, so it is always tested:
    // without an adapter the tests fail (`scripts/test.sh` installs lavapipe).
    ("wgpu", IfMissing::Fail),
    // Needs an NVIDIA GPU and driver; a `cuda` build elsewhere tests the other backends.
    ("cuda", IfMissing::Skip),
];

/// A started backend, or why it could not start.
type Started = Result<Arc<dyn Backend>, String>;

/// One instance per backend name (and precision) for the whole test process (tests run on
/// parallel threads; several GPU devices at once in one process hung on the NVIDIA Vulkan
/// driver), or the reason it could not start.
fn start(name: &str) -> Started {
    start_at(name, Precision::Exact)
}

fn start_at(name: &str, precision: Precision) -> Started {
    static STARTED: OnceLock<Mutex<HashMap<String, Started>>> = OnceLock::new();
    let mut map = STARTED
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    map.entry(format!("{name}/{precision:?}"))
        .or_insert_with(|| {
            let r = backend::create_with(name, &BackendOptions { precision }).map_err(|e| e.to_string());
            if let (Err(e), Some((_, IfMissing::Skip))) = (&r, DEVICES.iter().find(|d| d.0 == name)) {
                if name == "cuda" && std::env::var_os("RILL_TEST_REQUIRE_CUDA").is_some() {
                    panic!("cuda backend required (RILL_TEST_REQUIRE_CUDA): {e}");
                }
                // Straight to the process's stderr: the test harness captures `eprintln!`.
                let _ = writeln!(std::io::stderr(), "{name} tests skipped: {e}");
            }
            r
        })
        .clone()
}

/// The backend `name` (`cpu`, `wgpu`, ...), one instance per process. A backend that cannot
/// start fails the test.
pub fn shared(name: &str) -> Arc<dyn Backend> {
    start(name).unwrap_or_else(|e| panic!("backend {name}: {e}"))
}

/// The CPU backend: the reference every device backend is compared with.
pub fn cpu() -> Arc<dyn Backend> {
    shared("cpu")
}

/// Every device backend compiled into this build that can run here (see `DEVICES`).
pub fn device_backends() -> Vec<Arc<dyn Backend>> {
    device_backends_at(Precision::Exact)
}

/// `device_backends` started at `precision` (a backend without that tier runs `Exact`). A test
/// binary uses one precision for its devices: each is another instance of the device.
pub fn device_backends_at(precision: Precision) -> Vec<Arc<dyn Backend>> {
    let compiled = backend::available();
    for name in &compiled {
        assert!(
            *name == "cpu" || DEVICES.iter().any(|d| d.0 == *name),
            "backend {name} is compiled in but not listed in tests/common DEVICES, so nothing tests it"
        );
    }
    // `RILL_TEST_BACKENDS=cuda` (a comma list): test only those (the GPU jobs run one backend
    // per job); unset: every compiled one.
    let only = std::env::var("RILL_TEST_BACKENDS").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|l| l.split(',').any(|n| n.trim() == name));
    let devices: Vec<_> = DEVICES
        .iter()
        .filter(|(name, _)| compiled.contains(name) && wanted(name))
        .filter_map(|&(name, if_missing)| match start_at(name, precision) {
            Ok(be) => Some(be),
            Err(_) if if_missing == IfMissing::Skip => None,
            Err(e) => panic!("backend {name}: {e}"),
        })
        .collect();
    if devices.is_empty() && !compiled.iter().any(|n| *n != "cpu") {
        static SAID: OnceLock<()> = OnceLock::new();
        SAID.get_or_init(|| {
            let _ = writeln!(
                std::io::stderr(),
                "no device backend compiled in: device tests have nothing to run"
            );
        });
    }
    devices
}

/// The CUDA backend when this build has it and the machine an NVIDIA GPU.
pub fn cuda() -> Option<Arc<dyn Backend>> {
    if !backend::available().contains(&"cuda") {
        return None;
    }
    start("cuda").ok()
}

/// Prefill a prompt, then decode `steps` tokens (each fed token chosen from the session's
/// index so sessions differ), returning every logit row bit for bit.
pub fn run_session(m: &rill::exec::Model, which: usize, steps: usize) -> Vec<Vec<u32>> {
    let prompt: Vec<u32> = (0..3 + which % 4)
        .map(|i| (17 * which + 31 * i) as u32 % 1000 + 1)
        .collect();
    let mut s = m.new_session(prompt.len() + steps + 1).expect("session");
    let mut rows = Vec::new();
    let first = m
        .prefill(&mut s, &prompt, rill::exec::Logits::Last, &mut |_, _| {})
        .expect("prefill");
    rows.push(first.iter().map(|x| x.to_bits()).collect());
    for k in 0..steps {
        let tok = ((which * 7 + k * 13) % 900 + 5) as u32;
        let l = m.decode(&mut s, tok).expect("decode");
        rows.push(l.iter().map(|x| x.to_bits()).collect());
    }
    rows
}

/// The CPU backend and every device backend: what the end-to-end tests run on.
pub fn backends() -> Vec<Arc<dyn Backend>> {
    let mut all = vec![cpu()];
    all.extend(device_backends());
    all
}

/// Upload f32 data to a backend.
pub fn up(be: &dyn Backend, data: &[f32], shape: &[usize]) -> Tensor {
    be.upload_f32(data, shape).expect("upload")
}

// ---- checks -------------------------------------------------------------------------------------

/// Assert `|got - want| <= atol + rtol * |want|` elementwise, reporting the worst element.
/// Non-finite values never pass on a tolerance: an infinity must be matched by the same
/// infinity, and a NaN on either side fails (a kernel returning NaN must not pass a test whose
/// reference happens to be NaN too).
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    let want: Vec<f64> = want.iter().map(|&w| w as f64).collect();
    assert_close_f64(what, got, &want, atol as f64, rtol as f64);
}

/// `assert_close` against a reference computed in f64.
#[track_caller]
pub fn assert_close_f64(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        assert!(!g.is_nan() && !w.is_nan(), "{what}[{i}]: NaN ({g} vs {w})");
        if g.is_infinite() || w.is_infinite() {
            assert!(g == w, "{what}[{i}]: {g} vs {w}");
            continue;
        }
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let i = worst.0;
    assert!(
        worst.1 <= 0.0,
        "{what}[{i}]: got {} want {} (atol {atol}, rtol {rtol})",
        got[i],
        want[i]
    );
}

/// SiLU in f64, for references.
pub fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

// ---- files --------------------------------------------------------------------------------------

/// A file of `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A path in the temp directory unique to this process and `tag` (tests run in parallel, and a
/// file mapped by one must not be rewritten by another).
pub fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rill-test-{}-{tag}", std::process::id()))
}
