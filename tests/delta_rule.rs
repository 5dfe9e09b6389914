//! The gated delta rule of the CPU backend (recurrent and chunked) against an independent f64
//! implementation of spec/DELTANET.md A.1 in HF orientation (`S` `[dk][dv]`, row = key index).

use rill::backend::cpu::CpuBackend;
use rill::backend::{Backend, DType, GdnDims, Tensor};

/// xorshift64* + Box-Muller: tiny, deterministic, no crates.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Inputs of one delta-rule call, as the backend sees them (f32).
struct Case {
    dims: GdnDims,
    t: usize,
    u: Vec<f32>,    // [T, conv_dim], q normalised and scaled, k normalised
    g: Vec<f32>,    // [T, hv]
    beta: Vec<f32>, // [T, hv]
    m0: Vec<f32>,   // [hv, dv, dk] value-major
}

fn make_case(dims: GdnDims, t: usize, c: f64, zero_state: bool, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
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
fn reference(case: &Case, key_head: impl Fn(usize) -> usize) -> (Vec<f64>, Vec<f64>) {
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

#[derive(Clone, Copy, PartialEq)]
enum Algo {
    Recurrent,
    Chunked,
}

/// Run one backend call on tokens `t0..t1` of `case`, continuing from `state` (value-major).
fn run_range(be: &CpuBackend, case: &Case, t0: usize, t1: usize, state: &Tensor, algo: Algo) -> Vec<f32> {
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

fn run(be: &CpuBackend, case: &Case, algo: Algo) -> (Vec<f32>, Vec<f32>) {
    let GdnDims { hv, dk, dv, .. } = case.dims;
    let state = be.upload_f32(&case.m0, &[hv, dv, dk]).unwrap();
    let o = run_range(be, case, 0, case.t, &state, algo);
    (o, be.read_f32(&state).unwrap())
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f64]) -> f64 {
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

fn rel_err32(a: &[f32], b: &[f32]) -> f64 {
    let b64: Vec<f64> = b.iter().map(|&x| x as f64).collect();
    rel_err(a, &b64)
}

const TS: [usize; 8] = [1, 2, 63, 64, 65, 128, 130, 200];
const DIMS: [GdnDims; 2] = [
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
/// f32 vs f64 truth, max |err| / max |truth|. Measured here: <= 3e-7 for both algorithms (the
/// chunked one keeps the per-chunk cumulative gate sums in f64; with an f32 cumsum it reached
/// 1.4e-5 at c = 20). Real bugs (transposed state, wrong key head, factored decay) give errors of
/// order 1, so this bound has headroom without hiding anything.
const TOL: f64 = 2e-6;

#[test]
fn recurrent_and_chunked_match_f64_recurrence() {
    let be = CpuBackend::new();
    let mut worst = [0f64; 4];
    for (di, &dims) in DIMS.iter().enumerate() {
        for &t in &TS {
            for &c in &[1.0, 20.0] {
                let case = make_case(dims, t, c, false, 1000 + t as u64 * 7 + di as u64 + c as u64);
                let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
                let (o_rec, s_rec) = run(&be, &case, Algo::Recurrent);
                let (o_chk, s_chk) = run(&be, &case, Algo::Chunked);
                let errs = [
                    rel_err(&o_rec, &o_ref),
                    rel_err(&s_rec, &s_ref),
                    rel_err(&o_chk, &o_ref),
                    rel_err(&s_chk, &s_ref),
                ];
                for (w, e) in worst.iter_mut().zip(errs) {
                    *w = w.max(e);
                }
                let what = format!(
                    "dims {dims:?} T {t} c {c}: rec o/S {:.2e}/{:.2e}, chunked o/S {:.2e}/{:.2e}",
                    errs[0], errs[1], errs[2], errs[3]
                );
                assert!(errs.iter().all(|&e| e <= TOL), "{what}");
                // Chunked vs recurrent directly (both f32).
                let e = rel_err32(&o_chk, &o_rec).max(rel_err32(&s_chk, &s_rec));
                assert!(e <= TOL, "chunked vs recurrent {e:.2e}: {what}");
            }
        }
    }
    eprintln!(
        "worst rel err: recurrent o {:.2e} S {:.2e}; chunked o {:.2e} S {:.2e}",
        worst[0], worst[1], worst[2], worst[3]
    );
}

#[test]
fn value_head_uses_key_head_j_mod_hk() {
    // With hk = 2, hv = 4 the tiled rule (j % hk: 0,1,0,1) and the grouped rule (j / r: 0,0,1,1)
    // differ for heads 1 and 2; the backend must follow the tiled one.
    let be = CpuBackend::new();
    let dims = DIMS[1];
    let case = make_case(dims, 70, 1.0, false, 77);
    let r = dims.hv / dims.hk;
    let (o_tiled, _) = reference(&case, |j| j % dims.hk);
    let (o_grouped, _) = reference(&case, |j| j / r);
    for algo in [Algo::Recurrent, Algo::Chunked] {
        let (o, _) = run(&be, &case, algo);
        assert!(rel_err(&o, &o_tiled) <= TOL);
        assert!(
            rel_err(&o, &o_grouped) > 0.1,
            "j / r mapping should give a clearly different answer"
        );
    }
}

#[test]
fn layout_invariant_one_token_from_zero_state() {
    // After one token from the zero state, M[c][i] = beta * v[c] * k[i]: row c is proportional
    // to k (value-major). A transposed layout would make column c proportional to k instead.
    let be = CpuBackend::new();
    let dims = GdnDims {
        hk: 2,
        hv: 4,
        dk: 32,
        dv: 16, // dk != dv so the row/column roles cannot be confused by shape either
    };
    let case = make_case(dims, 1, 1.0, true, 5);
    let kd = dims.key_dim();
    for algo in [Algo::Recurrent, Algo::Chunked] {
        let (_, m) = run(&be, &case, algo);
        for j in 0..dims.hv {
            let kh = j % dims.hk;
            let k = &case.u[kd + kh * dims.dk..kd + (kh + 1) * dims.dk];
            let v = &case.u[2 * kd + j * dims.dv..2 * kd + (j + 1) * dims.dv];
            let b = case.beta[j];
            for c in 0..dims.dv {
                for i in 0..dims.dk {
                    let want = b * v[c] * k[i];
                    let got = m[(j * dims.dv + c) * dims.dk + i];
                    assert!(
                        (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                        "head {j} M[{c}][{i}] = {got}, want {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn chunked_prefill_then_recurrent_decode_equals_recurrence() {
    let be = CpuBackend::new();
    for &dims in &DIMS {
        for &(t, t1) in &[(200usize, 101usize), (130, 64), (70, 1), (66, 65)] {
            let case = make_case(dims, t, 1.0, false, 31 + t as u64);
            let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
            let state = be.upload_f32(&case.m0, &[dims.hv, dims.dv, dims.dk]).unwrap();
            let mut o = run_range(&be, &case, 0, t1, &state, Algo::Chunked);
            for tt in t1..t {
                o.extend(run_range(&be, &case, tt, tt + 1, &state, Algo::Recurrent));
            }
            let s = be.read_f32(&state).unwrap();
            let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
            assert!(
                eo <= TOL && es <= TOL,
                "dims {dims:?} T {t} prefill {t1}: o {eo:.2e} S {es:.2e}"
            );
            // And against the pure f32 recurrence over all tokens.
            let (o_rec, s_rec) = run(&be, &case, Algo::Recurrent);
            assert!(rel_err32(&o, &o_rec) <= TOL && rel_err32(&s, &s_rec) <= TOL);
        }
    }
}

#[test]
fn chunked_is_stable_for_very_negative_gates() {
    // g down to about -100 per token: any factored decay e^{-γ} would overflow to inf/NaN.
    let be = CpuBackend::new();
    let dims = DIMS[1];
    let case = make_case(dims, 130, 50.0, false, 9);
    let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
    let (o, s) = run(&be, &case, Algo::Chunked);
    assert!(rel_err(&o, &o_ref) <= TOL && rel_err(&s, &s_ref) <= TOL);
}

#[test]
fn delta_rule_rejects_bad_shapes_and_aliasing() {
    let be = CpuBackend::new();
    let dims = DIMS[1];
    let cd = dims.conv_dim();
    let u = be.alloc(DType::F32, &[3, cd]).unwrap();
    let g = be.alloc(DType::F32, &[3, dims.hv]).unwrap();
    let b = be.alloc(DType::F32, &[3, dims.hv]).unwrap();
    let s = be.alloc(DType::F32, &[dims.hv, dims.dv, dims.dk]).unwrap();
    let o = be.alloc(DType::F32, &[3, dims.value_dim()]).unwrap();
    assert!(be.delta_rule_chunked(&u, &g, &b, &s, &o, dims).is_ok());
    let bad_u = be.alloc(DType::F32, &[3, cd + 1]).unwrap();
    assert!(be.delta_rule_chunked(&bad_u, &g, &b, &s, &o, dims).is_err());
    let bad_g = be.alloc(DType::F32, &[2, dims.hv]).unwrap();
    assert!(be.delta_rule_recurrent(&u, &bad_g, &b, &s, &o, dims).is_err());
    let bad_s = be.alloc(DType::F32, &[dims.hv, dims.dv]).unwrap();
    assert!(be.delta_rule_recurrent(&u, &g, &b, &bad_s, &o, dims).is_err());
    // Output aliasing an input.
    assert!(be.delta_rule_recurrent(&u, &g, &g, &s, &g, dims).is_err());
    let odd = GdnDims { hk: 3, ..dims };
    assert!(be.delta_rule_recurrent(&u, &g, &b, &s, &o, odd).is_err());
}
