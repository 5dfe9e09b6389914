//! Shared by the delta-rule tests of every backend: random cases (q, k L2-normalised, q scaled,
//! random non-symmetric start state), the f64 reference of spec/DELTANET.md A.1 in HF orientation,
//! and helpers that run one backend's op on a case.

use rill::backend::{Backend, DType, GdnDims, Tensor};

/// xorshift64* + Box-Muller: tiny, deterministic, no crates.
pub struct Rng64(u64);
impl Rng64 {
    pub fn new(seed: u64) -> Self {
        Rng64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Inputs of one delta-rule call, as the backend sees them (f32).
pub struct Case {
    pub dims: GdnDims,
    pub t: usize,
    pub u: Vec<f32>,    // [T, conv_dim], q normalised and scaled, k normalised
    pub g: Vec<f32>,    // [T, hv]
    pub beta: Vec<f32>, // [T, hv]
    pub m0: Vec<f32>,   // [hv, dv, dk] value-major
}

pub fn make_case(dims: GdnDims, t: usize, c: f64, zero_state: bool, seed: u64) -> Case {
    let mut rng = Rng64::new(seed);
    let GdnDims { hk, hv, dk, dv } = dims;
    let cd = dims.conv_dim();
    let kd = dims.key_dim();
    let mut u = vec![0f32; t * cd];
    for row in u.chunks_exact_mut(cd) {
        for (h, head) in row[..2 * kd].chunks_exact_mut(dk).enumerate() {
            let x: Vec<f64> = (0..dk).map(|_| rng.normal()).collect();
            let n = x.iter().map(|v| v * v).sum::<f64>().sqrt();
            let s = if h < hk { 1.0 / (dk as f64).sqrt() } else { 1.0 };
            for (o, v) in head.iter_mut().zip(&x) {
                *o = (v / n * s) as f32;
            }
        }
        for v in row[2 * kd..].iter_mut() {
            *v = rng.normal() as f32;
        }
    }
    let g = (0..t * hv).map(|_| (-rng.normal().abs() * c) as f32).collect();
    let beta = (0..t * hv)
        .map(|_| (1.0 / (1.0 + (-rng.normal()).exp())) as f32)
        .collect();
    let m0 = (0..hv * dv * dk)
        .map(|_| if zero_state { 0.0 } else { rng.normal() as f32 })
        .collect();
    Case {
        dims,
        t,
        u,
        g,
        beta,
        m0,
    }
}

/// Spec A.1 in f64, HF orientation. `key_head(j)` picks the key head of value head j.
/// Returns (o `[T, hv*dv]`, final state value-major `[hv, dv, dk]`).
pub fn reference(case: &Case, key_head: impl Fn(usize) -> usize) -> (Vec<f64>, Vec<f64>) {
    let GdnDims { hv, dk, dv, .. } = case.dims;
    let cd = case.dims.conv_dim();
    let kd = case.dims.key_dim();
    let mut o = vec![0f64; case.t * hv * dv];
    let mut m_out = vec![0f64; hv * dv * dk];
    for j in 0..hv {
        let kh = key_head(j);
        // S[i][c] = M0[j][c][i]
        let mut s = vec![vec![0f64; dv]; dk];
        for (i, srow) in s.iter_mut().enumerate() {
            for (c, x) in srow.iter_mut().enumerate() {
                *x = case.m0[(j * dv + c) * dk + i] as f64;
            }
        }
        for t in 0..case.t {
            let row = &case.u[t * cd..(t + 1) * cd];
            let q: Vec<f64> = row[kh * dk..(kh + 1) * dk].iter().map(|&x| x as f64).collect();
            let k: Vec<f64> = row[kd + kh * dk..kd + (kh + 1) * dk]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let v: Vec<f64> = row[2 * kd + j * dv..2 * kd + (j + 1) * dv]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let g = case.g[t * hv + j] as f64;
            let b = case.beta[t * hv + j] as f64;
            // S <- e^g S
            for srow in s.iter_mut() {
                for x in srow.iter_mut() {
                    *x *= g.exp();
                }
            }
            // m = S^T k ; delta = b (v - m) ; S += k delta^T ; o = S^T q
            let mut m = vec![0f64; dv];
            for i in 0..dk {
                for c in 0..dv {
                    m[c] += s[i][c] * k[i];
                }
            }
            let delta: Vec<f64> = (0..dv).map(|c| b * (v[c] - m[c])).collect();
            for i in 0..dk {
                for c in 0..dv {
                    s[i][c] += k[i] * delta[c];
                }
            }
            for c in 0..dv {
                let mut acc = 0f64;
                for i in 0..dk {
                    acc += s[i][c] * q[i];
                }
                o[t * hv * dv + j * dv + c] = acc;
            }
        }
        for (i, srow) in s.iter().enumerate() {
            for (c, &x) in srow.iter().enumerate() {
                m_out[(j * dv + c) * dk + i] = x;
            }
        }
    }
    (o, m_out)
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Algo {
    Recurrent,
    Chunked,
}

/// Run one backend call on tokens `t0..t1` of `case`, continuing from `state` (value-major).
pub fn run_range(be: &dyn Backend, case: &Case, t0: usize, t1: usize, state: &Tensor, algo: Algo) -> Vec<f32> {
    let GdnDims { hv, dv, .. } = case.dims;
    let cd = case.dims.conv_dim();
    let n = t1 - t0;
    let u = be.upload_f32(&case.u[t0 * cd..t1 * cd], &[n, cd]).unwrap();
    let g = be.upload_f32(&case.g[t0 * hv..t1 * hv], &[n, hv]).unwrap();
    let b = be.upload_f32(&case.beta[t0 * hv..t1 * hv], &[n, hv]).unwrap();
    let out = be.alloc(DType::F32, &[n, hv * dv]).unwrap();
    match algo {
        Algo::Recurrent => be.delta_rule_recurrent(&u, &g, &b, state, &out, case.dims).unwrap(),
        Algo::Chunked => be.delta_rule_chunked(&u, &g, &b, state, &out, case.dims).unwrap(),
    }
    be.read_f32(&out).unwrap()
}

pub fn run(be: &dyn Backend, case: &Case, algo: Algo) -> (Vec<f32>, Vec<f32>) {
    let GdnDims { hv, dk, dv, .. } = case.dims;
    let state = be.upload_f32(&case.m0, &[hv, dv, dk]).unwrap();
    let o = run_range(be, case, 0, case.t, &state, algo);
    (o, be.read_f32(&state).unwrap())
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max);
    let den = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    assert!(a.iter().all(|x| x.is_finite()), "non-finite output");
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

pub fn rel_err32(a: &[f32], b: &[f32]) -> f64 {
    let b64: Vec<f64> = b.iter().map(|&x| x as f64).collect();
    rel_err(a, &b64)
}

pub const TS: [usize; 8] = [1, 2, 63, 64, 65, 128, 130, 200];
pub const DIMS: [GdnDims; 2] = [
    GdnDims {
        hk: 2,
        hv: 4,
        dk: 128,
        dv: 128,
    },
    GdnDims {
        hk: 2,
        hv: 4,
        dk: 32,
        dv: 32,
    },
];
