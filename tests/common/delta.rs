//! Shared by the delta-rule tests of every backend (tests/delta_rule.rs for the CPU,
//! tests/device_delta.rs for the device backends): random cases (q, k L2-normalised, q scaled,
//! random non-symmetric start state), the f64 reference of spec/DELTANET.md A.1 in HF orientation,
//! helpers that run one backend's op on a case, and the checks both suites make.

use rill::backend::{Backend, DType, GdnDims, Tensor};

use super::Rng;

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
pub fn try_run_range(
    be: &dyn Backend,
    case: &Case,
    t0: usize,
    t1: usize,
    state: &Tensor,
    algo: Algo,
) -> rill::Result<Vec<f32>> {
    let GdnDims { hv, dv, .. } = case.dims;
    let cd = case.dims.conv_dim();
    let n = t1 - t0;
    let u = be.upload_f32(&case.u[t0 * cd..t1 * cd], &[n, cd])?;
    let g = be.upload_f32(&case.g[t0 * hv..t1 * hv], &[n, hv])?;
    let b = be.upload_f32(&case.beta[t0 * hv..t1 * hv], &[n, hv])?;
    let out = be.alloc(DType::F32, &[n, hv * dv])?;
    match algo {
        Algo::Recurrent => be.delta_rule_recurrent(&u, &g, &b, state, &out, case.dims)?,
        Algo::Chunked => be.delta_rule_chunked(&u, &g, &b, state, &out, case.dims)?,
    }
    be.read_f32(&out)
}

pub fn run_range(be: &dyn Backend, case: &Case, t0: usize, t1: usize, state: &Tensor, algo: Algo) -> Vec<f32> {
    try_run_range(be, case, t0, t1, state, algo).unwrap_or_else(|e| panic!("{} {algo:?}: {e}", be.name()))
}

/// The whole case in one call: (out, final state).
pub fn try_run(be: &dyn Backend, case: &Case, algo: Algo) -> rill::Result<(Vec<f32>, Vec<f32>)> {
    let GdnDims { hv, dk, dv, .. } = case.dims;
    let state = be.upload_f32(&case.m0, &[hv, dv, dk])?;
    let o = try_run_range(be, case, 0, case.t, &state, algo)?;
    Ok((o, be.read_f32(&state)?))
}

pub fn run(be: &dyn Backend, case: &Case, algo: Algo) -> (Vec<f32>, Vec<f32>) {
    try_run(be, case, algo).unwrap_or_else(|e| panic!("{} {algo:?}: {e}", be.name()))
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

// ---- checks shared by the CPU and the device suites ---------------------------------------------

/// Both algorithms on `be` against the f64 recurrence and against each other, over `DIMS` x `TS`
/// x gate scales {1, 20}; with `cpu`, also against the CPU backend's ops. Returns the worst
/// errors: [rec o, rec S, chunk o, chunk S] vs f64, chunked vs recurrent, [rec, chunk] vs CPU.
pub fn check_against_f64(be: &dyn Backend, cpu: Option<&dyn Backend>, tol: f64) -> [f64; 7] {
    let name = super::tagged(be);
    let mut worst = [0f64; 7];
    for (di, &dims) in DIMS.iter().enumerate() {
        for &t in &TS {
            for &c in &[1.0, 20.0] {
                let case = make_case(dims, t, c, false, 1000 + t as u64 * 7 + di as u64 + c as u64);
                let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
                let (o_rec, s_rec) = run(be, &case, Algo::Recurrent);
                let (o_chk, s_chk) = run(be, &case, Algo::Chunked);
                let mut errs = vec![
                    rel_err(&o_rec, &o_ref),
                    rel_err(&s_rec, &s_ref),
                    rel_err(&o_chk, &o_ref),
                    rel_err(&s_chk, &s_ref),
                    rel_err32(&o_chk, &o_rec).max(rel_err32(&s_chk, &s_rec)),
                ];
                if let Some(cpu) = cpu {
                    let (co_rec, cs_rec) = run(cpu, &case, Algo::Recurrent);
                    let (co_chk, cs_chk) = run(cpu, &case, Algo::Chunked);
                    errs.push(rel_err32(&o_rec, &co_rec).max(rel_err32(&s_rec, &cs_rec)));
                    errs.push(rel_err32(&o_chk, &co_chk).max(rel_err32(&s_chk, &cs_chk)));
                }
                for (w, e) in worst.iter_mut().zip(&errs) {
                    *w = w.max(*e);
                }
                let shown: Vec<String> = errs.iter().map(|e| format!("{e:.2e}")).collect();
                assert!(
                    errs.iter().all(|&e| e <= tol),
                    "{name} dims {dims:?} T {t} c {c}: rec o, rec S, chunked o, chunked S vs f64; \
                     chunked vs rec; [rec, chunked vs cpu]: {shown:?}"
                );
            }
        }
    }
    eprintln!(
        "{name}: worst rel err vs f64: recurrent o {:.2e} S {:.2e}, chunked o {:.2e} S {:.2e}; \
         chunked vs recurrent {:.2e}",
        worst[0], worst[1], worst[2], worst[3], worst[4]
    );
    if cpu.is_some() {
        eprintln!("{name}: vs cpu: recurrent {:.2e} chunked {:.2e}", worst[5], worst[6]);
    }
    worst
}

/// With hk = 2, hv = 4 the tiled rule (j % hk: 0,1,0,1) and the grouped rule (j / r: 0,0,1,1)
/// differ for heads 1 and 2; the backend must follow the tiled one.
pub fn check_value_head_mapping(be: &dyn Backend, tol: f64) {
    let dims = DIMS[1];
    let case = make_case(dims, 70, 1.0, false, 77);
    let (o_tiled, _) = reference(&case, |j| j % dims.hk);
    let (o_grouped, _) = reference(&case, |j| j / (dims.hv / dims.hk));
    for algo in [Algo::Recurrent, Algo::Chunked] {
        let (o, _) = run(be, &case, algo);
        assert!(rel_err(&o, &o_tiled) <= tol, "{} {algo:?}", be.name());
        assert!(
            rel_err(&o, &o_grouped) > 0.1,
            "{} {algo:?}: the j / r mapping should give a clearly different answer",
            be.name()
        );
    }
}

/// After one token from the zero state, M[c][i] = beta * v[c] * k[i]: row c is proportional to k
/// (value-major). A transposed layout would make column c proportional to k instead. dk != dv so
/// the row/column roles cannot be confused by shape either, and dv = 48 is not a multiple of a
/// 32-row block.
pub fn check_layout_one_token_from_zero_state(be: &dyn Backend) {
    for dv in [16, 48] {
        let dims = GdnDims {
            hk: 2,
            hv: 4,
            dk: 32,
            dv,
        };
        let case = make_case(dims, 1, 1.0, true, 5);
        let kd = dims.key_dim();
        for algo in [Algo::Recurrent, Algo::Chunked] {
            let (_, m) = run(be, &case, algo);
            for j in 0..dims.hv {
                let kh = j % dims.hk;
                let k = &case.u[kd + kh * dims.dk..kd + (kh + 1) * dims.dk];
                let v = &case.u[2 * kd + j * dims.dv..2 * kd + (j + 1) * dims.dv];
                for c in 0..dims.dv {
                    for i in 0..dims.dk {
                        let want = case.beta[j] * v[c] * k[i];
                        let got = m[(j * dims.dv + c) * dims.dk + i];
                        assert!(
                            (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                            "{} {algo:?} dv {dv} head {j} M[{c}][{i}] = {got}, want {want}",
                            be.name()
                        );
                    }
                }
            }
        }
    }
}

/// A chunked prefill of `t1` tokens, then recurrent decode of the rest, equals the f64 recurrence
/// and the f32 recurrence over all tokens.
pub fn check_prefill_then_decode(be: &dyn Backend, tol: f64) {
    for &dims in &DIMS {
        for &(t, t1) in &[(200usize, 101usize), (130, 64), (70, 1), (66, 65)] {
            let case = make_case(dims, t, 1.0, false, 31 + t as u64);
            let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
            let state = be.upload_f32(&case.m0, &[dims.hv, dims.dv, dims.dk]).unwrap();
            let mut o = run_range(be, &case, 0, t1, &state, Algo::Chunked);
            for tt in t1..t {
                o.extend(run_range(be, &case, tt, tt + 1, &state, Algo::Recurrent));
            }
            let s = be.read_f32(&state).unwrap();
            let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
            let what = format!("{} dims {dims:?} T {t} prefill {t1}", super::tagged(be));
            assert!(eo <= tol && es <= tol, "{what}: o {eo:.2e} S {es:.2e}");
            let (o_rec, s_rec) = run(be, &case, Algo::Recurrent);
            assert!(
                rel_err32(&o, &o_rec) <= tol && rel_err32(&s, &s_rec) <= tol,
                "{what}: vs f32 recurrence"
            );
        }
    }
}

/// g down to about -100 per token: any factored decay e^{-γ} would overflow to inf/NaN.
pub fn check_very_negative_gates(be: &dyn Backend, tol: f64) {
    let dims = DIMS[1];
    let case = make_case(dims, 130, 50.0, false, 9);
    let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
    for algo in [Algo::Recurrent, Algo::Chunked] {
        let (o, s) = run(be, &case, algo);
        let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
        assert!(
            eo <= tol && es <= tol,
            "{} {algo:?}: o {eo:.2e} S {es:.2e}",
            super::tagged(be)
        );
    }
}

/// The contract's shape, dtype and aliasing rules for both ops.
pub fn check_rejects_bad_shapes_and_aliasing(be: &dyn Backend) {
    let dims = DIMS[1];
    let cd = dims.conv_dim();
    let f = |shape: &[usize]| be.alloc(DType::F32, shape).unwrap();
    let (u, g, b) = (f(&[3, cd]), f(&[3, dims.hv]), f(&[3, dims.hv]));
    let (s, o) = (f(&[dims.hv, dims.dv, dims.dk]), f(&[3, dims.value_dim()]));
    type Op = fn(&dyn Backend, &Tensor, &Tensor, &Tensor, &Tensor, &Tensor, GdnDims) -> rill::Result<()>;
    let ops: [(&str, Op); 2] = [
        ("recurrent", |be, u, g, b, s, o, d| {
            be.delta_rule_recurrent(u, g, b, s, o, d)
        }),
        ("chunked", |be, u, g, b, s, o, d| {
            be.delta_rule_chunked(u, g, b, s, o, d)
        }),
    ];
    let bad_u = f(&[3, cd + 1]);
    let bad_g = f(&[2, dims.hv]);
    let bad_s = f(&[dims.hv, dims.dv]);
    let bad_o = f(&[3, dims.value_dim() - 1]);
    let ids = be.upload_u32(&[0; 12], &[3, dims.hv]).unwrap();
    let name = super::tagged(be);
    for (op, run) in ops {
        assert!(run(be, &u, &g, &b, &s, &o, dims).is_ok(), "{name} {op}");
        assert!(run(be, &bad_u, &g, &b, &s, &o, dims).is_err(), "{name} {op}: u columns");
        assert!(run(be, &u, &bad_g, &b, &s, &o, dims).is_err(), "{name} {op}: g rows");
        assert!(run(be, &u, &g, &bad_g, &s, &o, dims).is_err(), "{name} {op}: beta rows");
        assert!(
            run(be, &u, &g, &b, &bad_s, &o, dims).is_err(),
            "{name} {op}: state shape"
        );
        assert!(run(be, &u, &g, &b, &s, &bad_o, dims).is_err(), "{name} {op}: out shape");
        assert!(run(be, &u, &ids, &b, &s, &o, dims).is_err(), "{name} {op}: dtype");
        assert!(run(be, &u, &g, &g, &s, &g, dims).is_err(), "{name} {op}: out aliases g");
        assert!(
            run(be, &u, &g, &b, &b, &o, dims).is_err(),
            "{name} {op}: state aliases beta"
        );
        // state sharing out's buffer (the shape is only a view; the check must fire before use).
        let s_on_o = Tensor {
            shape: vec![dims.hv, dims.dv, dims.dk],
            ..o.clone()
        };
        assert!(
            run(be, &u, &g, &b, &s_on_o, &o, dims).is_err(),
            "{name} {op}: out aliases state"
        );
        let odd = GdnDims { hk: 3, ..dims };
        assert!(run(be, &u, &g, &b, &s, &o, odd).is_err(), "{name} {op}: hv % hk");
    }
    be.sync().unwrap();
}
