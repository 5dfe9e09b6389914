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

/// Every device backend rill can be built with, and the precision tiers it has (`Precision::Fast`
/// only where the backend has a faster tier: a second instance of a backend without one would
/// test the same kernels twice). A test suite over `device_backends_every_tier()` runs on those
/// compiled into this build: adding a backend to rill is adding its line here.
const DEVICES: &[(&str, IfMissing, &[Precision])] = &[
    // lavapipe (Mesa's Vulkan on the CPU) runs it on any machine, so it is always tested:
    // without an adapter the tests fail (`scripts/test.sh` installs lavapipe).
    // Its fast tier runs in tests/device_fast.rs, a binary of its own: two wgpu instances in one
    // process hung on the NVIDIA Vulkan driver.
    ("wgpu", IfMissing::Fail, &[Precision::Exact]),
    // Needs an NVIDIA GPU and driver; a `cuda` build elsewhere tests the other backends. Fast:
    // tensor-core prefill (src/backend/cuda/mod.rs).
    ("cuda", IfMissing::Skip, &[Precision::Exact, Precision::Fast]),
];

/// A started backend, or why it could not start.
type Started = Result<Arc<dyn Backend>, String>;

/// One instance per backend name and precision for the whole test process (tests run on parallel
/// threads; several GPU devices at once in one process hung on the NVIDIA Vulkan driver), or the
/// reason it could not start.
fn start(name: &str, precision: Precision) -> Started {
    static STARTED: OnceLock<Mutex<HashMap<(String, &'static str), Started>>> = OnceLock::new();
    let mut map = STARTED
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    map.entry((name.to_string(), precision.name()))
        .or_insert_with(|| {
            let r = backend::create_with(name, &options(precision)).map_err(|e| e.to_string());
            if let (Err(e), Some((_, IfMissing::Skip, _))) = (&r, DEVICES.iter().find(|d| d.0 == name)) {
                if name == "cuda" && std::env::var_os("RILL_TEST_REQUIRE_CUDA").is_some() {
                    panic!("cuda backend required (RILL_TEST_REQUIRE_CUDA): {e}");
                }
                // Straight to the process's stderr: the test harness captures `eprintln!`.
                let _ = writeln!(std::io::stderr(), "{name} ({}) tests skipped: {e}", precision.name());
            }
            r
        })
        .clone()
}

/// The options every backend of this process starts with: `precision`, and the wgpu backend's
/// `wgpu_options`.
fn options(precision: Precision) -> BackendOptions {
    #[allow(unused_mut)] // Only the wgpu backend has options of its own.
    let mut o = BackendOptions {
        precision,
        ..BackendOptions::default()
    };
    #[cfg(feature = "wgpu")]
    {
        o.wgpu = wgpu_options();
    }
    o
}

/// The storage binding limit a test binary lowers for itself (`lower_wgpu_binding`).
#[cfg(feature = "wgpu")]
static WGPU_BINDING: OnceLock<u64> = OnceLock::new();

/// The wgpu variant under test: `RILL_TEST_WGPU`, a comma list of options (`WgpuOptions`'
/// `FromStr`: `plain`, `checks`, `nofusion`, `dot`, `coop_emulate`, `max_storage=8`,
/// `mv_rows=1`, ...; scripts/test.sh runs the suites under several), and a binding limit the
/// binary lowered (`lower_wgpu_binding`). Unset: the adapter's own choice. A list that does not
/// parse fails every test rather than testing the default variant by mistake.
#[cfg(feature = "wgpu")]
pub fn wgpu_options() -> rill::backend::wgpu::WgpuOptions {
    let mut o: rill::backend::wgpu::WgpuOptions = std::env::var("RILL_TEST_WGPU")
        .map(|v| v.parse().unwrap_or_else(|e| panic!("RILL_TEST_WGPU={v}: {e}")))
        .unwrap_or_default();
    if let Some(&b) = WGPU_BINDING.get() {
        o.max_binding = Some(b);
    }
    o
}

/// Lower the wgpu backend's storage binding limit to `bytes` for this process (tests of the
/// piecewise binding): call before any backend starts.
#[cfg(feature = "wgpu")]
pub fn lower_wgpu_binding(bytes: u64) {
    WGPU_BINDING.get_or_init(|| bytes);
}

/// The backend `name` (`cpu`, `wgpu`, ...) at the exact tier, one instance per process. A backend
/// that cannot start fails the test.
pub fn shared(name: &str) -> Arc<dyn Backend> {
    start(name, Precision::Exact).unwrap_or_else(|e| panic!("backend {name}: {e}"))
}

/// The CPU backend: the reference every device backend is compared with.
pub fn cpu() -> Arc<dyn Backend> {
    shared("cpu")
}

/// Every device backend compiled into this build that can run here (see `DEVICES`), at the exact
/// tier (the default).
pub fn device_backends() -> Vec<Arc<dyn Backend>> {
    devices_at(&[Precision::Exact], false)
}

/// Every device backend compiled into this build that can run here, at every precision tier it
/// has in `DEVICES` (`Backend::precision` says which; the tests judge each at its tier).
pub fn device_backends_every_tier() -> Vec<Arc<dyn Backend>> {
    devices_at(&[Precision::Exact, Precision::Fast], false)
}

/// `device_backends` started at `precision` (a backend without that tier runs `Exact`), every
/// device whatever its tiers in `DEVICES`: a test binary of one precision (tests/device_fast.rs),
/// where each device is one more instance.
pub fn device_backends_at(precision: Precision) -> Vec<Arc<dyn Backend>> {
    devices_at(&[precision], true)
}

/// The devices at `tiers`: those of each device's `DEVICES` tiers, or with `any_tier` every one
/// of `tiers`.
fn devices_at(tiers: &[Precision], any_tier: bool) -> Vec<Arc<dyn Backend>> {
    let compiled = backend::available();
    for name in &compiled {
        assert!(
            *name == "cpu" || DEVICES.iter().any(|d| d.0 == *name),
            "backend {name} is compiled in but not listed in tests/common DEVICES, so nothing tests it"
        );
    }
    // `RILL_TEST_BACKENDS=cuda` (a comma list): test only those (the GPU jobs run one backend
    // per job); unset: every compiled one.
    let mut devices = Vec::new();
    for &(name, if_missing, has) in DEVICES.iter().filter(|d| compiled.contains(&d.0) && tested(d.0)) {
        for &precision in tiers.iter().filter(|p| any_tier || has.contains(p)) {
            match start(name, precision) {
                Ok(be) => devices.push(be),
                Err(_) if if_missing == IfMissing::Skip => break,
                Err(e) => panic!("backend {name}: {e}"),
            }
        }
    }
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

/// `cuda` or `cuda/fast`: a backend's name with its tier when that is not the exact one.
pub fn tagged(be: &dyn Backend) -> String {
    match be.precision() {
        Precision::Exact => be.name().to_string(),
        p => format!("{}/{}", be.name(), p.name()),
    }
}

/// Whether `be` runs the fast tier: the fixtures' "f16-rounded activations" (rel L2 <= ~6e-3,
/// argmax equal) on the ops its fast paths change.
pub fn is_fast(be: &dyn Backend) -> bool {
    be.precision() == Precision::Fast
}

/// The fixtures' bound for f16-rounded activations: relative L2 error of a result.
pub const FAST_REL_L2: f64 = 6e-3;

/// The CUDA backend when this build has it and the machine an NVIDIA GPU.
pub fn cuda() -> Option<Arc<dyn Backend>> {
    if !backend::available().contains(&"cuda") {
        return None;
    }
    start("cuda", Precision::Exact).ok()
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

/// The CPU backend and every device backend (exact tier).
pub fn backends() -> Vec<Arc<dyn Backend>> {
    let mut all = cpu_if_tested();
    all.extend(device_backends());
    all
}

/// The CPU backend and every device backend at every tier: what the end-to-end tests run on.
pub fn backends_every_tier() -> Vec<Arc<dyn Backend>> {
    let mut all = cpu_if_tested();
    all.extend(device_backends_every_tier());
    all
}

/// The CPU backend as one of the backends under test, unless `RILL_TEST_BACKENDS` names others
/// only: the passes of scripts/test.sh that rerun the suite on a wgpu variant (or the GPU jobs,
/// `RILL_TEST_BACKENDS=cuda`) leave out the CPU's own end-to-end runs, which the first pass did;
/// `RILL_TEST_BACKENDS=cpu` runs only those (the baseline x86-64 pass). The device op tests
/// compare against the CPU reference either way (`cpu()`).
fn cpu_if_tested() -> Vec<Arc<dyn Backend>> {
    if tested("cpu") {
        vec![cpu()]
    } else {
        Vec::new()
    }
}

/// Whether backend `name` is under test: `RILL_TEST_BACKENDS` (a comma list) names it, or is unset.
fn tested(name: &str) -> bool {
    std::env::var("RILL_TEST_BACKENDS").map_or(true, |l| l.split(',').any(|n| n.trim() == name))
}

/// Relative L2 error of `got` against `want` (0 for two zero vectors).
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "rel_l2: lengths");
    let num: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    if num == 0.0 {
        0.0
    } else {
        (num / den).sqrt()
    }
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
