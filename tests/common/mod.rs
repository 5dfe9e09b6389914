//! Shared helpers for the backend-comparison tests: a deterministic RNG and tolerance checks.
#![allow(dead_code)]

pub mod delta;

use std::sync::Arc;

use rill::backend::{self, Backend, Tensor};
use rill::exec::{Logits, Model};

/// xorshift64* with Box-Muller normals: deterministic, no dependencies.
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
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn normal(&mut self) -> f32 {
        let u1 = self.uniform().max(1e-7);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
    }
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

pub fn cpu() -> Arc<dyn Backend> {
    backend::create("cpu").expect("cpu backend")
}

/// The wgpu backend, one device shared by every test of the process (tests run on parallel
/// threads; several devices at once in one process hung on the NVIDIA Vulkan driver). Tests fail
/// (never skip) when no adapter exists: install lavapipe (`scripts/test.sh` does).
pub fn wgpu() -> Arc<dyn Backend> {
    shared("wgpu")
}

/// Whether this run tests backend `name`: `RILL_TEST_BACKENDS=cpu,cuda` restricts the list (the
/// GPU job runs the CUDA suite without a Vulkan loader); by default every compiled backend.
fn wanted(name: &str) -> bool {
    match std::env::var("RILL_TEST_BACKENDS") {
        Ok(list) => list.split(',').any(|b| b.trim() == name),
        Err(_) => true,
    }
}

/// The CUDA backend shared by the process, or `None` where this build has no `cuda` feature or
/// the machine no NVIDIA GPU (said once on stderr): CUDA tests run where a GPU is and are skipped
/// elsewhere, while a kernel that does not compile already failed the build.
pub fn cuda() -> Option<Arc<dyn Backend>> {
    use std::sync::OnceLock;
    static PRESENT: OnceLock<bool> = OnceLock::new();
    let present = *PRESENT.get_or_init(|| {
        if !backend::available().contains(&"cuda") {
            return false;
        }
        match backend::create("cuda") {
            Ok(b) => {
                drop(b);
                true
            }
            // The GPU job sets RILL_TEST_REQUIRE_CUDA: there a missing device is a failure.
            Err(e) if std::env::var_os("RILL_TEST_REQUIRE_CUDA").is_some() => panic!("cuda backend: {e}"),
            Err(e) => {
                eprintln!("CUDA tests skipped: {e}");
                false
            }
        }
    });
    (present && wanted("cuda")).then(|| shared("cuda"))
}

/// The compiled backends this run tests (`backend::available()`, cpu included), minus cuda where
/// no NVIDIA GPU is: the list of the end-to-end tests.
pub fn backends() -> Vec<&'static str> {
    backend::available()
        .into_iter()
        .filter(|&b| wanted(b) && (b != "cuda" || cuda().is_some()))
        .collect()
}

/// The device backends of `backends()` (all but cpu), each shared by the process: the op tests
/// compare each of them with the CPU reference.
pub fn devices() -> Vec<(&'static str, Arc<dyn Backend>)> {
    backends()
        .into_iter()
        .filter(|&b| b != "cpu")
        .map(|b| (b, shared(b)))
        .collect()
}

/// The backend `name` (`cpu`, `wgpu`, `cuda`), one instance shared by every test of the process
/// (several GPU devices at once in one process hung on the NVIDIA Vulkan driver). A backend that
/// cannot start fails the test; only `backends()` leaves out a missing CUDA GPU.
pub fn shared(name: &str) -> Arc<dyn Backend> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SHARED: OnceLock<Mutex<HashMap<String, Arc<dyn Backend>>>> = OnceLock::new();
    let mut map = SHARED
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .expect("backend map");
    Arc::clone(
        map.entry(name.to_string())
            .or_insert_with(|| backend::create(name).unwrap_or_else(|e| panic!("backend {name}: {e}"))),
    )
}

/// Upload the same f32 data to a backend.
pub fn up(be: &dyn Backend, data: &[f32], shape: &[usize]) -> Tensor {
    be.upload_f32(data, shape).expect("upload")
}

/// Assert `|got - want| <= atol + rtol * |want|` elementwise, reporting the worst element.
/// Non-finite values never pass on a tolerance: an infinity must be matched by the same
/// infinity, and a NaN on either side fails (a kernel returning NaN must not pass a test whose
/// reference happens to be NaN too).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
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

/// Prefill a prompt, then decode `steps` tokens (each fed token chosen from the session's
/// index so sessions differ), returning every logit row bit for bit.
pub fn run_session(m: &Model, which: usize, steps: usize) -> Vec<Vec<u32>> {
    let prompt: Vec<u32> = (0..3 + which % 4)
        .map(|i| (17 * which + 31 * i) as u32 % 1000 + 1)
        .collect();
    let mut s = m.new_session(prompt.len() + steps + 1).expect("session");
    let mut rows = Vec::new();
    let first = m
        .prefill(&mut s, &prompt, Logits::Last, &mut |_, _| {})
        .expect("prefill");
    rows.push(first.iter().map(|x| x.to_bits()).collect());
    for k in 0..steps {
        let tok = ((which * 7 + k * 13) % 900 + 5) as u32;
        let l = m.decode(&mut s, tok).expect("decode");
        rows.push(l.iter().map(|x| x.to_bits()).collect());
    }
    rows
}
