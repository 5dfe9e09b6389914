//! The gated delta rule of the CPU backend (recurrent and chunked) against an independent f64
//! implementation of spec/DELTANET.md A.1 in HF orientation (`S` `[dk][dv]`, row = key index).

mod common;

use common::delta::*;
use rill::backend::cpu::CpuBackend;
use rill::backend::{Backend, DType, GdnDims};

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
