//! Shared helpers for the backend-comparison tests: a deterministic RNG and tolerance checks.
#![allow(dead_code)]

pub mod delta;

use std::sync::Arc;

use rill::backend::{self, Backend, Tensor};

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
    static SHARED: std::sync::OnceLock<Arc<dyn Backend>> = std::sync::OnceLock::new();
    Arc::clone(
        SHARED.get_or_init(|| backend::create("wgpu").unwrap_or_else(|e| panic!("wgpu backend unavailable: {e}"))),
    )
}

/// The backend `name` (`cpu`, `wgpu`, ...), one instance shared by every test of the process
/// (several GPU devices at once in one process hung on the NVIDIA Vulkan driver). A backend that
/// cannot start fails the test; nothing is skipped.
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
