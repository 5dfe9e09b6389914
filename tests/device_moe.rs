//! Every device backend's MoE ops (`moe_route`, `moe_experts`) against the CPU backend.

mod common;

use std::sync::Arc;

use common::*;
use rill::backend::{Backend, DType, Tensor, WeightData};
use rill::gguf::{GgmlType, TensorBytes};

/// Route `logits` `[t, e]` on both backends; ids must match exactly, weights to `1e-5` relative.
fn route_case(g: &dyn Backend, c: &dyn Backend, logits: &[f32], t: usize, e: usize, k: usize, scale: f32) {
    let what = format!("moe_route t={t} e={e} k={k} scale={scale}");
    let run = |be: &dyn Backend| {
        let l = up(be, logits, &[t, e]);
        let ids = be.alloc(DType::U32, &[t, k]).expect("alloc");
        let w = be.alloc(DType::F32, &[t, k]).expect("alloc");
        be.moe_route(&l, k, scale, &ids, &w)
            .unwrap_or_else(|err| panic!("{what}: {err}"));
        (be.read_u32(&ids).expect("read"), be.read_f32(&w).expect("read"))
    };
    let (gi, gw) = run(g);
    let (ci, cw) = run(c);
    assert_eq!(gi, ci, "{what}: ids");
    assert_close(&format!("{what}: weights"), &gw, &cw, 0.0, 1e-5);
}

#[test]
fn route_matches_cpu() {
    for (_, dev) in devices() {
        route_matches_cpu_on(&dev);
    }
}

fn route_matches_cpu_on(dev: &Arc<dyn Backend>) {
    let (g, c) = (Arc::clone(dev), cpu());
    let mut rng = Rng::new(11);
    for &(t, e, k) in &[
        (1usize, 8usize, 2usize),
        (3, 8, 8),
        (65, 64, 8),
        (3, 64, 2),
        (1, 512, 8),
        (65, 512, 16),
        (3, 300, 1),
        (2, 2048, 16),
    ] {
        let logits = rng.normals(t * e, 3.0);
        route_case(g.as_ref(), c.as_ref(), &logits, t, e, k, 1.0);
        route_case(g.as_ref(), c.as_ref(), &logits, t, e, k, 2.5);
    }
}

#[test]
fn route_ties_go_to_lower_index() {
    for (_, dev) in devices() {
        route_ties_go_to_lower_index_on(&dev);
    }
}

fn route_ties_go_to_lower_index_on(dev: &Arc<dyn Backend>) {
    let (g, c) = (Arc::clone(dev), cpu());
    let mut rng = Rng::new(12);
    for &(t, e, k) in &[(65usize, 64usize, 8usize), (3, 8, 8), (3, 512, 16), (1, 600, 16)] {
        // Few distinct values: many exact ties.
        let mut logits: Vec<f32> = rng
            .normals(t * e, 1.0)
            .iter()
            .map(|v| (v * 2.0).round() / 2.0)
            .collect();
        // One row entirely equal, one with ties at the top across thread strides.
        logits[..e].fill(0.25);
        if t > 1 {
            let row = &mut logits[e..2 * e];
            row.fill(-1.0);
            for i in [e - 1, 0, e / 2, 257 % e, 1] {
                row[i] = 4.0;
            }
        }
        route_case(g.as_ref(), c.as_ref(), &logits, t, e, k, 1.0);
    }
    // Masked experts (-inf logits, probability 0): with fewer finite logits than k the zeros are
    // taken by lower index.
    let e = 64;
    let mut logits = rng.normals(2 * e, 1.0);
    for (i, v) in logits.iter_mut().enumerate() {
        if i % 64 >= 3 && i % 5 != 0 {
            *v = f32::NEG_INFINITY;
        }
    }
    route_case(g.as_ref(), c.as_ref(), &logits, 2, e, 16, 1.0);
    // All equal: the first k experts, each weight scale / k.
    let l = g.upload_f32(&[0.5; 16], &[1, 16]).expect("up");
    let ids = g.alloc(DType::U32, &[1, 4]).expect("alloc");
    let w = g.alloc(DType::F32, &[1, 4]).expect("alloc");
    g.moe_route(&l, 4, 2.0, &ids, &w).expect("route");
    assert_eq!(g.read_u32(&ids).expect("read"), [0, 1, 2, 3]);
    assert_close("equal weights", &g.read_f32(&w).expect("read"), &[0.5; 4], 0.0, 1e-6);
}

#[test]
fn route_errors() {
    for (_, dev) in devices() {
        route_errors_on(&dev);
    }
}

fn route_errors_on(dev: &Arc<dyn Backend>) {
    let g = Arc::clone(dev);
    let c = cpu();
    let l = g.upload_f32(&[0.0; 16], &[2, 8]).expect("up");
    let ids = g.alloc(DType::U32, &[2, 2]).expect("alloc");
    let w = g.alloc(DType::F32, &[2, 2]).expect("alloc");
    assert!(g.moe_route(&l, 2, 1.0, &ids, &w).is_ok());
    assert!(g.moe_route(&l, 0, 1.0, &ids, &w).is_err(), "k = 0");
    let ids9 = g.alloc(DType::U32, &[2, 9]).expect("alloc");
    let w9 = g.alloc(DType::F32, &[2, 9]).expect("alloc");
    assert!(g.moe_route(&l, 9, 1.0, &ids9, &w9).is_err(), "k > E");
    let big = g.upload_f32(&vec![0.0; 2 * 32], &[2, 32]).expect("up");
    let ids17 = g.alloc(DType::U32, &[2, 17]).expect("alloc");
    let w17 = g.alloc(DType::F32, &[2, 17]).expect("alloc");
    // wgpu keeps at most 16 picks per token in registers; cuda has no such bound.
    assert_eq!(
        g.moe_route(&big, 17, 1.0, &ids17, &w17).is_err(),
        g.name() == "wgpu",
        "k = 17"
    );
    assert!(g.moe_route(&l, 2, 1.0, &w, &w).is_err(), "ids must be U32");
    assert!(g.moe_route(&l, 2, 1.0, &ids, &ids).is_err(), "weights must be F32");
    let ids_short = g.alloc(DType::U32, &[3]).expect("alloc");
    assert!(g.moe_route(&l, 2, 1.0, &ids_short, &w).is_err(), "ids size");
    let w_short = g.alloc(DType::F32, &[2, 3]).expect("alloc");
    assert!(g.moe_route(&l, 2, 1.0, &ids, &w_short).is_err(), "weights size");
    let ul = g.alloc(DType::U32, &[2, 8]).expect("alloc");
    assert!(g.moe_route(&ul, 2, 1.0, &ids, &w).is_err(), "logits must be F32");
    // Aliasing: weights sharing the logits buffer.
    let w_alias = Tensor {
        buf: Arc::clone(&l.buf),
        dtype: DType::F32,
        shape: vec![2, 2],
    };
    assert!(g.moe_route(&l, 2, 1.0, &ids, &w_alias).is_err(), "weights alias logits");
    // A tensor of another backend.
    let cl = c.upload_f32(&[0.0; 16], &[2, 8]).expect("up");
    assert!(g.moe_route(&cl, 2, 1.0, &ids, &w).is_err(), "cpu tensor");
    // Too many experts for the workgroup arrays (2048 on wgpu, 9830 on cuda).
    let huge = g
        .alloc(DType::F32, &[1, if g.name() == "cuda" { 16384 } else { 4096 }])
        .expect("alloc");
    let (i1, w1) = (
        g.alloc(DType::U32, &[1, 2]).expect("alloc"),
        g.alloc(DType::F32, &[1, 2]).expect("alloc"),
    );
    assert!(g.moe_route(&huge, 2, 1.0, &i1, &w1).is_err(), "E over the bound");
}

/// An expert weight `[e, rows, cols]` of type `ty` on both backends, plus its dequantized values.
struct Weight {
    g: Tensor,
    c: Tensor,
    deq: Vec<f32>,
}

fn weight(
    g: &dyn Backend,
    c: &dyn Backend,
    rng: &mut Rng,
    ty: Option<GgmlType>,
    shape: [usize; 3],
    scale: f32,
) -> Weight {
    let vals = rng.normals(shape.iter().product(), scale);
    let Some(ty) = ty else {
        // Plain F32 tensors are weights too.
        return Weight {
            g: up(g, &vals, &shape),
            c: up(c, &vals, &shape),
            deq: vals,
        };
    };
    let rows = shape[0] * shape[1];
    let row_bytes = ty.row_size(shape[2] as u64).expect("row size") as usize;
    let mut bytes = vec![0u8; rows * row_bytes];
    rill::quant::quantize_rows_par(ty, &vals, shape[2], &mut bytes).expect("quantize");
    let mut deq = vec![0f32; vals.len()];
    rill::quant::dequantize(ty, &bytes, &mut deq).expect("dequantize");
    let wd = WeightData {
        name: "exps".into(),
        ggml_type: ty,
        shape: shape.to_vec(),
        bytes: TensorBytes::from_vec(bytes),
    };
    Weight {
        g: g.upload_weight(&wd).expect("upload"),
        c: c.upload_weight(&wd).expect("upload"),
        deq,
    }
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// `Σ_j |w_j| Σ_f |down_e[o][f] · h_j[f]|` per output: the magnitude of the terms of `out[t][o]`.
#[allow(clippy::too_many_arguments)]
fn term_bound(
    x: &[f32],
    gate: &[f32],
    upw: &[f32],
    down: &[f32],
    ids: &[u32],
    ws: &[f32],
    d: usize,
    n_ff: usize,
    k: usize,
) -> Vec<f32> {
    let t_len = x.len() / d;
    let mut bound = vec![0f32; t_len * d];
    let mut h = vec![0f64; n_ff];
    for t in 0..t_len {
        let xt = &x[t * d..(t + 1) * d];
        for j in 0..k {
            let e = ids[t * k + j] as usize;
            let w = ws[t * k + j].abs() as f64;
            for (f, hf) in h.iter_mut().enumerate() {
                let row = (e * n_ff + f) * d;
                let dot =
                    |m: &[f32]| -> f64 { m[row..row + d].iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum() };
                *hf = silu(dot(gate)) * dot(upw);
            }
            for o in 0..d {
                let row = (e * d + o) * n_ff;
                let s: f64 = down[row..row + n_ff]
                    .iter()
                    .zip(&h)
                    .map(|(&a, b)| (a as f64 * b).abs())
                    .sum();
                bound[t * d + o] += (w * s) as f32;
            }
        }
    }
    bound
}

/// `moe_experts` on random inputs with CPU-routed ids/weights; `|gpu - cpu| <= 1e-4 Σ|terms|`.
fn experts_case(ty: Option<GgmlType>, n_exp: usize, k: usize, d: usize, n_ff: usize, t_len: usize) {
    for (_, dev) in devices() {
        experts_case_on(&dev, ty, n_exp, k, d, n_ff, t_len);
    }
}

fn experts_case_on(
    dev: &Arc<dyn Backend>,
    ty: Option<GgmlType>,
    n_exp: usize,
    k: usize,
    d: usize,
    n_ff: usize,
    t_len: usize,
) {
    let what = format!(
        "{}: moe_experts {ty:?} E={n_exp} k={k} d={d} n_ff={n_ff} T={t_len}",
        dev.name()
    );
    let (g, c) = (Arc::clone(dev), cpu());
    let (g, c) = (g.as_ref(), c.as_ref());
    let mut rng = Rng::new((n_exp * 31 + k * 7 + d + n_ff * 3 + t_len) as u64);
    let gate = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 1.0 / (d as f32).sqrt());
    let upw = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 1.0 / (d as f32).sqrt());
    let down = weight(g, c, &mut rng, ty, [n_exp, d, n_ff], 1.0 / (n_ff as f32).sqrt());
    let x = rng.normals(t_len * d, 1.0);
    let logits = rng.normals(t_len * n_exp, 2.0);
    // Route on the CPU; both backends get the same ids and weights.
    let cl = up(c, &logits, &[t_len, n_exp]);
    let cids = c.alloc(DType::U32, &[t_len, k]).expect("alloc");
    let cw = c.alloc(DType::F32, &[t_len, k]).expect("alloc");
    c.moe_route(&cl, k, 1.0, &cids, &cw).expect("cpu route");
    let ids = c.read_u32(&cids).expect("read");
    let ws = c.read_f32(&cw).expect("read");

    let run = |be: &dyn Backend, gw: &Tensor, uw: &Tensor, dw: &Tensor| {
        let xt = up(be, &x, &[t_len, d]);
        let it = be.upload_u32(&ids, &[t_len, k]).expect("up");
        let wt = up(be, &ws, &[t_len, k]);
        let out = be.alloc(DType::F32, &[t_len, d]).expect("alloc");
        be.moe_experts(&xt, gw, uw, dw, &it, &wt, &out)
            .unwrap_or_else(|err| panic!("{what}: {}: {err}", be.name()));
        be.read_f32(&out).expect("read")
    };
    let got = run(g, &gate.g, &upw.g, &down.g);
    let want = run(c, &gate.c, &upw.c, &down.c);
    let bound = term_bound(&x, &gate.deq, &upw.deq, &down.deq, &ids, &ws, d, n_ff, k);
    let mut worst = (0usize, 0f32);
    for (i, ((&gv, &cv), &b)) in got.iter().zip(&want).zip(&bound).enumerate() {
        assert!(gv.is_finite(), "{what}[{i}]: {gv}");
        let r = (gv - cv).abs() / b.max(f32::MIN_POSITIVE);
        if r > worst.1 {
            worst = (i, r);
        }
    }
    let i = worst.0;
    eprintln!("{what}: worst error {:.3e} of Σ|terms|", worst.1);
    assert!(
        worst.1 <= 1e-4,
        "{what}[{i}]: got {} want {} (error {:.3e} of Σ|terms| {})",
        got[i],
        want[i],
        worst.1,
        bound[i]
    );
}

/// (E, k, d, n_ff, T) covering every value of each parameter.
const CASES: &[(usize, usize, usize, usize, usize)] = &[
    (8, 2, 64, 64, 1),
    (8, 8, 64, 512, 3),
    (64, 2, 256, 64, 65),
    (64, 8, 64, 64, 3),
    (8, 2, 256, 512, 65),
    (64, 8, 256, 512, 65),
];

#[test]
fn experts_f32_match_cpu() {
    for &(e, k, d, n_ff, t) in CASES {
        experts_case(Some(GgmlType::F32), e, k, d, n_ff, t);
    }
    // A plain F32 tensor as the expert weights.
    experts_case(None, 8, 2, 64, 64, 3);
}

#[test]
fn experts_f16_match_cpu() {
    for &(e, k, d, n_ff, t) in CASES {
        experts_case(Some(GgmlType::F16), e, k, d, n_ff, t);
    }
}

#[test]
fn experts_q8_0_match_cpu() {
    for &(e, k, d, n_ff, t) in CASES {
        experts_case(Some(GgmlType::Q8_0), e, k, d, n_ff, t);
    }
}

/// K-quants need rows of whole 256-element blocks: d = 256, n_ff = 512.
#[test]
fn experts_q4_k_match_cpu() {
    for &(e, k, d, n_ff, t) in CASES.iter().filter(|c| c.2 % 256 == 0 && c.3 % 256 == 0) {
        experts_case(Some(GgmlType::Q4K), e, k, d, n_ff, t);
    }
}

/// The other formats through the same path (small shapes).
#[test]
fn experts_other_formats_match_cpu() {
    use GgmlType::*;
    for ty in [Bf16, Q4_0, Q4_1, Q5_0, Q5_1] {
        experts_case(Some(ty), 8, 2, 64, 64, 3);
    }
    for ty in [Q5K, Q6K] {
        experts_case(Some(ty), 8, 2, 256, 256, 3);
    }
}

/// End to end: GPU routing feeding the GPU experts equals the CPU pipeline.
#[test]
fn route_then_experts() {
    for (_, dev) in devices() {
        route_then_experts_on(&dev);
    }
}

fn route_then_experts_on(dev: &Arc<dyn Backend>) {
    let (g, c) = (Arc::clone(dev), cpu());
    let (g, c) = (g.as_ref(), c.as_ref());
    let (n_exp, k, d, n_ff, t_len) = (16usize, 4usize, 64usize, 128usize, 5usize);
    let mut rng = Rng::new(21);
    let ty = Some(GgmlType::F16);
    let gate = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 0.125);
    let upw = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 0.125);
    let down = weight(g, c, &mut rng, ty, [n_exp, d, n_ff], 0.09);
    let x = rng.normals(t_len * d, 1.0);
    let logits = rng.normals(t_len * n_exp, 2.0);
    let run = |be: &dyn Backend, w: &Weight, gw: &Weight, dw: &Weight, on_gpu: bool| {
        let pick = |m: &Weight| if on_gpu { m.g.clone() } else { m.c.clone() };
        let l = up(be, &logits, &[t_len, n_exp]);
        let ids = be.alloc(DType::U32, &[t_len, k]).expect("alloc");
        let ws = be.alloc(DType::F32, &[t_len, k]).expect("alloc");
        be.moe_route(&l, k, 1.5, &ids, &ws).expect("route");
        let xt = up(be, &x, &[t_len, d]);
        let out = be.alloc(DType::F32, &[t_len, d]).expect("alloc");
        be.moe_experts(&xt, &pick(w), &pick(gw), &pick(dw), &ids, &ws, &out)
            .expect("experts");
        be.read_f32(&out).expect("read")
    };
    let got = run(g, &gate, &upw, &down, true);
    let want = run(c, &gate, &upw, &down, false);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_close("route + experts", &got, &want, 1e-5 * scale, 1e-4);
}

/// An id >= E is skipped on the GPU (never read out of bounds): the result equals the same call
/// with that slot's weight set to zero.
#[test]
fn experts_skip_invalid_ids() {
    for (_, dev) in devices() {
        experts_skip_invalid_ids_on(&dev);
    }
}

fn experts_skip_invalid_ids_on(dev: &Arc<dyn Backend>) {
    let (g, c) = (Arc::clone(dev), cpu());
    let (g, c) = (g.as_ref(), c.as_ref());
    let (n_exp, d, n_ff) = (8usize, 64usize, 64usize);
    let mut rng = Rng::new(31);
    let ty = Some(GgmlType::F32);
    let gate = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 0.125);
    let upw = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 0.125);
    let down = weight(g, c, &mut rng, ty, [n_exp, d, n_ff], 0.125);
    let x = rng.normals(2 * d, 1.0);
    let xt = up(g, &x, &[2, d]);
    let call = |ids: &[u32], ws: &[f32]| {
        let it = g.upload_u32(ids, &[2, 3]).expect("up");
        let wt = up(g, ws, &[2, 3]);
        let out = g.alloc(DType::F32, &[2, d]).expect("alloc");
        g.moe_experts(&xt, &gate.g, &upw.g, &down.g, &it, &wt, &out)
            .expect("experts");
        g.read_f32(&out).expect("read")
    };
    let bad = call(&[3, 8, 5, 0xffff_ffff, 1, 1_000_000], &[0.5, 0.7, 0.25, 0.3, 0.6, 0.2]);
    let ok = call(&[3, 0, 5, 0, 1, 0], &[0.5, 0.0, 0.25, 0.0, 0.6, 0.0]);
    assert_close("invalid ids skipped", &bad, &ok, 1e-6, 1e-5);
    // And the CPU agrees on the valid part.
    let cit = c.upload_u32(&[3, 0, 5, 0, 1, 0], &[2, 3]).expect("up");
    let cwt = up(c, &[0.5, 0.0, 0.25, 0.0, 0.6, 0.0], &[2, 3]);
    let cout = c.alloc(DType::F32, &[2, d]).expect("alloc");
    c.moe_experts(&up(c, &x, &[2, d]), &gate.c, &upw.c, &down.c, &cit, &cwt, &cout)
        .expect("cpu");
    assert_close("valid part", &ok, &c.read_f32(&cout).expect("read"), 1e-5, 1e-4);
}

#[test]
fn experts_errors() {
    for (_, dev) in devices() {
        experts_errors_on(&dev);
    }
}

fn experts_errors_on(dev: &Arc<dyn Backend>) {
    let (g, c) = (Arc::clone(dev), cpu());
    let (g, c) = (g.as_ref(), c.as_ref());
    let (n_exp, d, n_ff) = (4usize, 32usize, 64usize);
    let mut rng = Rng::new(41);
    let ty = Some(GgmlType::F16);
    let gate = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 0.1);
    let upw = weight(g, c, &mut rng, ty, [n_exp, n_ff, d], 0.1);
    let down = weight(g, c, &mut rng, ty, [n_exp, d, n_ff], 0.1);
    let x = up(g, &rng.normals(2 * d, 1.0), &[2, d]);
    let ids = g.upload_u32(&[0, 1, 2, 3], &[2, 2]).expect("up");
    let ws = up(g, &[0.5; 4], &[2, 2]);
    let out = g.alloc(DType::F32, &[2, d]).expect("alloc");
    let (gw, uw, dw) = (&gate.g, &upw.g, &down.g);
    assert!(g.moe_experts(&x, gw, uw, dw, &ids, &ws, &out).is_ok());
    // Shapes.
    assert!(g.moe_experts(&x, gw, uw, gw, &ids, &ws, &out).is_err(), "down shape");
    assert!(g.moe_experts(&x, gw, dw, dw, &ids, &ws, &out).is_err(), "up shape");
    let x_bad = g.alloc(DType::F32, &[2, d + 1]).expect("alloc");
    assert!(g.moe_experts(&x_bad, gw, uw, dw, &ids, &ws, &out).is_err(), "x width");
    let ids3 = g.upload_u32(&[0, 1, 2], &[3]).expect("up");
    assert!(g.moe_experts(&x, gw, uw, dw, &ids3, &ws, &out).is_err(), "ids count");
    let ws3 = up(g, &[0.5; 6], &[2, 3]);
    assert!(
        g.moe_experts(&x, gw, uw, dw, &ids, &ws3, &out).is_err(),
        "weights count"
    );
    let out_bad = g.alloc(DType::F32, &[2, d - 1]).expect("alloc");
    assert!(g.moe_experts(&x, gw, uw, dw, &ids, &ws, &out_bad).is_err(), "out size");
    let flat = g.alloc(DType::F32, &[n_exp * n_ff, d]).expect("alloc");
    assert!(
        g.moe_experts(&x, &flat, &flat, dw, &ids, &ws, &out).is_err(),
        "2-D experts"
    );
    // Dtypes.
    assert!(
        g.moe_experts(&x, gw, uw, dw, &ws, &ws, &out).is_err(),
        "ids must be U32"
    );
    assert!(
        g.moe_experts(&x, gw, uw, dw, &ids, &ids, &out).is_err(),
        "weights must be F32"
    );
    let xu = g.alloc(DType::U32, &[2, d]).expect("alloc");
    assert!(
        g.moe_experts(&xu, gw, uw, dw, &ids, &ws, &out).is_err(),
        "x must be F32"
    );
    assert!(g.moe_experts(&x, gw, &ids, dw, &ids, &ws, &out).is_err(), "U32 weight");
    // More than 16 experts per token: a wgpu bound (cuda sums any number).
    let ids17 = g.upload_u32(&[0; 34], &[2, 17]).expect("up");
    let ws17 = up(g, &[0.1; 34], &[2, 17]);
    assert_eq!(
        g.moe_experts(&x, gw, uw, dw, &ids17, &ws17, &out).is_err(),
        g.name() == "wgpu",
        "k = 17"
    );
    // Aliasing: out is x.
    assert!(g.moe_experts(&x, gw, uw, dw, &ids, &ws, &x).is_err(), "out aliases x");
    // A weight format without a WGSL dequantizer.
    let q81 = WeightData {
        name: "q8_1".into(),
        ggml_type: GgmlType::Q8_1,
        shape: vec![n_exp, n_ff, d],
        bytes: TensorBytes::from_vec(vec![0u8; n_exp * n_ff * 36]),
    };
    let q = g.upload_weight(&q81).expect("upload");
    assert!(
        g.moe_experts(&x, &q, &q, dw, &ids, &ws, &out).is_err(),
        "unsupported type"
    );
    // Tensors of another backend.
    assert!(
        g.moe_experts(&x, &gate.c, &upw.c, &down.c, &ids, &ws, &out).is_err(),
        "cpu weights"
    );
}
