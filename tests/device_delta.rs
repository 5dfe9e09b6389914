//! Every device backend's gated delta rule (recurrent and chunked) against an independent f64 implementation
//! of spec/DELTANET.md A.1 (HF orientation), against the CPU backend's ops, and against each other.

mod common;

use std::sync::Arc;

use common::delta::*;
use common::{cpu, devices};
use rill::backend::{Backend, DType, GdnDims, Tensor};

/// max |err| / max |reference|, for f32 on the GPU against f64 truth and against the CPU's f32.
/// Argument: both algorithms are sums of dk = 128-term dot products and rank-1 updates whose
/// per-step rounding is a few f32 ulp (6e-8 relative); the recurrence is non-expansive
/// (e^g ≤ 1, ‖I − β k kᵀ‖ ≤ 1) so errors do not grow with T, and the chunked form adds the
/// 64-step triangular solve with |A| entries ≤ 1. The CPU reaches ≤ 3e-7 against f64 (see
/// tests/delta_rule.rs); the GPU differs in summation order and in exp (WGSL allows
/// 3 + 2|x| ulp, and an error in an exponent x only matters where e^x is not negligible).
/// Measured on lavapipe: ≤ 6.5e-7 for every comparison below (printed by the first test). CUDA
/// uses IEEE expf and f32 FMAs, in the same bound.
/// 1e-5 leaves headroom for GPU exp/FMA differences on other drivers; real bugs (transposed state, wrong key head, factored decay,
/// off-by-one in a decay) give errors of order 1e-2..1.
const TOL: f64 = 1e-5;

#[test]
fn gpu_matches_f64_cpu_and_each_other() {
    for (_, dev) in devices() {
        gpu_matches_f64_cpu_and_each_other_on(&dev);
    }
}

fn gpu_matches_f64_cpu_and_each_other_on(dev: &Arc<dyn Backend>) {
    let (gpu, cpu) = (Arc::clone(dev), cpu());
    // worst: [rec o, rec S, chunk o, chunk S] vs f64, [rec, chunk] vs CPU, chunked vs recurrent.
    let mut worst = [0f64; 7];
    for (di, &dims) in DIMS.iter().enumerate() {
        for &t in &TS {
            for &c in &[1.0, 20.0] {
                let case = make_case(dims, t, c, false, 1000 + t as u64 * 7 + di as u64 + c as u64);
                let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
                let (o_rec, s_rec) = run(gpu.as_ref(), &case, Algo::Recurrent);
                let (o_chk, s_chk) = run(gpu.as_ref(), &case, Algo::Chunked);
                let (co_rec, cs_rec) = run(cpu.as_ref(), &case, Algo::Recurrent);
                let (co_chk, cs_chk) = run(cpu.as_ref(), &case, Algo::Chunked);
                let errs = [
                    rel_err(&o_rec, &o_ref),
                    rel_err(&s_rec, &s_ref),
                    rel_err(&o_chk, &o_ref),
                    rel_err(&s_chk, &s_ref),
                    rel_err32(&o_rec, &co_rec).max(rel_err32(&s_rec, &cs_rec)),
                    rel_err32(&o_chk, &co_chk).max(rel_err32(&s_chk, &cs_chk)),
                    rel_err32(&o_chk, &o_rec).max(rel_err32(&s_chk, &s_rec)),
                ];
                for (w, e) in worst.iter_mut().zip(errs) {
                    *w = w.max(e);
                }
                assert!(
                    errs.iter().all(|&e| e <= TOL),
                    "dims {dims:?} T {t} c {c}: vs f64 rec o/S {:.2e}/{:.2e} chunked o/S {:.2e}/{:.2e}; \
                     vs cpu rec {:.2e} chunked {:.2e}; chunked vs rec {:.2e}",
                    errs[0],
                    errs[1],
                    errs[2],
                    errs[3],
                    errs[4],
                    errs[5],
                    errs[6]
                );
            }
        }
    }
    eprintln!(
        "worst rel err vs f64: recurrent o {:.2e} S {:.2e}, chunked o {:.2e} S {:.2e}; \
         vs cpu: recurrent {:.2e} chunked {:.2e}; chunked vs recurrent {:.2e}",
        worst[0], worst[1], worst[2], worst[3], worst[4], worst[5], worst[6]
    );
}

#[test]
fn value_head_uses_key_head_j_mod_hk() {
    for (_, dev) in devices() {
        value_head_uses_key_head_j_mod_hk_on(&dev);
    }
}

fn value_head_uses_key_head_j_mod_hk_on(dev: &Arc<dyn Backend>) {
    // hk = 2, hv = 4: the tiled rule (j % hk) and the grouped rule (j / 2) differ for heads 1, 2.
    let gpu = Arc::clone(dev);
    let dims = DIMS[1];
    let case = make_case(dims, 70, 1.0, false, 77);
    let (o_tiled, _) = reference(&case, |j| j % dims.hk);
    let (o_grouped, _) = reference(&case, |j| j / (dims.hv / dims.hk));
    for algo in [Algo::Recurrent, Algo::Chunked] {
        let (o, _) = run(gpu.as_ref(), &case, algo);
        assert!(rel_err(&o, &o_tiled) <= TOL, "{algo:?}");
        assert!(rel_err(&o, &o_grouped) > 0.1, "{algo:?}: grouped mapping should differ");
    }
}

#[test]
fn layout_invariant_one_token_from_zero_state() {
    for (_, dev) in devices() {
        layout_invariant_one_token_from_zero_state_on(&dev);
    }
}

fn layout_invariant_one_token_from_zero_state_on(dev: &Arc<dyn Backend>) {
    // After one token from the zero state M[c][i] = β v[c] k[i]: row c is proportional to k.
    // dk != dv (and dv not a multiple of the 32-row block) so roles cannot be confused by shape.
    let gpu = Arc::clone(dev);
    let dims = GdnDims {
        hk: 2,
        hv: 4,
        dk: 32,
        dv: 48,
    };
    let case = make_case(dims, 1, 1.0, true, 5);
    let kd = dims.key_dim();
    for algo in [Algo::Recurrent, Algo::Chunked] {
        let (_, m) = run(gpu.as_ref(), &case, algo);
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
                        "{algo:?} head {j} M[{c}][{i}] = {got}, want {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn chunked_prefill_then_recurrent_decode_equals_recurrence() {
    for (_, dev) in devices() {
        chunked_prefill_then_recurrent_decode_equals_recurrence_on(&dev);
    }
}

fn chunked_prefill_then_recurrent_decode_equals_recurrence_on(dev: &Arc<dyn Backend>) {
    let gpu = Arc::clone(dev);
    for &dims in &DIMS {
        for &(t, t1) in &[(200usize, 101usize), (130, 64), (70, 1), (66, 65)] {
            let case = make_case(dims, t, 1.0, false, 31 + t as u64);
            let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
            let state = gpu.upload_f32(&case.m0, &[dims.hv, dims.dv, dims.dk]).unwrap();
            let mut o = run_range(gpu.as_ref(), &case, 0, t1, &state, Algo::Chunked);
            for tt in t1..t {
                o.extend(run_range(gpu.as_ref(), &case, tt, tt + 1, &state, Algo::Recurrent));
            }
            let s = gpu.read_f32(&state).unwrap();
            let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
            assert!(
                eo <= TOL && es <= TOL,
                "dims {dims:?} T {t} prefill {t1}: o {eo:.2e} S {es:.2e}"
            );
            let (o_rec, s_rec) = run(gpu.as_ref(), &case, Algo::Recurrent);
            assert!(rel_err32(&o, &o_rec) <= TOL && rel_err32(&s, &s_rec) <= TOL);
        }
    }
}

#[test]
fn chunked_is_stable_for_very_negative_gates() {
    for (_, dev) in devices() {
        chunked_is_stable_for_very_negative_gates_on(&dev);
    }
}

fn chunked_is_stable_for_very_negative_gates_on(dev: &Arc<dyn Backend>) {
    // g down to about -100 per token: a factored decay e^{-γ} would overflow to inf/NaN.
    let gpu = Arc::clone(dev);
    let dims = DIMS[1];
    let case = make_case(dims, 130, 50.0, false, 9);
    let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
    for algo in [Algo::Recurrent, Algo::Chunked] {
        let (o, s) = run(gpu.as_ref(), &case, algo);
        let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
        assert!(eo <= TOL && es <= TOL, "{algo:?}: o {eo:.2e} S {es:.2e}");
    }
}

#[test]
fn long_sequences_span_several_dispatches() {
    for (_, dev) in devices() {
        long_sequences_span_several_dispatches_on(&dev);
    }
}

fn long_sequences_span_several_dispatches_on(dev: &Arc<dyn Backend>) {
    // Both ops split long sequences over several dispatches (llvmpipe ends every loop of a shader
    // invocation after 65535 back-edges in total; before the split, the recurrence silently
    // stopped after ~250 tokens at dk = 128). Both cases also exceed one scratch batch of the
    // chunked op (16 chunks), so the state is carried from batch to batch.
    let gpu = Arc::clone(dev);
    for (dims, t) in [(DIMS[1], 64 * 64 + 130), (DIMS[0], 1100)] {
        let case = make_case(dims, t, 1.0, false, 11);
        let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
        for algo in [Algo::Recurrent, Algo::Chunked] {
            let (o, s) = run(gpu.as_ref(), &case, algo);
            let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
            assert!(eo <= TOL && es <= TOL, "{algo:?} {dims:?} T {t}: o {eo:.2e} S {es:.2e}");
        }
    }
}

#[test]
fn delta_rule_rejects_bad_shapes_and_aliasing() {
    for (_, dev) in devices() {
        delta_rule_rejects_bad_shapes_and_aliasing_on(&dev);
    }
}

fn delta_rule_rejects_bad_shapes_and_aliasing_on(dev: &Arc<dyn Backend>) {
    let gpu: Arc<dyn Backend> = Arc::clone(dev);
    let be = gpu.as_ref();
    let dims = DIMS[1];
    let cd = dims.conv_dim();
    let u = be.alloc(DType::F32, &[3, cd]).unwrap();
    let g = be.alloc(DType::F32, &[3, dims.hv]).unwrap();
    let b = be.alloc(DType::F32, &[3, dims.hv]).unwrap();
    let s = be.alloc(DType::F32, &[dims.hv, dims.dv, dims.dk]).unwrap();
    let o = be.alloc(DType::F32, &[3, dims.value_dim()]).unwrap();
    type Op = fn(&dyn Backend, &Tensor, &Tensor, &Tensor, &Tensor, &Tensor, GdnDims) -> rill::Result<()>;
    let ops: [(&str, Op); 2] = [
        ("recurrent", |be, u, g, b, s, o, d| {
            be.delta_rule_recurrent(u, g, b, s, o, d)
        }),
        ("chunked", |be, u, g, b, s, o, d| {
            be.delta_rule_chunked(u, g, b, s, o, d)
        }),
    ];
    let bad_u = be.alloc(DType::F32, &[3, cd + 1]).unwrap();
    let bad_g = be.alloc(DType::F32, &[2, dims.hv]).unwrap();
    let bad_s = be.alloc(DType::F32, &[dims.hv, dims.dv]).unwrap();
    let bad_o = be.alloc(DType::F32, &[3, dims.value_dim() - 1]).unwrap();
    let ids = be.upload_u32(&[0; 12], &[3, dims.hv]).unwrap();
    // A key head dim past the kernel's bound: 128 on wgpu, 512 on cuda.
    let too_big = if be.name() == "cuda" { 1024 } else { 256 };
    let big = GdnDims { dk: too_big, ..dims };
    let u_big = be.alloc(DType::F32, &[3, big.conv_dim()]).unwrap();
    let s_big = be.alloc(DType::F32, &[dims.hv, dims.dv, too_big]).unwrap();
    for (name, f) in ops {
        assert!(f(be, &u, &g, &b, &s, &o, dims).is_ok(), "{name}");
        assert!(f(be, &bad_u, &g, &b, &s, &o, dims).is_err(), "{name}: u columns");
        assert!(f(be, &u, &bad_g, &b, &s, &o, dims).is_err(), "{name}: g rows");
        assert!(f(be, &u, &g, &bad_g, &s, &o, dims).is_err(), "{name}: beta rows");
        assert!(f(be, &u, &g, &b, &bad_s, &o, dims).is_err(), "{name}: state shape");
        assert!(f(be, &u, &g, &b, &s, &bad_o, dims).is_err(), "{name}: out shape");
        assert!(f(be, &u, &ids, &b, &s, &o, dims).is_err(), "{name}: dtype");
        assert!(f(be, &u, &g, &g, &s, &g, dims).is_err(), "{name}: out aliases g");
        assert!(f(be, &u, &g, &b, &b, &o, dims).is_err(), "{name}: state aliases beta");
        // state sharing out's buffer (the shape is only a view; the check must fire before use).
        let s_on_o = Tensor {
            shape: vec![dims.hv, dims.dv, dims.dk],
            ..o.clone()
        };
        assert!(
            f(be, &u, &g, &b, &s_on_o, &o, dims).is_err(),
            "{name}: out aliases state"
        );
        let odd = GdnDims { hk: 3, ..dims };
        assert!(f(be, &u, &g, &b, &s, &o, odd).is_err(), "{name}: hv % hk");
        assert!(f(be, &u_big, &g, &b, &s_big, &o, big).is_err(), "{name}: dk {too_big}");
    }
    be.sync().unwrap();
}
