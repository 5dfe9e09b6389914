//! Every device backend's gated delta rule (recurrent and chunked) against an independent f64
//! implementation of spec/DELTANET.md A.1 (HF orientation), against the CPU backend's ops, and
//! against each other: the checks of tests/delta_rule.rs, plus the long sequences.

mod common;

use common::delta::*;
use common::device::Both;
use common::{is_fast, FAST_REL_L2};
use rill::backend::{Backend, GdnDims};

/// max |err| / max |reference|, for f32 on the device against f64 truth and against the CPU's f32.
/// Argument: both algorithms are sums of dk = 128-term dot products and rank-1 updates whose
/// per-step rounding is a few f32 ulp (6e-8 relative); the recurrence is non-expansive
/// (e^g ≤ 1, ‖I − β k kᵀ‖ ≤ 1) so errors do not grow with T, and the chunked form adds the
/// 64-step triangular solve with |A| entries ≤ 1. The CPU reaches ≤ 3e-7 against f64 (see
/// tests/delta_rule.rs); a GPU differs in summation order and in exp (WGSL allows
/// 3 + 2|x| ulp, and an error in an exponent x only matters where e^x is not negligible).
/// Measured on lavapipe: ≤ 6.5e-7 for every comparison below (printed by the first test).
/// 1e-5 leaves headroom for GPU exp/FMA differences on other drivers; real bugs (transposed state, wrong key head, factored decay,
/// off-by-one in a decay) give errors of order 1e-2..1.
const TOL: f64 = 1e-5;

/// The bound for `be`: `TOL` at the exact tier; at the fast tier (the chunked products in one
/// tf32 pass: operands rounded to 10 mantissa bits, 2^-11 relative, ~4e-4 measured on the CPU
/// emulator of the kernels) the fixtures' f16-rounded bound.
fn tol(be: &dyn Backend) -> f64 {
    if is_fast(be) {
        FAST_REL_L2
    } else {
        TOL
    }
}

#[test]
fn device_matches_f64_cpu_and_each_other() {
    for p in Both::each() {
        check_against_f64(p.dev.as_ref(), Some(p.cpu.as_ref()), tol(p.dev.as_ref()));
    }
}

#[test]
fn value_head_uses_key_head_j_mod_hk() {
    for p in Both::each() {
        check_value_head_mapping(p.dev.as_ref(), tol(p.dev.as_ref()));
    }
}

#[test]
fn layout_invariant_one_token_from_zero_state() {
    for p in Both::each() {
        check_layout_one_token_from_zero_state(p.dev.as_ref());
    }
}

#[test]
fn chunked_prefill_then_recurrent_decode_equals_recurrence() {
    for p in Both::each() {
        check_prefill_then_decode(p.dev.as_ref(), tol(p.dev.as_ref()));
    }
}

#[test]
fn chunked_is_stable_for_very_negative_gates() {
    for p in Both::each() {
        check_very_negative_gates(p.dev.as_ref(), tol(p.dev.as_ref()));
    }
}

#[test]
fn long_sequences_span_several_dispatches() {
    // The wgpu ops split long sequences over several dispatches (llvmpipe ends every loop of a
    // shader invocation after 65535 back-edges in total; before the split, the recurrence silently
    // stopped after ~250 tokens at dk = 128). Both cases also exceed one scratch batch of the
    // chunked op (16 chunks), so the state is carried from batch to batch.
    for p in Both::each() {
        let gpu = p.dev.as_ref();
        let tol = tol(gpu);
        for (dims, t) in [(DIMS[1], 64 * 64 + 130), (DIMS[0], 1100)] {
            let case = make_case(dims, t, 1.0, false, 11);
            let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
            for algo in [Algo::Recurrent, Algo::Chunked] {
                let (o, s) = run(gpu, &case, algo);
                let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
                assert!(
                    eo <= tol && es <= tol,
                    "{} {algo:?} {dims:?} T {t}: o {eo:.2e} S {es:.2e}",
                    p.name()
                );
            }
        }
    }
}

#[test]
fn delta_rule_rejects_bad_shapes_and_aliasing() {
    for p in Both::each() {
        check_rejects_bad_shapes_and_aliasing(p.dev.as_ref());
    }
}

/// dk = 256 is past the wgpu kernels' bound (dk <= 128): refused, or computed to the f64
/// reference like every other case.
#[test]
fn large_key_heads_refuse_or_compute() {
    for p in Both::each() {
        let dims = GdnDims { dk: 256, ..DIMS[1] };
        let case = make_case(dims, 3, 1.0, false, 13);
        let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
        for algo in [Algo::Recurrent, Algo::Chunked] {
            let Ok((o, s)) = try_run(p.dev.as_ref(), &case, algo) else {
                continue;
            };
            let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
            assert!(
                eo <= tol(p.dev.as_ref()) && es <= tol(p.dev.as_ref()),
                "{} {algo:?} dk 256: o {eo:.2e} S {es:.2e}",
                p.name()
            );
        }
        p.dev.sync().unwrap();
    }
}

/// dk != dv (the layout test covers it for one token only), with sizes that are not multiples of
/// the kernels' blocks (4-wide vectors, 16-row state blocks), over several chunks with a short last
/// one and over several scratch batches (16 chunks each on wgpu). A backend may refuse a shape it
/// does not support; what it computes must match the f64 reference.
#[test]
fn unequal_key_and_value_dims() {
    for p in Both::each() {
        let gpu = p.dev.as_ref();
        for (dk, dv) in [(64, 40), (30, 37), (128, 96)] {
            let dims = GdnDims { hk: 2, hv: 4, dk, dv };
            for t in [130, 64 * 17 + 5] {
                let case = make_case(dims, t, 1.0, false, 17 + t as u64);
                let (o_ref, s_ref) = reference(&case, |j| j % dims.hk);
                for algo in [Algo::Recurrent, Algo::Chunked] {
                    let Ok((o, s)) = try_run(gpu, &case, algo) else {
                        continue;
                    };
                    let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
                    assert!(
                        eo <= tol(gpu) && es <= tol(gpu),
                        "{} {algo:?} {dims:?} T {t}: o {eo:.2e} S {es:.2e}",
                        p.name()
                    );
                }
                gpu.sync().unwrap();
            }
        }
    }
}
