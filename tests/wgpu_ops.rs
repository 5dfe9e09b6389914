//! The wgpu backend's elementwise, norm, conv and attention ops against the CPU reference backend,
//! on random inputs with odd sizes, plus the error cases.
//!
//! Tolerances follow from f32 rounding: elementwise kernels differ from the CPU only in the
//! device's exp/sqrt (a few ulp) and in FMA contraction, hence ~1e-5 relative; reductions (norms,
//! attention) add the rounding of a differently ordered sum of n terms, bounded by ~n·2^-24 in
//! the worst case and ~sqrt(n)·2^-24 typically, hence up to 1e-4 relative for the sizes here.

mod common;

use std::sync::Arc;

use common::*;
use rill::backend::{AttnDims, Backend, DType, GdnDims, Pos, Tensor, NON_FINITE};

/// The same data on both backends.
fn up2(g: &dyn Backend, c: &dyn Backend, data: &[f32], shape: &[usize]) -> (Tensor, Tensor) {
    (up(g, data, shape), up(c, data, shape))
}

fn read(be: &dyn Backend, t: &Tensor) -> Vec<f32> {
    be.read_f32(t).expect("read")
}

struct Pair {
    g: Arc<dyn Backend>,
    c: Arc<dyn Backend>,
}

impl Pair {
    fn new() -> Pair {
        Pair { g: wgpu(), c: cpu() }
    }
    fn up(&self, data: &[f32], shape: &[usize]) -> (Tensor, Tensor) {
        up2(self.g.as_ref(), self.c.as_ref(), data, shape)
    }
    fn zeros(&self, shape: &[usize]) -> (Tensor, Tensor) {
        (
            self.g.alloc(DType::F32, shape).expect("alloc"),
            self.c.alloc(DType::F32, shape).expect("alloc"),
        )
    }
    /// Compare a tensor of both backends.
    fn check(&self, what: &str, t: &(Tensor, Tensor), atol: f32, rtol: f32) {
        assert_close(
            what,
            &read(self.g.as_ref(), &t.0),
            &read(self.c.as_ref(), &t.1),
            atol,
            rtol,
        );
    }
}

const TS: [usize; 4] = [1, 3, 64, 65];

/// Gated DeltaNet geometries: the real one (heads of 128) and an odd one.
const GDN_DIMS: [GdnDims; 2] = [
    GdnDims {
        hk: 2,
        hv: 4,
        dk: 128,
        dv: 128,
    },
    GdnDims {
        hk: 3,
        hv: 3,
        dk: 5,
        dv: 7,
    },
];

#[test]
fn swiglu_and_sigmoid_ops() {
    let p = Pair::new();
    let mut rng = Rng::new(11);
    for n in [1usize, 3, 255, 257, 4160, 100_003] {
        // Wide range so that exp over- and underflows in sigmoid/silu are exercised too.
        let mut gate = rng.normals(n, 4.0);
        if n > 3 {
            gate[0] = -100.0;
            gate[1] = 100.0;
            gate[2] = 0.0;
        }
        let upv = rng.normals(n, 1.0);
        let (g, u) = (p.up(&gate, &[n]), p.up(&upv, &[n]));
        let out = p.zeros(&[n]);
        p.g.swiglu(&g.0, &u.0, &out.0).expect("wgpu swiglu");
        p.c.swiglu(&g.1, &u.1, &out.1).expect("cpu swiglu");
        p.check(&format!("swiglu n={n}"), &out, 1e-6, 1e-5);

        let x = p.up(&upv, &[n]);
        p.g.sigmoid_mul_assign(&x.0, &g.0).expect("wgpu sigmoid_mul_assign");
        p.c.sigmoid_mul_assign(&x.1, &g.1).expect("cpu sigmoid_mul_assign");
        p.check(&format!("sigmoid_mul_assign n={n}"), &x, 1e-6, 1e-5);
    }
    for t in TS {
        for d in [1usize, 37, 2048] {
            let acc = rng.normals(t * d, 1.0);
            let x = rng.normals(t * d, 1.0);
            let gl = rng.normals(t, 3.0);
            let (acc, x, gl) = (p.up(&acc, &[t, d]), p.up(&x, &[t, d]), p.up(&gl, &[t, 1]));
            p.g.sigmoid_scale_add(&acc.0, &x.0, &gl.0)
                .expect("wgpu sigmoid_scale_add");
            p.c.sigmoid_scale_add(&acc.1, &x.1, &gl.1)
                .expect("cpu sigmoid_scale_add");
            p.check(&format!("sigmoid_scale_add t={t} d={d}"), &acc, 1e-6, 1e-5);
        }
    }
}

#[test]
fn split_qgate_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(12);
    for t in TS {
        for (h, d) in [(1usize, 1usize), (3, 5), (4, 256)] {
            let qg = p.up(&rng.normals(t * 2 * h * d, 1.0), &[t, 2 * h * d]);
            let (q, gate) = (p.zeros(&[t, h * d]), p.zeros(&[t, h * d]));
            p.g.split_qgate(&qg.0, d, &q.0, &gate.0).expect("wgpu split_qgate");
            p.c.split_qgate(&qg.1, d, &q.1, &gate.1).expect("cpu split_qgate");
            // A pure copy: bit-exact.
            p.check(&format!("split_qgate q t={t} h={h} d={d}"), &q, 0.0, 0.0);
            p.check(&format!("split_qgate gate t={t} h={h} d={d}"), &gate, 0.0, 0.0);
        }
    }
}

#[test]
fn gdn_gates_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(13);
    for t in TS {
        for hv in [1usize, 4, 7] {
            let mut a = rng.normals(t * hv, 6.0);
            // The softplus branches: huge negative (e^x underflows), around the x > 20 switch,
            // and large positive.
            for (i, v) in [-100.0f32, -30.0, -17.0, 19.99, 20.0, 20.01, 40.0].iter().enumerate() {
                if i < a.len() {
                    a[i] = *v;
                }
            }
            let b = rng.normals(t * hv, 4.0);
            let ssm_a: Vec<f32> = (0..hv).map(|_| -rng.uniform() * 8.0 - 0.01).collect();
            let dt: Vec<f32> = rng.normals(hv, 1.0);
            let (a, b) = (p.up(&a, &[t, hv]), p.up(&b, &[t, hv]));
            let (sa, dt) = (p.up(&ssm_a, &[hv]), p.up(&dt, &[hv]));
            let (g, beta) = (p.zeros(&[t, hv]), p.zeros(&[t, hv]));
            p.g.gdn_gates(&a.0, &b.0, &sa.0, &dt.0, &g.0, &beta.0)
                .expect("wgpu gdn_gates");
            p.c.gdn_gates(&a.1, &b.1, &sa.1, &dt.1, &g.1, &beta.1)
                .expect("cpu gdn_gates");
            // Relative, down to the tiny softplus values of very negative inputs.
            p.check(&format!("gdn_gates g t={t} hv={hv}"), &g, 1e-30, 1e-5);
            p.check(&format!("gdn_gates beta t={t} hv={hv}"), &beta, 1e-7, 1e-5);
        }
    }
}

/// CPU argmax of a row, for readable expectations.
fn argmax_of(p: &Pair, data: &[f32], t: usize, v: usize) -> (Vec<u32>, Vec<u32>) {
    let l = p.g.upload_f32(data, &[t, v]).expect("up");
    let lc = p.c.upload_f32(data, &[t, v]).expect("up");
    let og = p.g.alloc(DType::U32, &[t]).expect("alloc");
    let oc = p.c.alloc(DType::U32, &[t]).expect("alloc");
    p.g.argmax(&l, &og).expect("wgpu argmax");
    p.c.argmax(&lc, &oc).expect("cpu argmax");
    (p.g.read_u32(&og).expect("read"), p.c.read_u32(&oc).expect("read"))
}

#[test]
fn argmax_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(14);
    // Random rows, including the real vocabulary size.
    for (t, v) in [(1usize, 1usize), (3, 5), (64, 300), (65, 1000), (3, 248_320)] {
        let data = rng.normals(t * v, 3.0);
        let (g, c) = argmax_of(&p, &data, t, v);
        assert_eq!(g, c, "argmax t={t} v={v}");
    }
    // Ties, NaN and infinities, one case per row of V = 248,320.
    let v = 248_320usize;
    let nan = f32::NAN;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let base = rng.normals(v, 1.0);
    let with = |changes: &[(usize, f32)]| {
        let mut r = base.clone();
        for &(i, x) in changes {
            r[i] = x;
        }
        r
    };
    rows.push(with(&[(7, 50.0), (200_000, 50.0)])); // tie far apart: 7
    rows.push(with(&[(1000, 50.0), (1001, 50.0), (1256, 50.0)])); // tie within one stride: 1000
    rows.push(with(&[(248_319, 50.0), (248_063, 50.0)])); // tie near the end: 248063
    rows.push(with(&[(0, nan), (5, 60.0), (6, nan)])); // NaN never wins: 5
    rows.push(vec![nan; v]); // all NaN: NON_FINITE
    rows.push({
        let mut r = vec![nan; v];
        r[123_457] = -1e30;
        r
    }); // a single number among NaNs: 123457
    rows.push(vec![f32::NEG_INFINITY; v]); // all -inf: NON_FINITE
    rows.push(
        (0..v)
            .map(|i| if i % 3 == 0 { nan } else { f32::NEG_INFINITY })
            .collect(),
    ); // NaN and -inf only: NON_FINITE
    rows.push(with(&[(3, f32::INFINITY), (9, f32::INFINITY)])); // +inf tie: 3
    rows.push(vec![0.25; v]); // constant: 0
    let t = rows.len();
    let data: Vec<f32> = rows.concat();
    let (g, c) = argmax_of(&p, &data, t, v);
    let nf = NON_FINITE;
    assert_eq!(c, [7, 1000, 248_063, 5, nf, 123_457, nf, nf, 3, 0], "cpu reference");
    assert_eq!(g, c, "argmax special rows");
}

#[test]
fn rms_norm_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(15);
    for t in TS {
        // Whole-row norms of odd and real widths, and per-head norms (w of one head).
        for (width, d) in [
            (1usize, 1usize),
            (7, 7),
            (257, 257),
            (2048, 2048),
            (3 * 128, 128),
            (5 * 256, 256),
        ] {
            let x = p.up(&rng.normals(t * width, 2.0), &[t, width]);
            let w = p.up(&rng.normals(d, 1.0), &[d]);
            let out = p.zeros(&[t, width]);
            p.g.rms_norm(&x.0, &w.0, 1e-6, &out.0).expect("wgpu rms_norm");
            p.c.rms_norm(&x.1, &w.1, 1e-6, &out.1).expect("cpu rms_norm");
            p.check(&format!("rms_norm t={t} width={width} d={d}"), &out, 1e-6, 1e-5);

            let z = p.up(&rng.normals(t * width, 2.0), &[t, width]);
            let out = p.zeros(&[t, width]);
            p.g.gated_rms_norm(&x.0, &z.0, &w.0, 1e-6, &out.0)
                .expect("wgpu gated_rms_norm");
            p.c.gated_rms_norm(&x.1, &z.1, &w.1, 1e-6, &out.1)
                .expect("cpu gated_rms_norm");
            p.check(&format!("gated_rms_norm t={t} width={width} d={d}"), &out, 1e-6, 1e-5);
        }
    }
    // A zero group: eps keeps the result finite (0).
    let x = p.up(&[0.0; 8], &[2, 4]);
    let w = p.up(&[1.0; 4], &[4]);
    let out = p.zeros(&[2, 4]);
    p.g.rms_norm(&x.0, &w.0, 1e-6, &out.0).expect("wgpu rms_norm");
    assert_eq!(read(p.g.as_ref(), &out.0), [0.0; 8]);
}

#[test]
fn l2_norm_qk_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(16);
    for dims in GDN_DIMS {
        for t in TS {
            let cd = dims.conv_dim();
            let data = rng.normals(t * cd, 1.5);
            let u = p.up(&data, &[t, cd]);
            p.g.l2_norm_qk(&u.0, dims, 1e-6).expect("wgpu l2_norm_qk");
            p.c.l2_norm_qk(&u.1, dims, 1e-6).expect("cpu l2_norm_qk");
            p.check(&format!("l2_norm_qk t={t} {dims:?}"), &u, 1e-7, 2e-5);
            // v is left bit-exact.
            let got = read(p.g.as_ref(), &u.0);
            for r in 0..t {
                let kd2 = 2 * dims.key_dim();
                assert_eq!(
                    got[r * cd + kd2..(r + 1) * cd],
                    data[r * cd + kd2..(r + 1) * cd],
                    "v of row {r}"
                );
            }
        }
    }
}

/// One conv call on both backends; returns (out_g, out_c).
fn conv_step(p: &Pair, x: &[f32], c: usize, w: &(Tensor, Tensor), state: &(Tensor, Tensor)) -> (Tensor, Tensor) {
    let t = x.len() / c;
    let x = p.up(x, &[t, c]);
    let out = p.zeros(&[t, c]);
    p.g.conv1d_causal_silu(&x.0, &w.0, &state.0, &out.0).expect("wgpu conv");
    p.c.conv1d_causal_silu(&x.1, &w.1, &state.1, &out.1).expect("cpu conv");
    out
}

#[test]
fn conv1d_matches_and_carries_state() {
    let p = Pair::new();
    let mut rng = Rng::new(17);
    for (c, k) in [(37usize, 4usize), (1024, 4), (5, 2), (3, 1), (9, 7)] {
        let w = p.up(&rng.normals(c * k, 0.5), &[c, k]);
        for t in TS {
            let state = p.up(&rng.normals((k - 1) * c, 1.0), &[k - 1, c]);
            let x = rng.normals(t * c, 1.0);
            let out = conv_step(&p, &x, c, &w, &state);
            p.check(&format!("conv out c={c} k={k} t={t}"), &out, 1e-6, 1e-5);
            p.check(&format!("conv state c={c} k={k} t={t}"), &state, 0.0, 0.0);
        }
        // State across calls: T=2 then T=1 against the CPU doing the same.
        let s0 = rng.normals((k - 1) * c, 1.0);
        let state = p.up(&s0, &[k - 1, c]);
        for t in [2usize, 1] {
            let out = conv_step(&p, &rng.normals(t * c, 1.0), c, &w, &state);
            p.check(&format!("conv chained out c={c} k={k} t={t}"), &out, 1e-6, 1e-5);
            p.check(&format!("conv chained state c={c} k={k} t={t}"), &state, 0.0, 0.0);
        }
        // T=1 three times equals T=3 once (on the device).
        let x3 = rng.normals(3 * c, 1.0);
        let s_once = p.g.upload_f32(&s0, &[k - 1, c]).expect("up");
        let s_steps = p.g.upload_f32(&s0, &[k - 1, c]).expect("up");
        let out3 = p.g.alloc(DType::F32, &[3, c]).expect("alloc");
        let xg = p.g.upload_f32(&x3, &[3, c]).expect("up");
        p.g.conv1d_causal_silu(&xg, &w.0, &s_once, &out3).expect("conv T=3");
        let mut stepped = Vec::new();
        for r in 0..3 {
            let xr = p.g.upload_f32(&x3[r * c..(r + 1) * c], &[1, c]).expect("up");
            let o = p.g.alloc(DType::F32, &[1, c]).expect("alloc");
            p.g.conv1d_causal_silu(&xr, &w.0, &s_steps, &o).expect("conv T=1");
            stepped.extend(read(p.g.as_ref(), &o));
        }
        assert_eq!(stepped, read(p.g.as_ref(), &out3), "conv T=1 x3 vs T=3, c={c} k={k}");
        assert_eq!(
            read(p.g.as_ref(), &s_steps),
            read(p.g.as_ref(), &s_once),
            "conv state, c={c} k={k}"
        );
    }
}

#[test]
fn rope_neox_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(18);
    // (heads, head_dim, n_rot): Qwen3.5 full attention (256, partial rotary 64), full rotation,
    // odd head count, and a head of one pair.
    let shapes = [(4usize, 256usize, 64usize), (3, 128, 128), (1, 6, 2), (2, 8, 0)];
    for (nh, d, n_rot) in shapes {
        for theta in [10_000.0f32, 10_000_000.0] {
            for (t, pos0) in [(1usize, 0usize), (3, 5), (64, 100), (65, 0), (1, 1000), (3, 4093)] {
                let x = rng.normals(t * nh * d, 1.0);
                let xs = p.up(&x, &[t, nh * d]);
                let (pg, pc) = (
                    p.g.upload_u32(&[pos0 as u32], &[1]).expect("pos"),
                    p.c.upload_u32(&[pos0 as u32], &[1]).expect("pos"),
                );
                p.g.rope_neox(&xs.0, d, n_rot, theta, Pos { host: pos0, dev: &pg })
                    .expect("wgpu rope");
                p.c.rope_neox(&xs.1, d, n_rot, theta, Pos { host: pos0, dev: &pc })
                    .expect("cpu rope");
                // Error model (see rope_neox.wgsl): the f32 angle is off by a few ulp of the
                // position (measured up to 2.5 * pos * 2^-24 rad, bounded here by 4x), which
                // moves a rotated pair (a, b) by that angle times |(a, b)|; plus ~2e-6 relative for
                // sin/cos and the products. At pos 4096 that is ~5e-4 * |(a, b)|.
                let (got, want) = (read(p.g.as_ref(), &xs.0), read(p.c.as_ref(), &xs.1));
                let cols = nh * d;
                for r in 0..t {
                    let pos = (pos0 + r) as f32;
                    for h in 0..nh {
                        for i in 0..d {
                            let j = r * cols + h * d + i;
                            let mate = if n_rot == 0 || i >= n_rot {
                                j
                            } else if i < n_rot / 2 {
                                j + n_rot / 2
                            } else {
                                j - n_rot / 2
                            };
                            let norm = (x[j] * x[j] + x[mate] * x[mate]).sqrt();
                            let tol = 2e-6 * norm + 4.0 * pos * norm / (1u32 << 24) as f32;
                            assert!(
                                (got[j] - want[j]).abs() <= tol,
                                "rope nh={nh} d={d} n_rot={n_rot} theta={theta} pos={pos} i={i}: {} vs {} (tol {tol})",
                                got[j],
                                want[j]
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Caches of `ctx` rows with random contents (rows past pos0+T must not matter).
#[allow(clippy::too_many_arguments)]
fn attention_case(p: &Pair, rng: &mut Rng, t: usize, pos0: usize, extra: usize, dims: AttnDims, q_scale: f32) {
    let AttnDims {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: d,
    } = dims;
    let ctx = pos0 + t + extra;
    let q = p.up(&rng.normals(t * nh * d, q_scale), &[t, nh * d]);
    let k = p.up(&rng.normals(ctx * nkv * d, 1.0), &[ctx, nkv * d]);
    let v = p.up(&rng.normals(ctx * nkv * d, 1.0), &[ctx, nkv * d]);
    let out = p.zeros(&[t, nh * d]);
    let scale = 1.0 / (d as f32).sqrt();
    let (pg, pc) = (
        p.g.upload_u32(&[pos0 as u32], &[1]).expect("pos"),
        p.c.upload_u32(&[pos0 as u32], &[1]).expect("pos"),
    );
    p.g.attention(&q.0, &k.0, &v.0, Pos { host: pos0, dev: &pg }, dims, scale, &out.0)
        .expect("wgpu attention");
    p.c.attention(&q.1, &k.1, &v.1, Pos { host: pos0, dev: &pc }, dims, scale, &out.1)
        .expect("cpu attention");
    // Outputs are convex combinations of N(0,1) values, so the rounding of the n-term sums is
    // absolute, ~sqrt(n) * 2^-24 * max|v| (measured <= 7e-7): 5e-6 covers outputs that cancel to
    // near 0, 1e-4 relative the rest (scores, exp and the online rescaling each add a few ulp).
    p.check(
        &format!("attention t={t} pos0={pos0} ctx={ctx} {dims:?} q*{q_scale}"),
        &out,
        5e-6,
        1e-4,
    );
}

#[test]
fn attention_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(19);
    let dims = |n_head, n_head_kv, head_dim| AttnDims {
        n_head,
        n_head_kv,
        head_dim,
    };
    for t in TS {
        for pos0 in [0usize, 7] {
            for dm in [dims(4, 2, 64), dims(4, 1, 5), dims(4, 4, 33), dims(2, 1, 256)] {
                attention_case(&p, &mut rng, t, pos0, 3, dm, 1.0);
            }
        }
    }
    // Long context: decode at position 700, and a prefill chunk that spans several key tiles.
    attention_case(&p, &mut rng, 1, 700, 0, dims(4, 2, 256), 1.0);
    attention_case(&p, &mut rng, 65, 640, 5, dims(4, 1, 128), 1.0);
    // Peaked softmax (large scores) over a long context.
    attention_case(&p, &mut rng, 3, 1500, 0, dims(4, 2, 128), 4.0);
}

#[test]
fn errors_are_reported() {
    let g = wgpu();
    let f = |shape: &[usize]| g.alloc(DType::F32, shape).expect("alloc");
    let u = |shape: &[usize]| g.alloc(DType::U32, shape).expect("alloc");
    let (a, b) = (f(&[2, 4]), f(&[2, 4]));
    // Elementwise: count mismatch, wrong dtype, aliasing.
    assert!(g.swiglu(&a, &b, &f(&[2, 3])).is_err());
    assert!(g.swiglu(&a, &u(&[2, 4]), &f(&[2, 4])).is_err());
    assert!(g.swiglu(&a, &b, &a).is_err());
    assert!(g.sigmoid_mul_assign(&a, &f(&[9])).is_err());
    assert!(g.sigmoid_mul_assign(&a, &a).is_err());
    assert!(g.sigmoid_scale_add(&a, &b, &f(&[3, 1])).is_err());
    assert!(g.sigmoid_scale_add(&a, &a, &f(&[2, 1])).is_err());
    assert!(g.split_qgate(&f(&[2, 6]), 4, &f(&[2, 3]), &f(&[2, 3])).is_err());
    assert!(g.split_qgate(&f(&[2, 8]), 0, &a, &b).is_err());
    assert!(g.split_qgate(&f(&[2, 8]), 2, &a, &a).is_err());
    assert!(g.argmax(&a, &f(&[2])).is_err());
    assert!(g.argmax(&a, &u(&[3])).is_err());
    assert!(g.argmax(&f(&[2, 0]), &u(&[2])).is_err());
    let (ga, gb) = (f(&[3, 4]), f(&[3, 4]));
    assert!(g
        .gdn_gates(&ga, &gb, &f(&[5]), &f(&[4]), &f(&[3, 4]), &f(&[3, 4]))
        .is_err());
    assert!(g.gdn_gates(&ga, &gb, &f(&[4]), &f(&[4]), &ga, &f(&[3, 4])).is_err());
    let go = f(&[3, 4]);
    assert!(g.gdn_gates(&ga, &gb, &f(&[4]), &f(&[4]), &go, &go).is_err());
    // Norms.
    assert!(g.rms_norm(&a, &f(&[3]), 1e-6, &b).is_err());
    assert!(g.rms_norm(&a, &f(&[4]), 1e-6, &a).is_err());
    assert!(g.rms_norm(&a, &u(&[4]), 1e-6, &b).is_err());
    assert!(g.gated_rms_norm(&a, &f(&[2, 2]), &f(&[4]), 1e-6, &b).is_err());
    let dims = GdnDims {
        hk: 2,
        hv: 4,
        dk: 8,
        dv: 8,
    };
    assert!(g.l2_norm_qk(&f(&[2, 63]), dims, 1e-6).is_err());
    assert!(g.l2_norm_qk(&u(&[2, 64]), dims, 1e-6).is_err());
    // Conv: tap count, state size, too wide a kernel, aliasing.
    let x = f(&[3, 5]);
    assert!(g.conv1d_causal_silu(&x, &f(&[4, 4]), &f(&[3, 5]), &f(&[3, 5])).is_err());
    assert!(g.conv1d_causal_silu(&x, &f(&[5, 4]), &f(&[2, 5]), &f(&[3, 5])).is_err());
    assert!(g
        .conv1d_causal_silu(&x, &f(&[5, 17]), &f(&[16, 5]), &f(&[3, 5]))
        .is_err());
    let st = f(&[3, 5]);
    assert!(g.conv1d_causal_silu(&x, &f(&[5, 4]), &st, &st).is_err());
    assert!(g.conv1d_causal_silu(&x, &f(&[5, 4]), &f(&[3, 5]), &x).is_err());
    // RoPE: partial heads, odd n_rot, n_rot > head_dim.
    let p0 = g.upload_u32(&[0], &[1]).expect("pos");
    let p4 = g.upload_u32(&[4], &[1]).expect("pos");
    let at0 = Pos { host: 0, dev: &p0 };
    let at4 = Pos { host: 4, dev: &p4 };
    assert!(g.rope_neox(&f(&[2, 10]), 4, 4, 1e4, at0).is_err());
    assert!(g.rope_neox(&f(&[2, 8]), 4, 3, 1e4, at0).is_err());
    assert!(g.rope_neox(&f(&[2, 8]), 4, 6, 1e4, at0).is_err());
    // Attention: bad dims, past the cache, head_dim over the kernel's bound, aliasing.
    let ad = |n_head, n_head_kv, head_dim| AttnDims {
        n_head,
        n_head_kv,
        head_dim,
    };
    let (q, kc, vc) = (f(&[2, 16]), f(&[5, 8]), f(&[5, 8]));
    assert!(g.attention(&q, &kc, &vc, at0, ad(4, 3, 4), 0.5, &f(&[2, 16])).is_err());
    assert!(g.attention(&q, &kc, &vc, at4, ad(4, 2, 4), 0.5, &f(&[2, 16])).is_err());
    assert!(g
        .attention(&q, &kc, &f(&[4, 8]), at0, ad(4, 2, 4), 0.5, &f(&[2, 16]))
        .is_err());
    assert!(g.attention(&q, &kc, &vc, at0, ad(4, 2, 4), 0.5, &f(&[2, 15])).is_err());
    assert!(g.attention(&q, &kc, &vc, at0, ad(4, 2, 4), 0.5, &q).is_err());
    assert!(g
        .attention(
            &f(&[1, 512]),
            &f(&[2, 512]),
            &f(&[2, 512]),
            at0,
            ad(1, 1, 512),
            0.5,
            &f(&[1, 512])
        )
        .is_err());
    // The backend still works after the refusals.
    let ok = g.upload_f32(&[1.0, 2.0], &[2]).expect("up");
    let out = f(&[2]);
    g.swiglu(&ok, &ok, &out).expect("swiglu after errors");
    g.sync().expect("sync");
}

// ---- fused ops (one dispatch each on wgpu; the CPU backend composes the plain ops) ----

#[test]
fn add_rms_norm_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(20);
    for t in TS {
        for (width, d) in [(7usize, 7usize), (2048, 2048), (5 * 256, 256)] {
            let acc = p.up(&rng.normals(t * width, 2.0), &[t, width]);
            let x = p.up(&rng.normals(t * width, 1.0), &[t, width]);
            let w = p.up(&rng.normals(d, 1.0), &[d]);
            let out = p.zeros(&[t, width]);
            p.g.add_rms_norm(&acc.0, &x.0, &w.0, 1e-6, &out.0)
                .expect("wgpu add_rms_norm");
            p.c.add_rms_norm(&acc.1, &x.1, &w.1, 1e-6, &out.1)
                .expect("cpu add_rms_norm");
            // The residual add is one f32 addition on both sides: identical.
            p.check(&format!("add_rms_norm acc t={t} width={width}"), &acc, 0.0, 0.0);
            p.check(&format!("add_rms_norm out t={t} width={width} d={d}"), &out, 1e-6, 1e-5);
        }
    }
    let f = |shape: &[usize]| p.g.alloc(DType::F32, shape).expect("alloc");
    let (a, w) = (f(&[2, 4]), f(&[4]));
    assert!(
        p.g.add_rms_norm(&a, &a, &w, 1e-6, &f(&[2, 4])).is_err(),
        "x aliases acc"
    );
    assert!(
        p.g.add_rms_norm(&a, &f(&[2, 4]), &w, 1e-6, &a).is_err(),
        "out aliases acc"
    );
    assert!(
        p.g.add_rms_norm(&a, &f(&[2, 4]), &f(&[3]), 1e-6, &f(&[2, 4])).is_err(),
        "w size"
    );
}

#[test]
fn conv1d_silu_l2qk_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(21);
    for dims in GDN_DIMS {
        let c = dims.conv_dim();
        for k in [4usize, 2] {
            let w = p.up(&rng.normals(c * k, 0.5), &[c, k]);
            for t in TS {
                let state = p.up(&rng.normals((k - 1) * c, 1.0), &[k - 1, c]);
                let x = p.up(&rng.normals(t * c, 1.0), &[t, c]);
                let out = p.zeros(&[t, c]);
                p.g.conv1d_silu_l2qk(&x.0, &w.0, &state.0, &out.0, dims, 1e-6)
                    .expect("wgpu conv1d_silu_l2qk");
                p.c.conv1d_silu_l2qk(&x.1, &w.1, &state.1, &out.1, dims, 1e-6)
                    .expect("cpu conv1d_silu_l2qk");
                // The conv's tolerance plus the L2 norm's (conv1d_matches, l2_norm_qk_matches).
                p.check(&format!("conv1d_silu_l2qk out t={t} k={k} {dims:?}"), &out, 2e-6, 3e-5);
                p.check(
                    &format!("conv1d_silu_l2qk state t={t} k={k} {dims:?}"),
                    &state,
                    0.0,
                    0.0,
                );
            }
        }
    }
    let big = GdnDims {
        hk: 1,
        hv: 1,
        dk: 256,
        dv: 4,
    };
    let f = |shape: &[usize]| p.g.alloc(DType::F32, shape).expect("alloc");
    let c = big.conv_dim();
    assert!(
        p.g.conv1d_silu_l2qk(&f(&[1, c]), &f(&[c, 4]), &f(&[3, c]), &f(&[1, c]), big, 1e-6)
            .is_err(),
        "dk over the fused kernel's bound"
    );
}

#[test]
fn kv_store_matches() {
    let p = Pair::new();
    let mut rng = Rng::new(22);
    let (ctx, w) = (70usize, 96usize);
    for (t, pos0) in [(1usize, 0usize), (1, 69), (3, 5), (65, 2)] {
        let kc = p.up(&rng.normals(ctx * w, 1.0), &[ctx, w]);
        let vc = p.up(&rng.normals(ctx * w, 1.0), &[ctx, w]);
        let k = p.up(&rng.normals(t * w, 1.0), &[t, w]);
        let v = p.up(&rng.normals(t * w, 1.0), &[t, w]);
        let (pg, pc) = (
            p.g.upload_u32(&[pos0 as u32], &[1]).expect("pos"),
            p.c.upload_u32(&[pos0 as u32], &[1]).expect("pos"),
        );
        p.g.kv_store(&k.0, &v.0, &kc.0, &vc.0, Pos { host: pos0, dev: &pg })
            .expect("wgpu kv_store");
        p.c.kv_store(&k.1, &v.1, &kc.1, &vc.1, Pos { host: pos0, dev: &pc })
            .expect("cpu kv_store");
        p.check(&format!("k cache t={t} pos={pos0}"), &kc, 0.0, 0.0);
        p.check(&format!("v cache t={t} pos={pos0}"), &vc, 0.0, 0.0);
    }
    let f = |shape: &[usize]| p.g.alloc(DType::F32, shape).expect("alloc");
    let p0 = p.g.upload_u32(&[69], &[1]).expect("pos");
    let at = Pos { host: 69, dev: &p0 };
    assert!(
        p.g.kv_store(&f(&[2, w]), &f(&[2, w]), &f(&[ctx, w]), &f(&[ctx, w]), at)
            .is_err(),
        "past the cache"
    );
    let kc = f(&[ctx, w]);
    let p1 = p.g.upload_u32(&[0], &[1]).expect("pos");
    let at0 = Pos { host: 0, dev: &p1 };
    assert!(
        p.g.kv_store(&f(&[1, w]), &f(&[1, w]), &kc, &kc, at0).is_err(),
        "caches alias"
    );
}

/// A decode-like step recorded once (`step_begin` -> Record) and replayed at later positions
/// with new token ids: every replay equals the CPU running the ops at that position. The step
/// reads its inputs only through the token id and position tensors, like the executor's.
#[test]
fn recorded_step_replays_at_new_positions() {
    use rill::backend::StepMode;
    let p = Pair::new();
    let mut rng = Rng::new(23);
    let (vocab, nh, d, ctx) = (11usize, 2usize, 64usize, 8usize);
    let dims = AttnDims {
        n_head: nh,
        n_head_kv: 1,
        head_dim: d,
    };
    let table = p.up(&rng.normals(vocab * nh * d, 1.0), &[vocab, nh * d]);
    let norm_w = p.up(&rng.normals(d, 1.0), &[d]);
    let kv_w = p.up(&rng.normals(d * nh * d, 0.1), &[d, nh * d]);
    let ids = (
        p.g.alloc(DType::U32, &[1]).expect("ids"),
        p.c.alloc(DType::U32, &[1]).expect("ids"),
    );
    let pos = (
        p.g.alloc(DType::U32, &[1]).expect("pos"),
        p.c.alloc(DType::U32, &[1]).expect("pos"),
    );
    let kc = p.zeros(&[ctx, d]);
    let vc = p.zeros(&[ctx, d]);
    let x = p.zeros(&[1, nh * d]);
    let xn = p.zeros(&[1, nh * d]);
    let kv = p.zeros(&[1, d]);
    let att = p.zeros(&[1, nh * d]);
    let ops = |be: &dyn Backend, i: usize, at: Pos| {
        let pick = |t: &(Tensor, Tensor)| if i == 0 { t.0.clone() } else { t.1.clone() };
        let (ids, table, x, xn, nw, kvw, kv, kc, vc, att) = (
            pick(&ids),
            pick(&table),
            pick(&x),
            pick(&xn),
            pick(&norm_w),
            pick(&kv_w),
            pick(&kv),
            pick(&kc),
            pick(&vc),
            pick(&att),
        );
        be.embed(&table, &ids, &x).expect("embed");
        be.rms_norm(&x, &nw, 1e-6, &xn).expect("norm");
        be.rope_neox(&xn, d, d / 2, 1e4, at).expect("rope");
        be.matmul(&kvw, &xn, &kv).expect("kv proj");
        be.kv_store(&kv, &kv, &kc, &vc, at).expect("kv_store");
        be.attention(&xn, &kc, &vc, at, dims, 0.125, &att).expect("attention");
    };
    let key = 0x5eed;
    let mut replays = 0;
    for step in 0..ctx {
        let token = (step * 7 + 3) as u32 % vocab as u32;
        for (i, be) in [p.g.as_ref(), p.c.as_ref()].into_iter().enumerate() {
            let (idt, post) = if i == 0 { (&ids.0, &pos.0) } else { (&ids.1, &pos.1) };
            be.write_u32(idt, &[token]).expect("ids");
            be.write_u32(post, &[step as u32]).expect("pos");
            let at = Pos { host: step, dev: post };
            let mode = be.step_begin(key).expect("step_begin");
            if i == 0 {
                // Later steps replay, unless a test running beside this one replaced a scratch
                // buffer the recording binds (the recording is then dropped and made again).
                match (step, mode) {
                    (0, StepMode::Record) => {}
                    (0, m) => panic!("first wgpu step: {m:?}"),
                    (_, StepMode::Replayed) => replays += 1,
                    (_, StepMode::Record) => {}
                    (_, m) => panic!("wgpu step {step}: {m:?}"),
                }
            }
            if mode != StepMode::Replayed {
                ops(be, i, at);
            }
            be.step_end(key, true).expect("step_end");
        }
        p.check(&format!("replayed attention at step {step}"), &att, 5e-6, 1e-4);
        p.check(&format!("replayed k cache at step {step}"), &kc, 1e-6, 1e-5);
    }
    assert!(replays >= 1, "none of {} steps was replayed", ctx - 1);
    // A step that failed is not kept: the next call records again.
    p.g.step_begin(key + 1).expect("step_begin");
    p.g.step_end(key + 1, false).expect("step_end");
    assert_eq!(p.g.step_begin(key + 1).expect("step_begin"), StepMode::Record);
    p.g.step_end(key + 1, false).expect("step_end");
}
