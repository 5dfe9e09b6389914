//! Every device backend's memory, elementwise, norm, conv, RoPE, KV-cache, attention and argmax
//! ops against the CPU reference backend, on random inputs with odd sizes, plus the error cases
//! of the op contract (on every backend, the CPU's too).
//!
//! Tolerances follow from f32 rounding: elementwise kernels differ from the CPU only in the
//! device's exp/sqrt (a few ulp) and in FMA contraction, hence ~1e-5 relative; reductions (norms,
//! attention) add the rounding of a differently ordered sum of n terms, bounded by ~n·2^-24 in
//! the worst case and ~sqrt(n)·2^-24 typically, hence up to 1e-4 relative for the sizes here.
//! Copies (split, conv state, KV cache) and single additions are bit-exact.

mod common;

use common::device::{pos_on, Both, Side, Steps, GDN_ODD, GDN_REAL};
use common::*;
use rill::backend::compose;
use rill::backend::{AttnDims, DType, GdnDims, Pos, NON_FINITE};

const TS: [usize; 4] = [1, 3, 64, 65];

#[test]
fn memory_ops_and_reads() {
    for p in Both::each() {
        let g = p.dev.as_ref();
        let mut rng = Rng::new(1);
        for n in [1usize, 255, 256, 257, 100_000] {
            let (a, b) = (p.up(&rng.normals(n, 1.0), &[n]), p.up(&rng.normals(n, 1.0), &[n]));
            p.run("add_assign", |be, s| be.add_assign(a.on(s), b.on(s)));
            // One correctly rounded f32 addition per element.
            p.check(&format!("add_assign n={n}"), &a, 0.0, 0.0);
            // The awaitable reads return what the blocking ones do.
            let (got, _) = p.read(&a);
            assert_eq!(pollster::block_on(g.read_f32_async(&a.dev)).expect("async read"), got);
        }
        // zero, copy, copy_rows, write_u32.
        let t = g.upload_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).expect("up");
        let d = g.alloc(DType::F32, &[2, 2]).expect("alloc");
        g.copy_rows(&t, 1, &d, 0, 2).expect("copy_rows");
        assert_eq!(g.read_f32(&d).expect("read"), [3.0, 4.0, 5.0, 6.0]);
        g.zero(&t).expect("zero");
        assert_eq!(g.read_f32(&t).expect("read"), [0.0; 6]);
        let u = g.alloc(DType::U32, &[3]).expect("alloc");
        g.write_u32(&u, &[7, 8, 9]).expect("write");
        assert_eq!(g.read_u32(&u).expect("read"), [7, 8, 9]);
        assert_eq!(pollster::block_on(g.read_u32_async(&u)).expect("async read"), [7, 8, 9]);
        let e = g.alloc(DType::F32, &[2, 2]).expect("alloc");
        g.copy(&d, &e).expect("copy");
        assert_eq!(g.read_f32(&e).expect("read"), [3.0, 4.0, 5.0, 6.0]);
        assert!(g.add_assign(&e, &t).is_err(), "shape mismatch must be an error");
    }
}

#[test]
fn swiglu_and_sigmoid_ops() {
    for p in Both::each() {
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
            p.run("swiglu", |be, s| be.swiglu(g.on(s), u.on(s), out.on(s)));
            p.check(&format!("swiglu n={n}"), &out, 1e-6, 1e-5);

            let x = p.up(&upv, &[n]);
            p.run("sigmoid_mul_assign", |be, s| be.sigmoid_mul_assign(x.on(s), g.on(s)));
            p.check(&format!("sigmoid_mul_assign n={n}"), &x, 1e-6, 1e-5);
        }
        // Token rows (the decode shape runs one block per row on CUDA).
        for (t, d) in [(1usize, 4096usize), (3, 513), (4, 2048), (5, 300)] {
            let gate = rng.normals(t * d, 4.0);
            let g = p.up(&gate, &[t, d]);
            let x = p.up(&rng.normals(t * d, 1.0), &[t, d]);
            p.run("sigmoid_mul_assign", |be, s| be.sigmoid_mul_assign(x.on(s), g.on(s)));
            p.check(&format!("sigmoid_mul_assign t={t} d={d}"), &x, 1e-6, 1e-5);
        }
        for t in TS {
            for d in [1usize, 37, 2048] {
                let acc = p.up(&rng.normals(t * d, 1.0), &[t, d]);
                let x = p.up(&rng.normals(t * d, 1.0), &[t, d]);
                let gl = p.up(&rng.normals(t, 3.0), &[t, 1]);
                p.run("sigmoid_scale_add", |be, s| {
                    be.sigmoid_scale_add(acc.on(s), x.on(s), gl.on(s))
                });
                p.check(&format!("sigmoid_scale_add t={t} d={d}"), &acc, 1e-6, 1e-5);
            }
        }
    }
}

#[test]
fn split_qgate_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(12);
        for t in TS {
            for (h, d) in [(1usize, 1usize), (3, 5), (4, 256)] {
                let qg = p.up(&rng.normals(t * 2 * h * d, 1.0), &[t, 2 * h * d]);
                let (q, gate) = (p.zeros(&[t, h * d]), p.zeros(&[t, h * d]));
                p.run("split_qgate", |be, s| be.split_qgate(qg.on(s), d, q.on(s), gate.on(s)));
                // A pure copy: bit-exact.
                p.check(&format!("split_qgate q t={t} h={h} d={d}"), &q, 0.0, 0.0);
                p.check(&format!("split_qgate gate t={t} h={h} d={d}"), &gate, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn gdn_gates_matches() {
    for p in Both::each() {
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
                let ssm_a: Vec<f32> = (0..hv).map(|_| -rng.uniform() as f32 * 8.0 - 0.01).collect();
                let dt = rng.normals(hv, 1.0);
                let (a, b) = (p.up(&a, &[t, hv]), p.up(&b, &[t, hv]));
                let (sa, dt) = (p.up(&ssm_a, &[hv]), p.up(&dt, &[hv]));
                let (g, beta) = (p.zeros(&[t, hv]), p.zeros(&[t, hv]));
                p.run("gdn_gates", |be, s| {
                    be.gdn_gates(a.on(s), b.on(s), sa.on(s), dt.on(s), g.on(s), beta.on(s))
                });
                // Relative, down to the tiny softplus values of very negative inputs.
                p.check(&format!("gdn_gates g t={t} hv={hv}"), &g, 1e-30, 1e-5);
                p.check(&format!("gdn_gates beta t={t} hv={hv}"), &beta, 1e-7, 1e-5);
            }
        }
    }
}

/// Argmax of `data` `[t, v]` on both backends, (device, CPU).
fn argmax_of(p: &Both, data: &[f32], t: usize, v: usize) -> (Vec<u32>, Vec<u32>) {
    let l = p.up(data, &[t, v]);
    let out = p.zeros_u32(&[t]);
    p.run("argmax", |be, s| be.argmax(l.on(s), out.on(s)));
    p.read_u32(&out)
}

#[test]
fn argmax_matches() {
    for p in Both::each() {
        let name = p.name();
        let mut rng = Rng::new(14);
        // Random rows, including the real vocabulary size.
        for (t, v) in [(1usize, 1usize), (3, 5), (64, 300), (65, 1000), (3, 248_320)] {
            let data = rng.normals(t * v, 3.0);
            let (g, c) = argmax_of(&p, &data, t, v);
            assert_eq!(g, c, "{name} argmax t={t} v={v}");
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
        assert_eq!(g, c, "{name} argmax special rows");
    }
}

/// Rows around the length where a device may split a row into chunks scanned by separate
/// workgroups (wgpu: 4096 values, then a combine pass): the winner, a tie or the only allowed value
/// on either side of a chunk boundary, in the last partial chunk, and odd lengths.
#[test]
fn argmax_chunk_edges() {
    const CHUNK: usize = 4096;
    for p in Both::each() {
        let name = p.name();
        let mut rng = Rng::new(15);
        // Random rows of lengths near 1, 2 and 3 chunks, many rows at once.
        for (t, v) in [
            (5usize, CHUNK - 1),
            (5, CHUNK),
            (65, CHUNK + 1),
            (3, 2 * CHUNK - 1),
            (3, 3 * CHUNK + 7),
        ] {
            let data = rng.normals(t * v, 3.0);
            let (g, c) = argmax_of(&p, &data, t, v);
            assert_eq!(g, c, "{name} argmax t={t} v={v}");
        }
        // One case per row of an odd length with a partial last chunk.
        let v = 3 * CHUNK + 5;
        let nan = f32::NAN;
        let base = rng.normals(v, 1.0);
        let with = |changes: &[(usize, f32)]| {
            let mut r = base.clone();
            for &(i, x) in changes {
                r[i] = x;
            }
            r
        };
        let only = |fill: f32, i: usize, x: f32| {
            let mut r = vec![fill; v];
            r[i] = x;
            r
        };
        let rows = [
            with(&[(CHUNK - 1, 50.0), (CHUNK, 50.0)]),     // tie across a boundary: 4095
            with(&[(CHUNK, 50.0), (2 * CHUNK, 50.0)]),     // tie of chunk starts: 4096
            with(&[(v - 1, 50.0), (3 * CHUNK, 50.0)]),     // tie in the partial chunk: 12288
            with(&[(2 * CHUNK - 1, 50.0), (v - 1, 51.0)]), // winner is the very last value
            with(&[(CHUNK - 1, nan), (CHUNK, f32::INFINITY)]), // +inf after a NaN: 4096
            only(nan, v - 1, -1e30),                       // the only number, last: v-1
            only(f32::NEG_INFINITY, CHUNK, -3.0),          // the only number, a chunk start
            only(nan, 2 * CHUNK - 1, f32::NEG_INFINITY),   // NaN and one -inf: NON_FINITE
            (0..v).map(|i| if i < CHUNK { nan } else { 1.0 }).collect(), // first chunk all NaN: 4096
        ];
        let t = rows.len();
        let data: Vec<f32> = rows.concat();
        let (g, c) = argmax_of(&p, &data, t, v);
        let last = (v - 1) as u32;
        let expect = [4095, 4096, 12_288, last, 4096, last, 4096, NON_FINITE, 4096];
        assert_eq!(c, expect, "cpu reference");
        assert_eq!(g, c, "{name} argmax chunk edges");
    }
}

/// Whole-row norms of odd and real widths, and per-head norms (w of one head): (width, group).
// 4100: a decode-sized row whose last round of four elements per invocation (wgpu) is partial.
const NORM_SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (7, 7),
    (257, 257),
    (2048, 2048),
    (4100, 4100),
    (3 * 128, 128),
    (5 * 256, 256),
];

#[test]
fn rms_norms_match() {
    for p in Both::each() {
        let mut rng = Rng::new(15);
        for t in TS {
            for (width, d) in NORM_SHAPES {
                let x = p.up(&rng.normals(t * width, 2.0), &[t, width]);
                let w = p.up(&rng.normals(d, 1.0), &[d]);
                let out = p.zeros(&[t, width]);
                p.run("rms_norm", |be, s| be.rms_norm(x.on(s), w.on(s), 1e-6, out.on(s)));
                p.check(&format!("rms_norm t={t} width={width} d={d}"), &out, 1e-6, 1e-5);

                let z = p.up(&rng.normals(t * width, 2.0), &[t, width]);
                let out = p.zeros(&[t, width]);
                p.run("gated_rms_norm", |be, s| {
                    be.gated_rms_norm(x.on(s), z.on(s), w.on(s), 1e-6, out.on(s))
                });
                p.check(&format!("gated_rms_norm t={t} width={width} d={d}"), &out, 1e-6, 1e-5);

                // The residual add and the next norm in one op: the add is one f32 addition per
                // element (bit-exact), the norm the rms_norm above.
                let acc = p.up(&rng.normals(t * width, 2.0), &[t, width]);
                let out = p.zeros(&[t, width]);
                p.run("add_rms_norm", |be, s| {
                    compose::add_rms_norm(be, acc.on(s), z.on(s), w.on(s), 1e-6, out.on(s))
                });
                p.check(&format!("add_rms_norm acc t={t} width={width} d={d}"), &acc, 0.0, 0.0);
                p.check(&format!("add_rms_norm out t={t} width={width} d={d}"), &out, 1e-6, 1e-5);
            }
        }
        // A zero group: eps keeps the result finite (0).
        let x = p.up(&[0.0; 8], &[2, 4]);
        let w = p.up(&[1.0; 4], &[4]);
        let out = p.zeros(&[2, 4]);
        p.run("rms_norm", |be, s| be.rms_norm(x.on(s), w.on(s), 1e-6, out.on(s)));
        assert_eq!(p.read(&out).0, [0.0; 8], "{}", p.name());
    }
}

#[test]
fn l2_norm_qk_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(16);
        for dims in [GDN_REAL, GDN_ODD] {
            for t in TS {
                let cd = dims.conv_dim();
                let data = rng.normals(t * cd, 1.5);
                let u = p.up(&data, &[t, cd]);
                p.run("l2_norm_qk", |be, s| be.l2_norm_qk(u.on(s), dims, 1e-6));
                p.check(&format!("l2_norm_qk t={t} {dims:?}"), &u, 1e-7, 2e-5);
                // v is left bit-exact.
                let got = p.read(&u).0;
                let kd2 = 2 * dims.key_dim();
                for r in 0..t {
                    assert_eq!(
                        got[r * cd + kd2..(r + 1) * cd],
                        data[r * cd + kd2..(r + 1) * cd],
                        "{} v of row {r}",
                        p.name()
                    );
                }
            }
        }
    }
}

/// (channels, taps) of the conv tests.
const CONV_SHAPES: [(usize, usize); 5] = [(37, 4), (1024, 4), (5, 2), (3, 1), (9, 7)];

#[test]
fn conv1d_matches_and_carries_state() {
    for p in Both::each() {
        let g = p.dev.as_ref();
        let mut rng = Rng::new(17);
        let conv = |x: &[f32], c: usize, w: &common::device::Pt, state: &common::device::Pt| {
            let t = x.len() / c;
            let (x, out) = (p.up(x, &[t, c]), p.zeros(&[t, c]));
            p.run("conv1d_causal_silu", |be, s| {
                be.conv1d_causal_silu(x.on(s), w.on(s), state.on(s), out.on(s))
            });
            out
        };
        for (c, k) in CONV_SHAPES {
            let w = p.up(&rng.normals(c * k, 0.5), &[c, k]);
            for t in TS {
                let state = p.up(&rng.normals((k - 1) * c, 1.0), &[k - 1, c]);
                let out = conv(&rng.normals(t * c, 1.0), c, &w, &state);
                p.check(&format!("conv out c={c} k={k} t={t}"), &out, 1e-6, 1e-5);
                p.check(&format!("conv state c={c} k={k} t={t}"), &state, 0.0, 0.0);
            }
            // State across calls: T=2 then T=1 against the CPU doing the same.
            let s0 = rng.normals((k - 1) * c, 1.0);
            let state = p.up(&s0, &[k - 1, c]);
            for t in [2usize, 1] {
                let out = conv(&rng.normals(t * c, 1.0), c, &w, &state);
                p.check(&format!("conv chained out c={c} k={k} t={t}"), &out, 1e-6, 1e-5);
                p.check(&format!("conv chained state c={c} k={k} t={t}"), &state, 0.0, 0.0);
            }
            // T=1 three times equals T=3 once (on the device).
            let x3 = rng.normals(3 * c, 1.0);
            let s_once = g.upload_f32(&s0, &[k - 1, c]).expect("up");
            let s_steps = g.upload_f32(&s0, &[k - 1, c]).expect("up");
            let out3 = g.alloc(DType::F32, &[3, c]).expect("alloc");
            let xg = g.upload_f32(&x3, &[3, c]).expect("up");
            g.conv1d_causal_silu(&xg, &w.dev, &s_once, &out3).expect("conv T=3");
            let mut stepped = Vec::new();
            for r in 0..3 {
                let xr = g.upload_f32(&x3[r * c..(r + 1) * c], &[1, c]).expect("up");
                let o = g.alloc(DType::F32, &[1, c]).expect("alloc");
                g.conv1d_causal_silu(&xr, &w.dev, &s_steps, &o).expect("conv T=1");
                stepped.extend(g.read_f32(&o).expect("read"));
            }
            let name = p.name();
            assert_eq!(
                stepped,
                g.read_f32(&out3).expect("read"),
                "{name} conv T=1 x3 vs T=3, c={c} k={k}"
            );
            assert_eq!(
                g.read_f32(&s_steps).expect("read"),
                g.read_f32(&s_once).expect("read"),
                "{name} conv state, c={c} k={k}"
            );
        }
    }
}

/// The fused conv + q/k normalisation of the Gated DeltaNet layer.
#[test]
fn conv1d_silu_l2qk_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(23);
        for (dims, k) in [(GDN_REAL, 4usize), (GDN_ODD, 4), (GDN_ODD, 1)] {
            let cd = dims.conv_dim();
            let w = p.up(&rng.normals(cd * k, 0.5), &[cd, k]);
            let state = p.up(&rng.normals((k - 1) * cd, 1.0), &[k - 1, cd]);
            // T=65 then T=1: the state carries from a prefill to a decode step.
            for t in [1usize, 3, 64, 65, 1] {
                let what = format!("conv1d_silu_l2qk t={t} k={k} {dims:?}");
                let x = p.up(&rng.normals(t * cd, 1.0), &[t, cd]);
                let out = p.zeros(&[t, cd]);
                p.run(&what, |be, s| {
                    compose::conv1d_silu_l2qk(be, x.on(s), w.on(s), state.on(s), out.on(s), dims, 1e-6)
                });
                p.check(&format!("{what} state"), &state, 0.0, 0.0);
                p.check_conv_l2qk(&what, &out, dims, t);
            }
        }
    }
}

#[test]
fn rope_neox_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(18);
        // (heads, head_dim, n_rot): Qwen3.5 full attention (256, partial rotary 64), full rotation,
        // odd head count, and a head of one pair.
        let shapes = [(4usize, 256usize, 64usize), (3, 128, 128), (1, 6, 2), (2, 8, 0)];
        for (nh, d, n_rot) in shapes {
            for theta in [10_000.0f32, 10_000_000.0] {
                for (t, pos0) in [(1usize, 0usize), (3, 5), (64, 100), (65, 0), (1, 1000), (3, 4093)] {
                    let x = rng.normals(t * nh * d, 1.0);
                    let xs = p.up(&x, &[t, nh * d]);
                    let pt = p.pos(pos0);
                    p.run("rope", |be, s| {
                        be.rope_neox(xs.on(s), d, n_rot, theta, pos_on(pos0, &pt, s))
                    });
                    // Error model (see rope_neox.wgsl): the f32 angle is off by a few ulp of the
                    // position (measured up to 2.5 * pos * 2^-24 rad, bounded here by 4x), which
                    // moves a rotated pair (a, b) by that angle times |(a, b)|; plus ~2e-6 relative for
                    // sin/cos and the products. At pos 4096 that is ~5e-4 * |(a, b)|.
                    let (got, want) = p.read(&xs);
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
                                    "{} rope nh={nh} d={d} n_rot={n_rot} theta={theta} pos={pos} i={i}: {} vs {} (tol {tol})",
                                    p.name(),
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
}

#[test]
fn kv_store_writes_rows_at_the_position() {
    for p in Both::each() {
        let mut rng = Rng::new(20);
        for t in TS {
            for (pos, spare) in [(0usize, 0usize), (5, 3), (100, 1)] {
                for width in [1usize, 37, 512] {
                    let ctx = pos + t + spare;
                    // Caches full of old rows: only rows pos..pos+T may change.
                    let (k0, v0) = (rng.normals(ctx * width, 1.0), rng.normals(ctx * width, 1.0));
                    let (kc, vc) = (p.up(&k0, &[ctx, width]), p.up(&v0, &[ctx, width]));
                    let (kn, vn) = (rng.normals(t * width, 1.0), rng.normals(t * width, 1.0));
                    let (k, v) = (p.up(&kn, &[t, width]), p.up(&vn, &[t, width]));
                    let pt = p.pos(pos);
                    p.run("kv_store", |be, s| {
                        be.kv_store(k.on(s), v.on(s), kc.on(s), vc.on(s), pos_on(pos, &pt, s))
                    });
                    for (what, cache, old, new) in [("k", &kc, k0, &kn), ("v", &vc, v0, &vn)] {
                        let mut want = old;
                        want[pos * width..(pos + t) * width].copy_from_slice(new);
                        let (got, cpu) = p.read(cache);
                        let what = format!("{} kv_store {what} t={t} pos={pos} width={width}", p.name());
                        assert_eq!(cpu, want, "cpu {what}");
                        assert_eq!(got, want, "{what}");
                    }
                }
            }
        }
    }
}

/// Caches of `ctx` rows with random contents (rows past pos0+T must not matter).
#[allow(clippy::too_many_arguments)]
fn attention_case(p: &Both, rng: &mut Rng, t: usize, pos0: usize, extra: usize, dims: AttnDims, q_scale: f32) {
    attention_run(p, rng, t, pos0, extra, dims, q_scale, false);
}

/// `attention_case`, or with `gated` the gated attention (`attention_gated`: the output times the
/// sigmoid of a random gate).
#[allow(clippy::too_many_arguments)]
fn attention_run(
    p: &Both,
    rng: &mut Rng,
    t: usize,
    pos0: usize,
    extra: usize,
    dims: AttnDims,
    q_scale: f32,
    gated: bool,
) {
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
    let pt = p.pos(pos0);
    let gate = p.up(&rng.normals(t * nh * d, 2.0), &[t, nh * d]);
    p.run("attention", |be, s| {
        let at = pos_on(pos0, &pt, s);
        if gated {
            compose::attention_gated(be, q.on(s), k.on(s), v.on(s), at, dims, scale, gate.on(s), out.on(s))
        } else {
            be.attention(q.on(s), k.on(s), v.on(s), at, dims, scale, out.on(s))
        }
    });
    // Outputs are convex combinations of N(0,1) values, so the rounding of the n-term sums is
    // absolute, ~sqrt(n) * 2^-24 * max|v| (measured <= 7e-7): 5e-6 covers outputs that cancel to
    // near 0, 1e-4 relative the rest (scores, exp and the online rescaling each add a few ulp).
    // The fast tier's flash attention rounds q, k, v and the probabilities to f16.
    p.check_tier(
        &format!("attention t={t} pos0={pos0} ctx={ctx} {dims:?} q*{q_scale} gated {gated}"),
        &out,
        5e-6,
        1e-4,
    );
}

fn attn(n_head: usize, n_head_kv: usize, head_dim: usize) -> AttnDims {
    AttnDims {
        n_head,
        n_head_kv,
        head_dim,
    }
}

#[test]
fn attention_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(19);
        for t in TS {
            for pos0 in [0usize, 7] {
                for dm in [attn(4, 2, 64), attn(4, 1, 5), attn(4, 4, 33), attn(2, 1, 256)] {
                    attention_case(&p, &mut rng, t, pos0, 3, dm, 1.0);
                }
            }
        }
        // Long context: decode at position 700, and a prefill chunk that spans several key tiles.
        attention_case(&p, &mut rng, 1, 700, 0, attn(4, 2, 256), 1.0);
        attention_case(&p, &mut rng, 65, 640, 5, attn(4, 1, 128), 1.0);
        // Qwen3.5's head dim 256 (the fast tier's flash attention) over prompt-sized batches:
        // partial query and key tiles, several of each, GQA 4:1, after earlier rows.
        for (t, pos0) in [(63usize, 0usize), (64, 64), (200, 37), (1000, 0)] {
            attention_case(&p, &mut rng, t, pos0, 2, attn(4, 1, 256), 1.0);
        }
        // Peaked softmax (large scores) over a long context.
        attention_case(&p, &mut rng, 3, 1500, 0, attn(4, 2, 128), 4.0);
        // Prefill batches (wgpu: the tiled kernel, blocks of 32 query rows of one KV head):
        // Qwen3.5 9B's 16 heads over 4 KV heads after earlier rows, just past the split path's
        // 256 rows, query groups of 3 and 8 heads whose blocks straddle tokens, peaked scores.
        attention_case(&p, &mut rng, 80, 45, 3, attn(16, 4, 256), 1.0);
        attention_case(&p, &mut rng, 257, 0, 1, attn(1, 1, 64), 1.0);
        attention_case(&p, &mut rng, 100, 5, 4, attn(6, 2, 33), 1.0);
        attention_case(&p, &mut rng, 40, 130, 0, attn(16, 2, 128), 1.0);
        attention_case(&p, &mut rng, 100, 300, 0, attn(4, 2, 128), 4.0);
    }
}

/// The gated attention (`attention_gated`): the decode shapes, where the wgpu backend applies the
/// gate (and with the packed-dot products writes the output's planes, tests/device_linear.rs) in
/// the dispatch that merges the split key range, head dims that are and are not whole 32-element
/// blocks; and a batch of more query rows than that path takes (the composition).
#[test]
fn attention_gated_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(23);
        for t in [1usize, 3] {
            for dm in [attn(4, 2, 64), attn(4, 4, 33), attn(2, 1, 256), attn(16, 4, 256)] {
                attention_run(&p, &mut rng, t, 9, 3, dm, 1.0, true);
            }
        }
        attention_run(&p, &mut rng, 1, 700, 0, attn(4, 2, 256), 1.0, true);
        attention_run(&p, &mut rng, 65, 0, 2, attn(8, 2, 64), 1.0, true);
        attention_run(&p, &mut rng, 70, 20, 2, attn(16, 4, 256), 1.0, true);
    }
}

/// The rules of `backend/check.rs`: every backend refuses the same malformed calls.
#[test]
fn contract_errors_are_reported() {
    for be in common::backends() {
        let g = be.as_ref();
        let name = g.name();
        let f = |shape: &[usize]| g.alloc(DType::F32, shape).expect("alloc");
        let u = |shape: &[usize]| g.alloc(DType::U32, shape).expect("alloc");
        let (a, b) = (f(&[2, 4]), f(&[2, 4]));
        // Elementwise: count mismatch, wrong dtype, aliasing.
        let refused = |r: rill::Result<()>, what: &str| assert!(r.is_err(), "{name}: {what} must be refused");
        refused(g.swiglu(&a, &b, &f(&[2, 3])), "swiglu count");
        refused(g.swiglu(&a, &u(&[2, 4]), &f(&[2, 4])), "swiglu dtype");
        refused(g.swiglu(&a, &b, &a), "swiglu alias");
        refused(g.sigmoid_mul_assign(&a, &f(&[9])), "sigmoid_mul_assign count");
        refused(g.sigmoid_mul_assign(&a, &a), "sigmoid_mul_assign alias");
        refused(g.sigmoid_scale_add(&a, &b, &f(&[3, 1])), "sigmoid_scale_add rows");
        refused(g.sigmoid_scale_add(&a, &a, &f(&[2, 1])), "sigmoid_scale_add alias");
        refused(g.add_assign(&a, &f(&[9])), "add_assign count");
        refused(g.add_assign(&a, &a), "add_assign alias");
        refused(
            g.split_qgate(&f(&[2, 6]), 4, &f(&[2, 3]), &f(&[2, 3])),
            "split_qgate heads",
        );
        refused(g.split_qgate(&f(&[2, 8]), 0, &a, &b), "split_qgate head_dim 0");
        refused(g.split_qgate(&f(&[2, 8]), 2, &a, &a), "split_qgate alias");
        refused(g.argmax(&a, &f(&[2])), "argmax F32 out");
        refused(g.argmax(&a, &u(&[3])), "argmax count");
        refused(g.argmax(&f(&[2, 0]), &u(&[2])), "argmax empty rows");
        let (ga, gb) = (f(&[3, 4]), f(&[3, 4]));
        refused(
            g.gdn_gates(&ga, &gb, &f(&[5]), &f(&[4]), &f(&[3, 4]), &f(&[3, 4])),
            "gdn_gates heads",
        );
        refused(
            g.gdn_gates(&ga, &gb, &f(&[4]), &f(&[4]), &ga, &f(&[3, 4])),
            "gdn_gates alias in",
        );
        let go = f(&[3, 4]);
        refused(
            g.gdn_gates(&ga, &gb, &f(&[4]), &f(&[4]), &go, &go),
            "gdn_gates alias out",
        );
        // Norms.
        refused(g.rms_norm(&a, &f(&[3]), 1e-6, &b), "rms_norm groups");
        refused(g.rms_norm(&a, &f(&[4]), 1e-6, &a), "rms_norm alias");
        refused(g.rms_norm(&a, &u(&[4]), 1e-6, &b), "rms_norm U32 w");
        refused(
            g.gated_rms_norm(&a, &f(&[2, 2]), &f(&[4]), 1e-6, &b),
            "gated_rms_norm z",
        );
        refused(
            compose::add_rms_norm(g, &a, &f(&[9]), &f(&[4]), 1e-6, &b),
            "add_rms_norm count",
        );
        refused(
            compose::add_rms_norm(g, &a, &b, &f(&[3]), 1e-6, &f(&[2, 4])),
            "add_rms_norm groups",
        );
        refused(
            compose::add_rms_norm(g, &a, &b, &f(&[4]), 1e-6, &a),
            "add_rms_norm out is acc",
        );
        refused(
            compose::add_rms_norm(g, &a, &b, &f(&[4]), 1e-6, &b),
            "add_rms_norm out is x",
        );
        let dims = GdnDims {
            hk: 2,
            hv: 4,
            dk: 8,
            dv: 8,
        };
        refused(g.l2_norm_qk(&f(&[2, 63]), dims, 1e-6), "l2_norm_qk width");
        refused(g.l2_norm_qk(&u(&[2, 64]), dims, 1e-6), "l2_norm_qk dtype");
        // Conv: tap count, state size, aliasing (plain and fused with the q/k norm).
        let x = f(&[3, 5]);
        refused(
            g.conv1d_causal_silu(&x, &f(&[4, 4]), &f(&[3, 5]), &f(&[3, 5])),
            "conv taps",
        );
        refused(
            g.conv1d_causal_silu(&x, &f(&[5, 4]), &f(&[2, 5]), &f(&[3, 5])),
            "conv state",
        );
        let st = f(&[3, 5]);
        refused(g.conv1d_causal_silu(&x, &f(&[5, 4]), &st, &st), "conv out is state");
        refused(g.conv1d_causal_silu(&x, &f(&[5, 4]), &f(&[3, 5]), &x), "conv out is x");
        let xc = f(&[3, 64]);
        refused(
            compose::conv1d_silu_l2qk(g, &xc, &f(&[64, 4]), &f(&[2, 64]), &f(&[3, 64]), dims, 1e-6),
            "conv_l2qk state",
        );
        refused(
            compose::conv1d_silu_l2qk(g, &xc, &f(&[64, 4]), &f(&[3, 64]), &xc, dims, 1e-6),
            "conv_l2qk alias",
        );
        let odd = GdnDims { dk: 7, ..dims };
        refused(
            compose::conv1d_silu_l2qk(g, &xc, &f(&[64, 4]), &f(&[3, 64]), &f(&[3, 64]), odd, 1e-6),
            "conv_l2qk dims",
        );
        // RoPE: partial heads, odd n_rot, n_rot > head_dim, a position tensor that is not U32 [1].
        let p0 = g.upload_u32(&[0], &[1]).expect("pos");
        let p4 = g.upload_u32(&[4], &[1]).expect("pos");
        let at0 = Pos { host: 0, dev: &p0 };
        let at4 = Pos { host: 4, dev: &p4 };
        refused(g.rope_neox(&f(&[2, 10]), 4, 4, 1e4, at0), "rope heads");
        refused(g.rope_neox(&f(&[2, 8]), 4, 3, 1e4, at0), "rope odd n_rot");
        refused(g.rope_neox(&f(&[2, 8]), 4, 6, 1e4, at0), "rope n_rot > head_dim");
        let pf = f(&[1]);
        let p2 = u(&[2]);
        refused(
            g.rope_neox(&f(&[2, 8]), 4, 4, 1e4, Pos { host: 0, dev: &pf }),
            "rope F32 pos",
        );
        refused(
            g.rope_neox(&f(&[2, 8]), 4, 4, 1e4, Pos { host: 0, dev: &p2 }),
            "rope pos [2]",
        );
        // KV store: past the cache, row widths, rows of k and v, aliasing.
        let (k2, v2, kc, vc) = (f(&[2, 8]), f(&[2, 8]), f(&[5, 8]), f(&[5, 8]));
        g.kv_store(&k2, &v2, &kc, &vc, at0).expect("kv_store");
        refused(g.kv_store(&k2, &v2, &kc, &vc, at4), "kv_store past the cache");
        refused(g.kv_store(&k2, &f(&[2, 7]), &kc, &vc, at0), "kv_store v width");
        refused(g.kv_store(&k2, &f(&[3, 8]), &kc, &vc, at0), "kv_store v rows");
        refused(g.kv_store(&k2, &v2, &kc, &kc, at0), "kv_store one cache for both");
        let p3 = g.upload_u32(&[3], &[1]).expect("pos");
        let at3 = Pos { host: 3, dev: &p3 };
        g.kv_store(&k2, &v2, &kc, &vc, at3).expect("kv_store at the end");
        refused(g.kv_store(&k2, &v2, &kc, &f(&[4, 8]), at3), "kv_store v cache rows");
        refused(
            g.kv_store(&k2, &v2, &kc, &vc, Pos { host: 0, dev: &pf }),
            "kv_store F32 pos",
        );
        // Attention: bad dims, past the cache, cache rows, out size, aliasing.
        let (q, kc, vc) = (f(&[2, 16]), f(&[5, 8]), f(&[5, 8]));
        refused(
            g.attention(&q, &kc, &vc, at0, attn(4, 3, 4), 0.5, &f(&[2, 16])),
            "attention heads",
        );
        refused(
            g.attention(&q, &kc, &vc, at4, attn(4, 2, 4), 0.5, &f(&[2, 16])),
            "attention past the cache",
        );
        refused(
            g.attention(&q, &kc, &f(&[4, 8]), at0, attn(4, 2, 4), 0.5, &f(&[2, 16])),
            "attention v rows",
        );
        refused(
            g.attention(&q, &kc, &vc, at0, attn(4, 2, 4), 0.5, &f(&[2, 15])),
            "attention out",
        );
        refused(
            g.attention(&q, &kc, &vc, at0, attn(4, 2, 4), 0.5, &q),
            "attention alias",
        );
        // The gated attention: attention's rules, and a gate shaped like out, not out itself.
        let out = f(&[2, 16]);
        refused(
            compose::attention_gated(g, &q, &kc, &vc, at4, attn(4, 2, 4), 0.5, &f(&[2, 16]), &out),
            "attention_gated past the cache",
        );
        refused(
            compose::attention_gated(g, &q, &kc, &vc, at0, attn(4, 2, 4), 0.5, &f(&[2, 15]), &out),
            "attention_gated gate size",
        );
        refused(
            compose::attention_gated(g, &q, &kc, &vc, at0, attn(4, 2, 4), 0.5, &out, &out),
            "attention_gated gate aliases out",
        );
        // The backend still works after the refusals.
        let ok = g.upload_f32(&[1.0, 2.0], &[2]).expect("up");
        let out = f(&[2]);
        g.swiglu(&ok, &ok, &out).expect("swiglu after errors");
        g.sync().expect("sync");
    }
}

/// Sizes past the limits of some backend's kernels (the wgpu backend's: conv kernels of up to
/// 16 taps, head_dim up to 256): refused, or computed as the CPU does.
#[test]
fn kernel_limits_refuse_or_compute() {
    for p in Both::each() {
        let mut rng = Rng::new(21);
        let (t, c, k) = (3usize, 5usize, 17usize);
        let (x, w) = (
            p.up(&rng.normals(t * c, 1.0), &[t, c]),
            p.up(&rng.normals(c * k, 0.5), &[c, k]),
        );
        let (state, out) = (p.up(&rng.normals((k - 1) * c, 1.0), &[k - 1, c]), p.zeros(&[t, c]));
        if p.runs_or_refuses("conv of 17 taps", |be, s| {
            be.conv1d_causal_silu(x.on(s), w.on(s), state.on(s), out.on(s))
        }) {
            p.check("conv of 17 taps", &out, 1e-6, 1e-5);
            p.check("conv of 17 taps state", &state, 0.0, 0.0);
        }
        let d = 512;
        let (q, kc, vc) = (
            p.up(&rng.normals(d, 1.0), &[1, d]),
            p.up(&rng.normals(2 * d, 1.0), &[2, d]),
            p.up(&rng.normals(2 * d, 1.0), &[2, d]),
        );
        let (out, pt) = (p.zeros(&[1, d]), p.pos(1));
        if p.runs_or_refuses("attention head_dim 512", |be, s| {
            be.attention(
                q.on(s),
                kc.on(s),
                vc.on(s),
                pos_on(1, &pt, s),
                attn(1, 1, d),
                0.5,
                out.on(s),
            )
        }) {
            p.check("attention head_dim 512", &out, 5e-6, 1e-4);
        }
        // Still working.
        let ok = p.up(&[1.0, 2.0], &[2]);
        let out = p.zeros(&[2]);
        p.run("swiglu after refusals", |be, s| {
            be.swiglu(ok.on(s), ok.on(s), out.on(s))
        });
        p.dev.sync().expect("sync");
    }
}

/// The backend of a tensor is part of its identity: a device refuses another backend's tensors.
#[test]
fn tensors_of_another_backend_are_refused() {
    for p in Both::each() {
        let (g, c) = (p.dev.as_ref(), p.cpu.as_ref());
        let name = p.name();
        let (cx, gx) = (up(c, &[1.0; 8], &[2, 4]), up(g, &[1.0; 8], &[2, 4]));
        let gout = g.alloc(DType::F32, &[2, 4]).expect("alloc");
        assert!(g.swiglu(&cx, &gx, &gout).is_err(), "{name}: cpu input");
        assert!(g.add_assign(&gx, &cx).is_err(), "{name}: cpu operand");
        assert!(g.read_f32(&cx).is_err(), "{name}: read of a cpu tensor");
    }
}

/// A decode-like step under `step_begin`/`step_end` at every position of a small context, with
/// a new token id each time: every step equals the CPU running the ops at that position. A
/// backend that records (wgpu's replayed passes, CUDA graphs) must replay later steps, and then
/// its replays read the token id and the position only from their device tensors, as the
/// executor's steps do.
#[test]
fn recorded_step_replays_at_new_positions() {
    use rill::backend::{Backend, StepMode};
    for p in Both::each() {
        let mut rng = Rng::new(23);
        let (vocab, nh, d, ctx) = (11usize, 2usize, 64usize, 8usize);
        let dims = attn(nh, 1, d);
        let table = p.up(&rng.normals(vocab * nh * d, 1.0), &[vocab, nh * d]);
        let norm_w = p.up(&rng.normals(nh * d, 1.0), &[nh * d]);
        let kv_w = p.up(&rng.normals(d * nh * d, 0.1), &[d, nh * d]);
        let (ids, pos) = (p.zeros_u32(&[1]), p.zeros_u32(&[1]));
        let (kc, vc) = (p.zeros(&[ctx, d]), p.zeros(&[ctx, d]));
        let (x, xn, kv, att) = (
            p.zeros(&[1, nh * d]),
            p.zeros(&[1, nh * d]),
            p.zeros(&[1, d]),
            p.zeros(&[1, nh * d]),
        );
        let ops = |be: &dyn Backend, s: Side, at: Pos| -> rill::Result<()> {
            be.embed(table.on(s), ids.on(s), x.on(s))?;
            be.rms_norm(x.on(s), norm_w.on(s), 1e-6, xn.on(s))?;
            be.rope_neox(xn.on(s), d, d / 2, 1e4, at)?;
            be.matmul(kv_w.on(s), xn.on(s), kv.on(s))?;
            be.kv_store(kv.on(s), kv.on(s), kc.on(s), vc.on(s), at)?;
            be.attention(xn.on(s), kc.on(s), vc.on(s), at, dims, 0.125, att.on(s))
        };
        let (key, steps) = (0x5eed, Steps::default());
        for step in 0..ctx {
            let token = (step * 7 + 3) as u32 % vocab as u32;
            p.step(&steps, key, &ids, &[token], &pos, step, ops);
            p.check(&format!("step {step}: attention"), &att, 5e-6, 1e-4);
            p.check(&format!("step {step}: k cache"), &kc, 1e-6, 1e-5);
        }
        p.assert_replayed(&steps, ctx);
        // A step that failed is not kept: the next call with its key records again.
        let g = p.dev.as_ref();
        if g.step_begin(key + 1).expect("step_begin") == StepMode::Record {
            g.step_end(key + 1, false).expect("step_end");
            assert_eq!(
                g.step_begin(key + 1).expect("step_begin"),
                StepMode::Record,
                "{}",
                p.name()
            );
        }
        g.step_end(key + 1, false).expect("step_end");
    }
}
