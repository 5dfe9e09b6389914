//! Every device backend's MoE ops (`moe_route`, `moe_experts`, `moe_experts_shared`) against the
//! CPU backend, for every weight format; and the contract errors of those ops on every backend.

mod common;

use std::sync::Arc;

use common::device::{Both, Pt, Side};
use common::weights::{dequant, random_weight, WEIGHT_TYPES};
use common::*;
use rill::backend::compose;
use rill::backend::{AddNorm, Backend, DType, Group, MoeExperts, MoeFfn, SharedExpert, Tensor, WeightData};
use rill::gguf::{GgmlType, TensorBytes};

/// Route `logits` `[t, e]` on both backends; ids must match exactly, weights to `1e-5` relative.
fn route_case(p: &Both, logits: &[f32], t: usize, e: usize, k: usize, scale: f32) {
    let what = format!("{} moe_route t={t} e={e} k={k} scale={scale}", p.name());
    let l = p.up(logits, &[t, e]);
    let (ids, w) = (p.zeros_u32(&[t, k]), p.zeros(&[t, k]));
    p.run(&what, |be, s| be.moe_route(l.on(s), k, scale, ids.on(s), w.on(s)));
    let (gi, ci) = p.read_u32(&ids);
    assert_eq!(gi, ci, "{what}: ids");
    p.check(&format!("{what}: weights"), &w, 0.0, 1e-5);
}

#[test]
fn route_matches_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(11);
        for &(t, e, k) in &[
            (1usize, 8usize, 2usize),
            (3, 8, 8),
            (65, 64, 8),
            (64, 64, 8),
            (3, 64, 2),
            (1, 512, 8),
            (65, 512, 16),
            (3, 300, 1),
            (2, 2048, 16),
        ] {
            let logits = rng.normals(t * e, 3.0);
            route_case(&p, &logits, t, e, k, 1.0);
            route_case(&p, &logits, t, e, k, 2.5);
        }
    }
}

#[test]
fn route_ties_go_to_lower_index() {
    for p in Both::each() {
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
            route_case(&p, &logits, t, e, k, 1.0);
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
        route_case(&p, &logits, 2, e, 16, 1.0);
        // All equal: the first k experts, each weight scale / k.
        let g = p.dev.as_ref();
        let l = g.upload_f32(&[0.5; 16], &[1, 16]).expect("up");
        let ids = g.alloc(DType::U32, &[1, 4]).expect("alloc");
        let w = g.alloc(DType::F32, &[1, 4]).expect("alloc");
        g.moe_route(&l, 4, 2.0, &ids, &w).expect("route");
        assert_eq!(g.read_u32(&ids).expect("read"), [0, 1, 2, 3], "{}", p.name());
        assert_close(
            &format!("{} equal weights", p.name()),
            &g.read_f32(&w).expect("read"),
            &[0.5; 4],
            0.0,
            1e-6,
        );
    }
}

/// The rules of `backend/check.rs` for both MoE ops, on every backend.
#[test]
fn contract_errors_are_reported() {
    for be in common::backends() {
        let g = be.as_ref();
        let name = g.name();
        let refused = |r: rill::Result<()>, what: &str| assert!(r.is_err(), "{name}: {what} must be refused");
        let f = |shape: &[usize]| g.alloc(DType::F32, shape).expect("alloc");
        let u = |shape: &[usize]| g.alloc(DType::U32, shape).expect("alloc");

        // moe_route.
        let l = g.upload_f32(&[0.0; 16], &[2, 8]).expect("up");
        let (ids, w) = (u(&[2, 2]), f(&[2, 2]));
        g.moe_route(&l, 2, 1.0, &ids, &w).expect("valid route");
        refused(g.moe_route(&l, 0, 1.0, &ids, &w), "k = 0");
        refused(g.moe_route(&l, 9, 1.0, &u(&[2, 9]), &f(&[2, 9])), "k > E");
        refused(g.moe_route(&l, 2, 1.0, &w, &w), "F32 ids");
        refused(g.moe_route(&l, 2, 1.0, &ids, &ids), "U32 weights");
        refused(g.moe_route(&l, 2, 1.0, &u(&[3]), &w), "ids size");
        refused(g.moe_route(&l, 2, 1.0, &ids, &f(&[2, 3])), "weights size");
        refused(g.moe_route(&u(&[2, 8]), 2, 1.0, &ids, &w), "U32 logits");
        // Aliasing: weights sharing the logits buffer.
        let w_alias = Tensor {
            buf: Arc::clone(&l.buf),
            dtype: DType::F32,
            shape: vec![2, 2],
        };
        refused(g.moe_route(&l, 2, 1.0, &ids, &w_alias), "weights alias logits");

        // moe_experts.
        let (n_exp, d, n_ff) = (4usize, 32usize, 64usize);
        let mut rng = Rng::new(41);
        let weight = |shape: [usize; 3], rng: &mut Rng| {
            let bytes = random_weight(GgmlType::F16, shape[0] * shape[1], shape[2], 0.1, rng);
            common::weights::upload(g, GgmlType::F16, &shape, &bytes)
        };
        let gw = weight([n_exp, n_ff, d], &mut rng);
        let uw = weight([n_exp, n_ff, d], &mut rng);
        let dw = weight([n_exp, d, n_ff], &mut rng);
        let x = up(g, &rng.normals(2 * d, 1.0), &[2, d]);
        let ids = g.upload_u32(&[0, 1, 2, 3], &[2, 2]).expect("up");
        let ws = up(g, &[0.5; 4], &[2, 2]);
        let out = f(&[2, d]);
        g.moe_experts(&x, &gw, &uw, &dw, &ids, &ws, &out)
            .expect("valid experts");
        // Shapes.
        refused(g.moe_experts(&x, &gw, &uw, &gw, &ids, &ws, &out), "down shape");
        refused(g.moe_experts(&x, &gw, &dw, &dw, &ids, &ws, &out), "up shape");
        refused(
            g.moe_experts(&f(&[2, d + 1]), &gw, &uw, &dw, &ids, &ws, &out),
            "x width",
        );
        let ids3 = g.upload_u32(&[0, 1, 2], &[3]).expect("up");
        refused(g.moe_experts(&x, &gw, &uw, &dw, &ids3, &ws, &out), "ids count");
        refused(
            g.moe_experts(&x, &gw, &uw, &dw, &ids, &up(g, &[0.5; 6], &[2, 3]), &out),
            "weights count",
        );
        refused(g.moe_experts(&x, &gw, &uw, &dw, &ids, &ws, &f(&[2, d - 1])), "out size");
        let flat = f(&[n_exp * n_ff, d]);
        refused(g.moe_experts(&x, &flat, &flat, &dw, &ids, &ws, &out), "2-D experts");
        // Dtypes.
        refused(g.moe_experts(&x, &gw, &uw, &dw, &ws, &ws, &out), "F32 ids");
        refused(g.moe_experts(&x, &gw, &uw, &dw, &ids, &ids, &out), "U32 weights");
        refused(g.moe_experts(&u(&[2, d]), &gw, &uw, &dw, &ids, &ws, &out), "U32 x");
        refused(g.moe_experts(&x, &gw, &ids, &dw, &ids, &ws, &out), "U32 expert weight");
        // Aliasing: out is x.
        refused(g.moe_experts(&x, &gw, &uw, &dw, &ids, &ws, &x), "out aliases x");
        // A weight format without a kernel: refused at upload or by the op, naming it.
        let q81 = WeightData {
            name: "q8_1".into(),
            ggml_type: GgmlType::Q8_1,
            shape: vec![n_exp, n_ff, d],
            bytes: TensorBytes::from_vec(vec![0u8; n_exp * n_ff * 36]),
        };
        let err = match g.upload_weight(&q81) {
            Err(e) => e,
            Ok(q) => g
                .moe_experts(&x, &q, &q, &dw, &ids, &ws, &out)
                .expect_err("Q8_1 experts must be refused"),
        };
        assert!(err.to_string().contains("Q8_1"), "{name}: {err}");
        // Still working.
        g.moe_experts(&x, &gw, &uw, &dw, &ids, &ws, &out)
            .expect("experts after errors");
        g.sync().expect("sync");
    }
}

/// Sizes past the limits of some backend's kernels (the wgpu backend's: at most 16 experts per
/// token and 2048 experts): refused, or computed as the CPU does. And a device refuses another
/// backend's tensors.
#[test]
fn kernel_limits_and_foreign_tensors() {
    for p in Both::each() {
        let mut rng = Rng::new(43);
        for (t, e, k) in [(2usize, 32usize, 17usize), (1, 4096, 2)] {
            let what = format!("moe_route top-{k} of {e}");
            let l = p.up(&rng.normals(t * e, 2.0), &[t, e]);
            let (ids, w) = (p.zeros_u32(&[t, k]), p.zeros(&[t, k]));
            if p.runs_or_refuses(&what, |be, s| be.moe_route(l.on(s), k, 1.0, ids.on(s), w.on(s))) {
                let (gi, ci) = p.read_u32(&ids);
                assert_eq!(gi, ci, "{} {what}: ids", p.name());
                p.check(&format!("{what}: weights"), &w, 0.0, 1e-5);
            }
        }
        // 17 experts per token.
        let (n_exp, d, n_ff, t, k) = (20usize, 32usize, 64usize, 2usize, 17usize);
        let ex = Experts::new(&p, &mut rng, Some(GgmlType::F16), [n_exp, d, n_ff], [0.1; 3]);
        let x = p.up(&rng.normals(t * d, 1.0), &[t, d]);
        let idv: Vec<u32> = (0..t * k).map(|i| (i % n_exp) as u32).collect();
        let (ids, ws) = (p.up_u32(&idv, &[t, k]), p.up(&rng.normals(t * k, 0.1), &[t, k]));
        let out = p.zeros(&[t, d]);
        if p.runs_or_refuses("moe_experts k = 17", |be, s| ex.run(be, s, &x, &ids, &ws, &out)) {
            let (got, want) = p.read(&out);
            let bound = ex.term_bound(&p.read(&x).1, &idv, &p.read(&ws).1, k);
            let what = format!("{} moe_experts k = 17", p.name());
            p.judge_tier(&what, &got, &want, || check_terms(&what, &got, &want, &bound));
        }

        // Tensors of another backend.
        let g = p.dev.as_ref();
        let (ids2, w2) = (
            g.alloc(DType::U32, &[2, 2]).expect("alloc"),
            g.alloc(DType::F32, &[2, 2]).expect("alloc"),
        );
        let cl = p.cpu.upload_f32(&[0.0; 16], &[2, 8]).expect("up");
        assert!(
            g.moe_route(&cl, 2, 1.0, &ids2, &w2).is_err(),
            "{}: cpu logits",
            p.name()
        );
        let (ids2, ws2) = (p.up_u32(&[0, 1, 2, 3], &[2, 2]), p.up(&[0.5; 4], &[2, 2]));
        let x2 = p.up(&rng.normals(2 * d, 1.0), &[2, d]);
        let out2 = g.alloc(DType::F32, &[2, d]).expect("alloc");
        assert!(
            g.moe_experts(
                &x2.dev,
                &ex.gate.t.cpu,
                &ex.up.t.cpu,
                &ex.down.t.cpu,
                &ids2.dev,
                &ws2.dev,
                &out2
            )
            .is_err(),
            "{}: cpu weights",
            p.name()
        );
    }
}

/// An expert weight `[e, rows, cols]` of type `ty` (None: a plain F32 tensor) on both backends,
/// plus its dequantized values.
struct Weight {
    t: Pt,
    deq: Vec<f32>,
}

fn weight(p: &Both, rng: &mut Rng, ty: Option<GgmlType>, shape: &[usize], scale: f32) -> Weight {
    let Some(ty) = ty else {
        // Plain F32 tensors are weights too.
        let vals = rng.normals(shape.iter().product(), scale);
        return Weight {
            t: p.up(&vals, shape),
            deq: vals,
        };
    };
    let (rows, cols) = shape.split_at(shape.len() - 1);
    let bytes = random_weight(ty, rows.iter().product(), cols[0], scale, rng);
    Weight {
        t: Pt {
            dev: common::weights::upload(p.dev.as_ref(), ty, shape, &bytes),
            cpu: common::weights::upload(p.cpu.as_ref(), ty, shape, &bytes),
        },
        deq: dequant(ty, &bytes, shape.iter().product()),
    }
}

/// The three expert weights of an MoE layer, `[E, n_ff, d]` (gate, up) and `[E, d, n_ff]` (down).
struct Experts {
    gate: Weight,
    up: Weight,
    down: Weight,
    d: usize,
    n_ff: usize,
}

impl Experts {
    /// Random experts of format `ty` with standard deviations `scales` (gate, up, down).
    fn new(p: &Both, rng: &mut Rng, ty: Option<GgmlType>, dims: [usize; 3], scales: [f32; 3]) -> Experts {
        Experts::of_types(p, rng, [ty; 3], dims, scales)
    }

    /// `new` with a format per projection (gate, up, down).
    fn of_types(
        p: &Both,
        rng: &mut Rng,
        tys: [Option<GgmlType>; 3],
        [n_exp, d, n_ff]: [usize; 3],
        scales: [f32; 3],
    ) -> Experts {
        Experts {
            gate: weight(p, rng, tys[0], &[n_exp, n_ff, d], scales[0]),
            up: weight(p, rng, tys[1], &[n_exp, n_ff, d], scales[1]),
            down: weight(p, rng, tys[2], &[n_exp, d, n_ff], scales[2]),
            d,
            n_ff,
        }
    }

    /// `moe_experts` with these weights on `side`.
    fn run(&self, be: &dyn Backend, s: Side, x: &Pt, ids: &Pt, ws: &Pt, out: &Pt) -> rill::Result<()> {
        be.moe_experts(
            x.on(s),
            self.gate.t.on(s),
            self.up.t.on(s),
            self.down.t.on(s),
            ids.on(s),
            ws.on(s),
            out.on(s),
        )
    }

    /// `Σ_j |w_j| Σ_f |down_e[o][f] · h_j[f]|` per output: the magnitude of the terms of `out[t][o]`.
    fn term_bound(&self, x: &[f32], ids: &[u32], ws: &[f32], k: usize) -> Vec<f32> {
        let (d, n_ff) = (self.d, self.n_ff);
        let (gate, upw, down) = (&self.gate.deq, &self.up.deq, &self.down.deq);
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
}

/// `|device - cpu| <= 1e-4 Σ|terms|` for every output.
fn check_terms(what: &str, got: &[f32], want: &[f32], bound: &[f32]) {
    let mut worst = (0usize, 0f32);
    for (i, ((&gv, &cv), &b)) in got.iter().zip(want).zip(bound).enumerate() {
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

/// `moe_experts` on random inputs with CPU-routed ids/weights; `|device - cpu| <= 1e-4 Σ|terms|`.
fn experts_case(p: &Both, ty: Option<GgmlType>, n_exp: usize, k: usize, d: usize, n_ff: usize, t_len: usize) {
    let what = format!(
        "{} moe_experts {ty:?} E={n_exp} k={k} d={d} n_ff={n_ff} T={t_len}",
        p.name()
    );
    let mut rng = Rng::new((n_exp * 31 + k * 7 + d + n_ff * 3 + t_len) as u64);
    let (sd, sf) = (1.0 / (d as f32).sqrt(), 1.0 / (n_ff as f32).sqrt());
    let ex = Experts::new(p, &mut rng, ty, [n_exp, d, n_ff], [sd, sd, sf]);
    let x = rng.normals(t_len * d, 1.0);
    let (ids, ws) = cpu_route(p, &mut rng, t_len, n_exp, k);

    let (xt, it, wt) = (
        p.up(&x, &[t_len, d]),
        p.up_u32(&ids, &[t_len, k]),
        p.up(&ws, &[t_len, k]),
    );
    let out = p.zeros(&[t_len, d]);
    p.run(&what, |be, s| ex.run(be, s, &xt, &it, &wt, &out));
    let (got, want) = p.read(&out);
    let bound = ex.term_bound(&x, &ids, &ws, k);
    p.judge_tier(&what, &got, &want, || check_terms(&what, &got, &want, &bound));
}

/// Expert ids and weights `[t, k]` of random router logits over `n_exp` experts, routed on the CPU
/// (both backends get the same).
fn cpu_route(p: &Both, rng: &mut Rng, t: usize, n_exp: usize, k: usize) -> (Vec<u32>, Vec<f32>) {
    let c = p.cpu.as_ref();
    let cl = up(c, &rng.normals(t * n_exp, 2.0), &[t, n_exp]);
    let cids = c.alloc(DType::U32, &[t, k]).expect("alloc");
    let cw = c.alloc(DType::F32, &[t, k]).expect("alloc");
    c.moe_route(&cl, k, 1.0, &cids, &cw).expect("cpu route");
    (c.read_u32(&cids).expect("read"), c.read_f32(&cw).expect("read"))
}

/// (E, k, d, n_ff, T) covering every value of each parameter.
const CASES: &[(usize, usize, usize, usize, usize)] = &[
    (8, 2, 64, 64, 1),
    (8, 8, 64, 512, 3),
    (64, 2, 256, 64, 65),
    (64, 8, 64, 64, 3),
    (8, 2, 256, 512, 65),
    (64, 8, 256, 512, 65),
    (8, 8, 64, 64, 64),
    // Prompt-sized batches: ~25 rows per expert (the fast tier's 32-row tiles) and 100 (its
    // 128-row tiles), from few experts per token (the rows per expert are what the tiles see;
    // 64 experts and 8 per token run above).
    (16, 2, 256, 512, 200),
    (4, 2, 256, 256, 200),
    // Rows past 256 values in the gate and up projections too (wgpu: up to 256, one invocation
    // per row; longer, the matrix-vector kernel, so both modes of both kernels run).
    (8, 2, 512, 256, 3),
];

fn experts_cases(ty: GgmlType) {
    for p in Both::each() {
        // K-quants (and IQ4_XS) need rows of whole 256-element blocks.
        let whole = |c: &&(usize, usize, usize, usize, usize)| {
            let bs = ty.block_size() as usize;
            c.2.is_multiple_of(bs) && c.3.is_multiple_of(bs)
        };
        for &(e, k, d, n_ff, t) in CASES.iter().filter(whole) {
            experts_case(&p, Some(ty), e, k, d, n_ff, t);
        }
    }
}

#[test]
fn experts_f32_match_cpu() {
    experts_cases(GgmlType::F32);
    // A plain F32 tensor as the expert weights.
    for p in Both::each() {
        experts_case(&p, None, 8, 2, 64, 64, 3);
    }
}

#[test]
fn experts_f16_match_cpu() {
    experts_cases(GgmlType::F16);
}

#[test]
fn experts_q8_0_match_cpu() {
    experts_cases(GgmlType::Q8_0);
}

#[test]
fn experts_q4_k_match_cpu() {
    experts_cases(GgmlType::Q4K);
}

/// Every other format through the same path (one small shape each).
#[test]
fn experts_other_formats_match_cpu() {
    use GgmlType::*;
    for p in Both::each() {
        for ty in WEIGHT_TYPES.into_iter().filter(|t| ![F32, F16, Q8_0, Q4K].contains(t)) {
            let n = if ty.block_size() == 256 { 256 } else { 64 };
            experts_case(&p, Some(ty), 8, 2, n, n, 3);
        }
        // Q6_K rows of 2048 (its tensor-core decode kernels need n_in % 2048 == 0): the gate and
        // up products of the first, the down product of the second.
        experts_case(&p, Some(Q6K), 8, 2, 2048, 256, 3);
        experts_case(&p, Some(Q6K), 8, 2, 256, 2048, 3);
    }
}

// ---- the routed experts and the shared expert in one op (`moe_experts_shared`) ------------------

/// A shared expert: gate and up `[n_ff, d]`, down `[d, n_ff]`.
struct SharedW {
    gate: Weight,
    up: Weight,
    down: Weight,
    d: usize,
    n_ff: usize,
}

impl SharedW {
    fn new(p: &Both, rng: &mut Rng, tys: [Option<GgmlType>; 3], d: usize, n_ff: usize) -> SharedW {
        let (sd, sf) = (1.0 / (d as f32).sqrt(), 1.0 / (n_ff as f32).sqrt());
        SharedW {
            gate: weight(p, rng, tys[0], &[n_ff, d], sd),
            up: weight(p, rng, tys[1], &[n_ff, d], sd),
            down: weight(p, rng, tys[2], &[d, n_ff], sf),
            d,
            n_ff,
        }
    }

    /// `sigmoid(logit[t]) Σ_f |down[o][f] · h[f]|` per output: the magnitude of the shared
    /// expert's terms of `out[t][o]`.
    fn term_bound(&self, x: &[f32], logits: &[f32]) -> Vec<f32> {
        let (d, n_ff) = (self.d, self.n_ff);
        let mut bound = vec![0f32; x.len()];
        let mut h = vec![0f64; n_ff];
        for (t, (xt, &l)) in x.chunks(d).zip(logits).enumerate() {
            for (f, hf) in h.iter_mut().enumerate() {
                let dot = |m: &[f32]| -> f64 {
                    m[f * d..(f + 1) * d]
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum()
                };
                *hf = silu(dot(&self.gate.deq)) * dot(&self.up.deq);
            }
            let sig = 1.0 / (1.0 + (-(l as f64)).exp());
            for o in 0..d {
                let row = &self.down.deq[o * n_ff..(o + 1) * n_ff];
                let s: f64 = row.iter().zip(&h).map(|(&a, b)| (a as f64 * b).abs()).sum();
                bound[t * d + o] = (sig * s) as f32;
            }
        }
        bound
    }
}

/// `moe_experts_shared` on random inputs (routed experts of formats `tys`, a shared expert of
/// `sh_tys` and width `n_ff_sh`), CPU-routed ids and weights; `|device - cpu| <= 1e-4 Σ|terms|`.
#[allow(clippy::too_many_arguments)]
fn shared_case(
    p: &Both,
    tys: [Option<GgmlType>; 3],
    sh_tys: [Option<GgmlType>; 3],
    n_exp: usize,
    k: usize,
    d: usize,
    n_ff: usize,
    n_ff_sh: usize,
    t_len: usize,
) {
    shared_case_routed(p, tys, sh_tys, [n_exp, k, d, n_ff, n_ff_sh, t_len], None, false);
}

/// `shared_case`, or with `router` logits `[T, E]` (and a scale) `moe_route_experts_shared`: its
/// ids equal to the CPU's, its weights to `1e-5` relative, and on the device both bit for bit
/// what the device's own `moe_route` writes. `add_norm` (with a router): the op's `next`, a
/// residual add and RMSNorm: the residual within the output's bound of the CPU's (plus the add's
/// rounding), the normed rows within 1e-5 of the norm of the device's own residual (f64 on the
/// host), instead of the output (scratch then).
fn shared_case_routed(
    p: &Both,
    tys: [Option<GgmlType>; 3],
    sh_tys: [Option<GgmlType>; 3],
    [n_exp, k, d, n_ff, n_ff_sh, t_len]: [usize; 6],
    router: Option<(&[f32], f32)>,
    add_norm: bool,
) {
    let op = if router.is_some() {
        "moe_route_experts_shared"
    } else {
        "moe_experts_shared"
    };
    let what = format!(
        "{} {op} {tys:?} shared {sh_tys:?} E={n_exp} k={k} d={d} n_ff={n_ff} n_ff_sh={n_ff_sh} T={t_len}",
        p.name()
    );
    let mut rng = Rng::new((n_exp * 37 + k * 5 + d * 3 + n_ff + n_ff_sh * 7 + t_len) as u64);
    let (sd, sf) = (1.0 / (d as f32).sqrt(), 1.0 / (n_ff as f32).sqrt());
    let ex = Experts::of_types(p, &mut rng, tys, [n_exp, d, n_ff], [sd, sd, sf]);
    let sh = SharedW::new(p, &mut rng, sh_tys, d, n_ff_sh);
    let x = rng.normals(t_len * d, 1.0);
    let (it, wt, rl) = match router {
        // Stale values the op must overwrite.
        Some((l, _)) => (
            p.up_u32(&vec![u32::MAX; t_len * k], &[t_len, k]),
            p.up(&vec![f32::NAN; t_len * k], &[t_len, k]),
            Some(p.up(l, &[t_len, n_exp])),
        ),
        None => {
            let (ids, ws) = cpu_route(p, &mut rng, t_len, n_exp, k);
            (p.up_u32(&ids, &[t_len, k]), p.up(&ws, &[t_len, k]), None)
        }
    };
    let logits = rng.normals(t_len, 2.0);
    let (xt, gl) = (p.up(&x, &[t_len, d]), p.up(&logits, &[t_len, 1]));
    let (gate_tmp, up_tmp, act) = (
        p.zeros(&[t_len, n_ff_sh]),
        p.zeros(&[t_len, n_ff_sh]),
        p.zeros(&[t_len, n_ff_sh]),
    );
    let (sh_out, out) = (p.zeros(&[t_len, d]), p.zeros(&[t_len, d]));
    let what = if add_norm {
        format!("{what} + add_rms_norm")
    } else {
        what
    };
    let (h, norm_w, xn) = (
        p.up(&rng.normals(t_len * d, 1.0), &[t_len, d]),
        p.up(&rng.normals(d, 1.0), &[d]),
        p.zeros(&[t_len, d]),
    );
    let eps = 1e-6;
    p.run(&what, |be, s| {
        let next = add_norm.then(|| AddNorm {
            acc: h.on(s),
            w: norm_w.on(s),
            eps,
            out: xn.on(s),
            then: None,
        });
        let shared = SharedExpert {
            gate: sh.gate.t.on(s),
            up: sh.up.t.on(s),
            down: sh.down.t.on(s),
            gate_logit: gl.on(s),
            gate_tmp: gate_tmp.on(s),
            up_tmp: up_tmp.on(s),
            act: act.on(s),
            out: sh_out.on(s),
        };
        let e = MoeExperts {
            gate_exps: ex.gate.t.on(s),
            up_exps: ex.up.t.on(s),
            down_exps: ex.down.t.on(s),
            ids: it.on(s),
            weights: wt.on(s),
            sh: shared,
        };
        match (&rl, router) {
            (Some(rl), Some((_, scale))) => {
                compose::moe_route_experts_shared(be, xt.on(s), rl.on(s), k, scale, e, out.on(s), next)
            }
            _ => compose::moe_experts_shared(be, xt.on(s), e, out.on(s)),
        }
    });
    let (gi, ids) = p.read_u32(&it);
    let (gw, ws) = p.read(&wt);
    if let (Some(rl), Some((_, scale))) = (&rl, router) {
        assert_eq!(gi, ids, "{what}: ids");
        assert_close(&format!("{what}: weights"), &gw, &ws, 0.0, 1e-5);
        let g = p.dev.as_ref();
        let (ri, rw) = (
            g.alloc(DType::U32, &[t_len, k]).expect("alloc"),
            g.alloc(DType::F32, &[t_len, k]).expect("alloc"),
        );
        g.moe_route(&rl.dev, k, scale, &ri, &rw).expect("device route");
        assert_eq!(
            gi,
            g.read_u32(&ri).expect("read"),
            "{what}: ids vs the device's moe_route"
        );
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(
            bits(gw),
            bits(g.read_f32(&rw).expect("read")),
            "{what}: weights vs the device's moe_route"
        );
    }
    let mut bound = ex.term_bound(&x, &ids, &ws, k);
    for (b, s) in bound.iter_mut().zip(sh.term_bound(&x, &logits)) {
        *b += s;
    }
    if !add_norm {
        let (got, want) = p.read(&out);
        p.judge_tier(&what, &got, &want, || check_terms(&what, &got, &want, &bound));
        return;
    }
    // The residual: the output's error, plus the add's rounding on either side (2^-24 |h| each,
    // in check_terms' units of 1e-4).
    let (got, want) = p.read(&h);
    for (b, w) in bound.iter_mut().zip(&want) {
        *b += 1.2e-3 * w.abs();
    }
    p.judge_tier(&format!("{what}: residual"), &got, &want, || {
        check_terms(&format!("{what}: residual"), &got, &want, &bound)
    });
    let (normed, _) = p.read(&xn);
    let (nw, _) = p.read(&norm_w);
    let mut expect = vec![0f32; t_len * d];
    for (row, e) in got.chunks(d).zip(expect.chunks_mut(d)) {
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
        let scale = 1.0 / (ms + eps as f64).sqrt();
        for ((e, &v), &w) in e.iter_mut().zip(row).zip(&nw) {
            *e = (v as f64 * scale * w as f64) as f32;
        }
    }
    assert_close(&format!("{what}: normed rows"), &normed, &expect, 1e-5, 1e-5);
}

/// (E, k, d, n_ff, n_ff_sh, T): decode batches (T <= 4, which backends may run as k + 1 experts
/// per token) and prompt batches, the shared expert as wide as the routed ones and not.
const SHARED_CASES: &[(usize, usize, usize, usize, usize, usize)] = &[
    (8, 2, 256, 256, 256, 1),
    (8, 8, 256, 512, 512, 3),
    (64, 8, 512, 256, 256, 4),
    (8, 2, 256, 256, 512, 1),
    (8, 8, 256, 512, 256, 3),
    (64, 8, 256, 256, 256, 64),
    (8, 2, 256, 512, 512, 65),
    (8, 2, 512, 256, 512, 65),
];

/// `shared_case` over `SHARED_CASES` with every weight of format `ty`.
fn shared_cases(ty: Option<GgmlType>) {
    for p in Both::each() {
        for &(e, k, d, n_ff, n_ff_sh, t) in SHARED_CASES {
            shared_case(&p, [ty; 3], [ty; 3], e, k, d, n_ff, n_ff_sh, t);
        }
    }
}

#[test]
fn experts_shared_f32_match_cpu() {
    shared_cases(Some(GgmlType::F32));
    // Plain F32 tensors as every weight.
    shared_cases(None);
    // Odd sizes (no block format constrains them): rows of 37 and 45, decode and a prompt batch.
    for p in Both::each() {
        for ty in [Some(GgmlType::F32), None] {
            for t in [1, 2, 5] {
                shared_case(&p, [ty; 3], [ty; 3], 5, 3, 37, 45, 45, t);
            }
            shared_case(&p, [ty; 3], [ty; 3], 5, 3, 37, 45, 29, 2);
        }
    }
}

#[test]
fn experts_shared_q4_k_match_cpu() {
    shared_cases(Some(GgmlType::Q4K));
}

#[test]
fn experts_shared_q8_0_match_cpu() {
    shared_cases(Some(GgmlType::Q8_0));
}

#[test]
fn experts_shared_q6_k_match_cpu() {
    use GgmlType::Q6K;
    shared_cases(Some(Q6K));
    // Rows of 2048 (the CUDA Q6_K dense kernels' loads need n_in % 2048 == 0; the shared-expert
    // ones above take rows of 256 and 512 too): the gate and up products of the first, the down
    // products of the second.
    for p in Both::each() {
        shared_case(&p, [Some(Q6K); 3], [Some(Q6K); 3], 8, 2, 2048, 256, 256, 3);
        shared_case(&p, [Some(Q6K); 3], [Some(Q6K); 3], 8, 2, 256, 2048, 2048, 1);
    }
}

/// Formats that differ by projection (a Q4_K_M file: Q4_K gate and up, Q6_K down; gate and up of
/// two formats), or between the shared expert and the routed ones.
#[test]
fn experts_shared_mixed_formats_match_cpu() {
    use GgmlType::*;
    let q4km = [Some(Q4K), Some(Q4K), Some(Q6K)];
    let gate_up_differ = [Some(Q4K), Some(Q8_0), Some(Q8_0)];
    for p in Both::each() {
        for t in [1, 3, 65] {
            shared_case(&p, q4km, q4km, 8, 8, 256, 512, 512, t);
            shared_case(&p, gate_up_differ, gate_up_differ, 8, 2, 256, 256, 256, t);
            shared_case(&p, q4km, [Some(Q8_0); 3], 8, 2, 256, 256, 256, t);
            shared_case(&p, [Some(Q8_0); 3], [None; 3], 8, 2, 256, 256, 256, t);
        }
    }
}

/// Decode shapes the cases above miss, where a backend runs the shared expert as expert k of
/// k + 1: one token routed to 8 of 128 experts in a Q4_K_M MoE's formats (Q4_K gate and up, Q4_K
/// or Q6_K down, the shared expert's the same), and plain floats whose rows are whole units of 8
/// but fill no workgroup's rows (d = 40, n_ff = 24).
#[test]
fn experts_shared_decode_shapes_match_cpu() {
    use GgmlType::*;
    for p in Both::each() {
        for down in [Q4K, Q6K] {
            let tys = [Some(Q4K), Some(Q4K), Some(down)];
            shared_case(&p, tys, tys, 128, 8, 256, 512, 512, 1);
        }
        shared_case(&p, [Some(Q4K); 3], [Some(Q4K); 3], 64, 8, 512, 256, 256, 2);
        for ty in [Some(F32), None] {
            for t in [1, 2, 4] {
                shared_case(&p, [ty; 3], [ty; 3], 5, 3, 40, 24, 24, t);
            }
        }
    }
}

/// `moe_route_experts_shared` at decode shapes (T <= 4, where a backend may route inside the
/// experts' first launch), on fresh random router logits: 8 of 128 experts in a Q4_K_M MoE's
/// formats, plain floats routed 3 of 5 (d = 40, n_ff = 24: no workgroup's rows filled), 8 of 64
/// in Q8_0 and Q4_K, a shared expert of other formats than the routed ones and a prompt batch
/// (which wgpu composes), and router logits with exact ties (a whole row equal; ties at the top
/// across invocation strides).
#[test]
fn route_experts_shared_decode_shapes_match_cpu() {
    use GgmlType::*;
    let q4km = [Some(Q4K), Some(Q4K), Some(Q6K)];
    for p in Both::each() {
        let mut rng = Rng::new(31);
        for t in [1, 3, 4] {
            for add_norm in [false, true] {
                let l = rng.normals(t * 128, 2.0);
                shared_case_routed(&p, q4km, q4km, [128, 8, 256, 512, 512, t], Some((&l, 2.5)), add_norm);
                let l = rng.normals(t * 5, 2.0);
                let plain = [None; 3];
                shared_case_routed(
                    &p,
                    [Some(F32); 3],
                    plain,
                    [5, 3, 40, 24, 24, t],
                    Some((&l, 1.0)),
                    add_norm,
                );
            }
        }
        let l = rng.normals(2 * 64, 2.0);
        let q8 = [Some(Q8_0), Some(Q8_0), Some(Q4K)];
        for add_norm in [false, true] {
            shared_case_routed(&p, q8, q8, [64, 8, 256, 256, 256, 2], Some((&l, 1.0)), add_norm);
            let sh8 = [Some(Q8_0); 3];
            shared_case_routed(&p, q4km, sh8, [64, 8, 256, 256, 256, 2], Some((&l, 1.0)), add_norm);
        }
        // The 35B-A3B's 256 experts, and more than the softmax sum's 256 leaves (several terms a
        // leaf; lib_moe_route.wgsl): every leaf holds terms, so the fold order of the leaves counts.
        for e in [256usize, 600] {
            let l = rng.normals(2 * e, 2.0);
            shared_case_routed(&p, q4km, q4km, [e, 8, 256, 256, 256, 2], Some((&l, 1.0)), e == 256);
        }
        // A prompt batch: the composition.
        let l = rng.normals(9 * 16, 2.0);
        for add_norm in [false, true] {
            shared_case_routed(&p, q4km, q4km, [16, 4, 256, 256, 256, 9], Some((&l, 1.0)), add_norm);
        }
        // Ties: row 0 all equal (the first k experts), row 1 ties at the top spread over the row,
        // row 2 few distinct values.
        let e = 128;
        let mut l: Vec<f32> = rng
            .normals(3 * e, 1.0)
            .iter()
            .map(|v| (v * 2.0).round() / 2.0)
            .collect();
        l[..e].fill(0.25);
        l[e..2 * e].fill(-1.0);
        for i in [e - 1, 0, e / 2, 65, 1, 33, 127 - 32, 64, 100] {
            l[e + i] = 4.0;
        }
        shared_case_routed(&p, q4km, q4km, [e, 8, 256, 512, 512, 3], Some((&l, 1.0)), false);
    }
}

/// `moe_ffn` (the residual add and input norm of a block's output, the F32 router and shared-expert
/// gate, the routing and the experts, with and without `next`, and `next` with the next block's
/// first products of its normed rows: `then`, which CUDA computes with the norm in one launch) on
/// one token (which a backend may
/// norm, route and compute the router for in one launch) and on a batch of three, against the CPU:
/// the normed input within 1e-5 (as add_rms_norm), the ids equal (random logits: no near ties), the
/// weights within 1e-5 relative, the residual within the experts' term bound (plus the adds'
/// rounding), `next`'s normed rows within 1e-5 of the norm of the device's own residual (f64 on
/// the host), `then`'s products bit for bit a plain `matmul_group` of the device's normed rows and
/// within 2e-3 of the CPU's. Formats: Q4_K_M's and Q8_0's, 128 and 256 experts of 8, rows of 256 to
/// 2048.
#[test]
fn moe_ffn_matches_cpu() {
    use GgmlType::*;
    let q4km = [Some(Q4K), Some(Q4K), Some(Q6K)];
    let q8 = [Some(Q8_0); 3];
    for p in Both::each() {
        let mut rng = Rng::new(53);
        for (tys, e, d, n_ff, t_len) in [
            (q4km, 256, 2048, 256, 1),
            (q4km, 128, 256, 512, 1),
            (q8, 128, 512, 256, 1),
            (q4km, 256, 512, 256, 3),
        ] {
            // (`then` draws its inputs from a stream of its own: the other cases keep theirs.)
            let mut then_rng = Rng::new(61 + d as u64 + t_len as u64);
            for (add_norm, then) in [(false, false), (true, false), (true, true)] {
                let rng = if then { &mut then_rng } else { &mut rng };
                let what = format!(
                    "{} moe_ffn {tys:?} E={e} d={d} n_ff={n_ff} T={t_len} next={add_norm} then={then}",
                    p.name()
                );
                let (k, scale, eps) = (8usize, 2.5f32, 1e-6f32);
                let (sd, sf) = (1.0 / (d as f32).sqrt(), 1.0 / (n_ff as f32).sqrt());
                let ex = Experts::of_types(&p, &mut *rng, tys, [e, d, n_ff], [sd, sd, sf]);
                let sh = SharedW::new(&p, &mut *rng, tys, d, n_ff);
                let router = p.up(&rng.normals(e * d, 4.0 * sd), &[e, d]);
                let shared_gate = p.up(&rng.normals(d, sd), &[1, d]);
                let h0 = rng.normals(t_len * d, 1.0);
                let (h, y) = (p.up(&h0, &[t_len, d]), p.up(&rng.normals(t_len * d, 1.0), &[t_len, d]));
                let (in_w, next_w) = (p.up(&rng.normals(d, 1.0), &[d]), p.up(&rng.normals(d, 1.0), &[d]));
                let (xn, xn2, out) = (p.zeros(&[t_len, d]), p.zeros(&[t_len, d]), p.zeros(&[t_len, d]));
                let (logits, sg) = (p.zeros(&[t_len, e]), p.zeros(&[t_len, 1]));
                let (ids, wts) = (p.up_u32(&vec![u32::MAX; t_len * k], &[t_len, k]), p.zeros(&[t_len, k]));
                let tmp = || p.zeros(&[t_len, n_ff]);
                let (gate_tmp, up_tmp, act, sh_out) = (tmp(), tmp(), tmp(), p.zeros(&[t_len, d]));
                // The next block's products (Q4_K_M: a layer's Q4_K products on the tall kernel, or its
                // one Q6_K beside Q4_K ones).
                let group: Vec<(Option<GgmlType>, usize)> = match (then, tys[0], t_len) {
                    (false, ..) => vec![],
                    (true, Some(Q4K), 1) => vec![(Some(Q4K), 8192), (Some(Q4K), 64), (Some(Q4K), 32)],
                    (true, Some(Q4K), _) => vec![(Some(Q6K), 256), (Some(Q4K), 512), (Some(Q4K), 32)],
                    _ => vec![(tys[0], 256), (tys[0], 32)],
                };
                let pw: Vec<Weight> = group
                    .iter()
                    .map(|&(ty, rows)| weight(&p, rng, ty, &[rows, d], sd))
                    .collect();
                let ys: Vec<Pt> = group.iter().map(|&(_, rows)| p.zeros(&[t_len, rows])).collect();
                p.run(&what, |be, s| {
                    let ws: Vec<&Tensor> = pw.iter().map(|w| w.t.on(s)).collect();
                    let outs: Vec<&Tensor> = ys.iter().map(|y| y.on(s)).collect();
                    let norm = |w: &'static str| AddNorm {
                        acc: h.on(s),
                        w: if w == "in" { in_w.on(s) } else { next_w.on(s) },
                        eps,
                        out: if w == "in" { xn.on(s) } else { xn2.on(s) },
                        then: (w != "in" && then).then_some(Group { ws: &ws, outs: &outs }),
                    };
                    let m = MoeFfn {
                        input: norm("in"),
                        y: y.on(s),
                        router: router.on(s),
                        shared_gate: shared_gate.on(s),
                        logits: logits.on(s),
                        k,
                        scale,
                        experts: MoeExperts {
                            gate_exps: ex.gate.t.on(s),
                            up_exps: ex.up.t.on(s),
                            down_exps: ex.down.t.on(s),
                            ids: ids.on(s),
                            weights: wts.on(s),
                            sh: SharedExpert {
                                gate: sh.gate.t.on(s),
                                up: sh.up.t.on(s),
                                down: sh.down.t.on(s),
                                gate_logit: sg.on(s),
                                gate_tmp: gate_tmp.on(s),
                                up_tmp: up_tmp.on(s),
                                act: act.on(s),
                                out: sh_out.on(s),
                            },
                        },
                        out: out.on(s),
                    };
                    compose::moe_ffn(be, m, add_norm.then(|| norm("next")))
                });
                p.check(&format!("{what}: normed input"), &xn, 1e-5, 1e-5);
                let (gi, ci) = p.read_u32(&ids);
                assert_eq!(gi, ci, "{what}: ids");
                let (gw, cw) = p.read(&wts);
                assert_close(&format!("{what}: weights"), &gw, &cw, 0.0, 1e-5);
                // The experts' terms, from the CPU's normed input and routing.
                let (_, x) = p.read(&xn);
                let (_, gl) = p.read(&sg);
                let mut bound = ex.term_bound(&x, &ci, &cw, k);
                for (b, s) in bound.iter_mut().zip(sh.term_bound(&x, &gl)) {
                    *b += s;
                }
                if !add_norm {
                    let (got, want) = p.read(&out);
                    p.judge_tier(&what, &got, &want, || check_terms(&what, &got, &want, &bound));
                    continue;
                }
                let (got, want) = p.read(&h);
                for (b, w) in bound.iter_mut().zip(&want) {
                    // Two adds' rounding on either side (2^-24 |h| each, in check_terms' units of 1e-4).
                    *b += 2.4e-3 * w.abs();
                }
                let r = format!("{what}: residual");
                p.judge_tier(&r, &got, &want, || check_terms(&r, &got, &want, &bound));
                let ((normed, _), (nw, _)) = (p.read(&xn2), p.read(&next_w));
                let mut expect = vec![0f32; t_len * d];
                for (row, ex) in got.chunks(d).zip(expect.chunks_mut(d)) {
                    let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
                    let sc = 1.0 / (ms + eps as f64).sqrt();
                    for ((ex, &v), &w) in ex.iter_mut().zip(row).zip(&nw) {
                        *ex = (v as f64 * sc * w as f64) as f32;
                    }
                }
                assert_close(&format!("{what}: next's normed rows"), &normed, &expect, 1e-5, 1e-5);
                if then {
                    let dev = p.dev.as_ref();
                    let ws: Vec<&Tensor> = pw.iter().map(|w| &w.t.dev).collect();
                    let refs: Vec<Tensor> = group
                        .iter()
                        .map(|&(_, rows)| dev.alloc(DType::F32, &[t_len, rows]).expect("alloc"))
                        .collect();
                    let outs: Vec<&Tensor> = refs.iter().collect();
                    compose::matmul_group(dev, &ws, &xn2.dev, &outs).expect("plain group");
                    for (i, (y, r)) in ys.iter().zip(&refs).enumerate() {
                        let (got, plain) = (dev.read_f32(&y.dev).expect("read"), dev.read_f32(r).expect("read"));
                        assert!(
                            got.iter().zip(&plain).all(|(u, v)| u.to_bits() == v.to_bits()),
                            "{what}: product {i} of the normed rows is not the plain group's"
                        );
                        p.check_tier(&format!("{what}: product {i} of the normed rows"), y, 2e-3, 1e-4);
                    }
                }
            }
        }
    }
}

/// The rules of `moe_experts_shared` (`backend/check.rs`), on every backend.
#[test]
fn shared_contract_errors_are_reported() {
    for be in common::backends() {
        let g = be.as_ref();
        let name = g.name();
        let f = |shape: &[usize]| g.alloc(DType::F32, shape).expect("alloc");
        let (n_exp, d, n_ff, n_sh, t) = (4usize, 32usize, 64usize, 48usize, 2usize);
        let mut rng = Rng::new(45);
        let mut weight = |shape: &[usize]| up(g, &rng.normals(shape.iter().product(), 0.1), shape);
        let (gw, uw, dw) = (
            weight(&[n_exp, n_ff, d]),
            weight(&[n_exp, n_ff, d]),
            weight(&[n_exp, d, n_ff]),
        );
        let (gs, us, ds) = (weight(&[n_sh, d]), weight(&[n_sh, d]), weight(&[d, n_sh]));
        let x = weight(&[t, d]);
        let ids = g.upload_u32(&[0, 1, 2, 3], &[t, 2]).expect("up");
        let ws = up(g, &[0.5; 4], &[t, 2]);
        let gl = up(g, &[0.3, -1.0], &[t, 1]);
        let (gt, ut, act, so, out) = (f(&[t, n_sh]), f(&[t, n_sh]), f(&[t, n_sh]), f(&[t, d]), f(&[t, d]));
        let sh = SharedExpert {
            gate: &gs,
            up: &us,
            down: &ds,
            gate_logit: &gl,
            gate_tmp: &gt,
            up_tmp: &ut,
            act: &act,
            out: &so,
        };
        fn experts<'a>(
            w: [&'a Tensor; 3],
            ids: &'a Tensor,
            weights: &'a Tensor,
            sh: SharedExpert<'a>,
        ) -> MoeExperts<'a> {
            let [gate_exps, up_exps, down_exps] = w;
            MoeExperts {
                gate_exps,
                up_exps,
                down_exps,
                ids,
                weights,
                sh,
            }
        }
        let call = |sh: SharedExpert<'_>, out: &Tensor| {
            compose::moe_experts_shared(&*g, &x, experts([&gw, &uw, &dw], &ids, &ws, sh), out)
        };
        call(sh, &out).expect("valid experts_shared");
        let refused = |r: rill::Result<()>, what: &str| assert!(r.is_err(), "{name}: {what} must be refused");
        // Shapes.
        refused(call(SharedExpert { down: &gs, ..sh }, &out), "shared down shape");
        refused(call(SharedExpert { up: &ds, ..sh }, &out), "shared up shape");
        let ds_wide = weight(&[d + 1, n_sh]);
        let so_wide = f(&[t, d + 1]);
        refused(
            call(
                SharedExpert {
                    down: &ds_wide,
                    out: &so_wide,
                    ..sh
                },
                &out,
            ),
            "shared down rows != d",
        );
        refused(
            call(
                SharedExpert {
                    gate_logit: &f(&[t, 2]),
                    ..sh
                },
                &out,
            ),
            "gate logit size",
        );
        refused(
            call(
                SharedExpert {
                    act: &f(&[t, n_sh + 1]),
                    ..sh
                },
                &out,
            ),
            "act size",
        );
        refused(call(sh, &f(&[t, d - 1])), "out size");
        // Dtypes.
        let gl_u = g.alloc(DType::U32, &[t, 1]).expect("alloc");
        refused(
            call(
                SharedExpert {
                    gate_logit: &gl_u,
                    ..sh
                },
                &out,
            ),
            "U32 gate logit",
        );
        // Aliasing: scratch shared with the output or an input, two scratch tensors one buffer.
        refused(call(SharedExpert { out: &out, ..sh }, &out), "shared out aliases out");
        refused(call(SharedExpert { act: &gt, ..sh }, &out), "act aliases gate_tmp");
        let x_alias = Tensor {
            buf: Arc::clone(&x.buf),
            dtype: DType::F32,
            shape: vec![t, n_sh],
        };
        refused(call(SharedExpert { up_tmp: &x_alias, ..sh }, &out), "up_tmp aliases x");
        let gl_alias = Tensor {
            buf: Arc::clone(&out.buf),
            dtype: DType::F32,
            shape: vec![t, 1],
        };
        refused(
            call(
                SharedExpert {
                    gate_logit: &gl_alias,
                    ..sh
                },
                &out,
            ),
            "out aliases the gate logit",
        );
        // moe_route_experts_shared: the routing's rules, and logits of the experts' tokens and experts.
        let (ids_r, ws_r) = (g.alloc(DType::U32, &[t, 2]).expect("alloc"), f(&[t, 2]));
        let route = |l: &Tensor, k: usize| {
            compose::moe_route_experts_shared(
                &*g,
                &x,
                l,
                k,
                1.0,
                experts([&gw, &uw, &dw], &ids_r, &ws_r, sh),
                &out,
                None,
            )
        };
        route(&f(&[t, n_exp]), 2).expect("valid route_experts_shared");
        refused(route(&f(&[t, n_exp + 1]), 2), "logits of another expert count");
        refused(route(&f(&[t + 1, n_exp]), 2), "logits of another token count");
        refused(route(&f(&[t, n_exp]), 3), "k other than the ids' columns");
        refused(route(&f(&[t, n_exp]), 0), "k = 0");
        refused(
            route(&g.alloc(DType::U32, &[t, n_exp]).expect("alloc"), 2),
            "U32 logits",
        );
        // Still working.
        call(sh, &out).expect("experts_shared after errors");
        g.sync().expect("sync");
    }
}

/// End to end: device routing feeding the device experts equals the CPU pipeline.
#[test]
fn route_then_experts() {
    for p in Both::each() {
        let (n_exp, k, d, n_ff, t_len) = (16usize, 4usize, 64usize, 128usize, 5usize);
        let mut rng = Rng::new(21);
        let ty = Some(GgmlType::F16);
        let ex = Experts::new(&p, &mut rng, ty, [n_exp, d, n_ff], [0.125, 0.125, 0.09]);
        let x = p.up(&rng.normals(t_len * d, 1.0), &[t_len, d]);
        let l = p.up(&rng.normals(t_len * n_exp, 2.0), &[t_len, n_exp]);
        let (ids, ws, out) = (p.zeros_u32(&[t_len, k]), p.zeros(&[t_len, k]), p.zeros(&[t_len, d]));
        p.run("route + experts", |be, s| {
            be.moe_route(l.on(s), k, 1.5, ids.on(s), ws.on(s))?;
            ex.run(be, s, &x, &ids, &ws, &out)
        });
        let (got, want) = p.read(&out);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let what = format!("{} route + experts", p.name());
        p.judge_tier(&what, &got, &want, || {
            assert_close(&what, &got, &want, 1e-5 * scale, 1e-4)
        });
    }
}

/// An id >= E never reads out of bounds: the device refuses it, or skips the slot (the result
/// equals the same call with that slot's weight set to zero, and the CPU's on the valid part).
#[test]
fn experts_invalid_ids_refused_or_skipped() {
    for p in Both::each() {
        let (n_exp, d, n_ff) = (8usize, 64usize, 64usize);
        let mut rng = Rng::new(31);
        let ty = Some(GgmlType::F32);
        let ex = Experts::new(&p, &mut rng, ty, [n_exp, d, n_ff], [0.125; 3]);
        let x = p.up(&rng.normals(2 * d, 1.0), &[2, d]);
        let call = |ids: &[u32], ws: &[f32]| {
            let (it, wt, out) = (p.up_u32(ids, &[2, 3]), p.up(ws, &[2, 3]), p.zeros(&[2, d]));
            let r = ex.run(p.dev.as_ref(), Side::Dev, &x, &it, &wt, &out);
            r.map(|()| p.dev.read_f32(&out.dev).expect("read"))
        };
        let valid = ([3, 0, 5, 0, 1, 0], [0.5, 0.0, 0.25, 0.0, 0.6, 0.0]);
        let Ok(bad) = call(&[3, 8, 5, 0xffff_ffff, 1, 1_000_000], &[0.5, 0.7, 0.25, 0.3, 0.6, 0.2]) else {
            continue;
        };
        let ok = call(&valid.0, &valid.1).expect("valid ids");
        assert_close(&format!("{} invalid ids skipped", p.name()), &bad, &ok, 1e-6, 1e-5);
        // And the CPU agrees on the valid part.
        let (it, wt, out) = (p.up_u32(&valid.0, &[2, 3]), p.up(&valid.1, &[2, 3]), p.zeros(&[2, d]));
        ex.run(p.cpu.as_ref(), Side::Cpu, &x, &it, &wt, &out).expect("cpu");
        assert_close(&format!("{} valid part", p.name()), &ok, &p.read(&out).1, 1e-5, 1e-4);
    }
}

/// Several threads calling ops on one device backend at once each get their own results. The
/// ops that keep intermediates in backend scratch (the MoE hidden rows between gate/up and down,
/// argmax partials) must not let another thread's launches in between their own: on cuda the
/// MoE F16 fixture's batched prefill failed that way while other tests ran in parallel.
#[test]
fn concurrent_callers_get_their_own_results() {
    for p in Both::each() {
        let (n_exp, k, d, n_ff) = (16usize, 4usize, 64usize, 128usize);
        let mut rng = Rng::new(51);
        let (sd, sf) = (1.0 / (d as f32).sqrt(), 1.0 / (n_ff as f32).sqrt());
        let ex = Experts::new(&p, &mut rng, Some(GgmlType::F16), [n_exp, d, n_ff], [sd, sd, sf]);
        let c = p.cpu.as_ref();
        // One job per thread, of different sizes (a larger one grows the scratch while others
        // use it): inputs, CPU-routed ids and weights, and the CPU's results.
        struct Job {
            t: usize,
            x: Pt,
            ids: Pt,
            ws: Pt,
            out: Pt,
            want: Vec<f32>,
            bound: Vec<f32>,
            logits: Pt,
            want_argmax: Vec<u32>,
        }
        let vocab = 9000;
        let jobs: Vec<Job> = [1usize, 3, 64, 130]
            .iter()
            .map(|&t| {
                let xv = rng.normals(t * d, 1.0);
                let cl = up(c, &rng.normals(t * n_exp, 2.0), &[t, n_exp]);
                let (cids, cw) = (
                    c.alloc(DType::U32, &[t, k]).expect("alloc"),
                    c.alloc(DType::F32, &[t, k]).expect("alloc"),
                );
                c.moe_route(&cl, k, 1.0, &cids, &cw).expect("cpu route");
                let (idv, wv) = (c.read_u32(&cids).expect("read"), c.read_f32(&cw).expect("read"));
                let (x, ids, ws, out) = (
                    p.up(&xv, &[t, d]),
                    p.up_u32(&idv, &[t, k]),
                    p.up(&wv, &[t, k]),
                    p.zeros(&[t, d]),
                );
                ex.run(c, Side::Cpu, &x, &ids, &ws, &out).expect("cpu experts");
                let want = c.read_f32(&out.cpu).expect("read");
                let bound = ex.term_bound(&xv, &idv, &wv, k);
                let logits = p.up(&rng.normals(t * vocab, 1.0), &[t, vocab]);
                let am = c.alloc(DType::U32, &[t]).expect("alloc");
                c.argmax(&logits.cpu, &am).expect("cpu argmax");
                let want_argmax = c.read_u32(&am).expect("read");
                Job {
                    t,
                    x,
                    ids,
                    ws,
                    out,
                    want,
                    bound,
                    logits,
                    want_argmax,
                }
            })
            .collect();
        let start = std::sync::Barrier::new(jobs.len());
        // A failing round is recorded, not a panic: the other threads would wait at the barrier
        // for it forever.
        let failures: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|j| {
                    let (p, ex, start) = (&p, &ex, &start);
                    s.spawn(move || {
                        let g = p.dev.as_ref();
                        let am = g.alloc(DType::U32, &[j.t]).expect("alloc");
                        let mut failed = Vec::new();
                        for round in 0..40 {
                            // Start every round together, so the threads' launches meet.
                            start.wait();
                            let r = ex
                                .run(g, Side::Dev, &j.x, &j.ids, &j.ws, &j.out)
                                .and_then(|()| g.argmax(&j.logits.dev, &am));
                            let (got, got_am) = match r.and_then(|()| Ok((g.read_f32(&j.out.dev)?, g.read_u32(&am)?))) {
                                Ok(v) => v,
                                Err(e) => {
                                    failed.push(format!("T={} round {round}: {e}", j.t));
                                    continue;
                                }
                            };
                            let worst = got
                                .iter()
                                .zip(&j.want)
                                .zip(&j.bound)
                                .map(|((&gv, &cv), &b)| (gv - cv).abs() / b.max(f32::MIN_POSITIVE))
                                .fold(0f32, |m, r| if r.is_nan() { f32::INFINITY } else { m.max(r) });
                            // At the fast tier (f16 operands) the bound is the tier's rel L2; a
                            // race shows as errors of order 1 either way.
                            let e = rel_l2(&got, &j.want);
                            if p.fast() && !(e <= FAST_REL_L2 && got.iter().all(|v| v.is_finite())) {
                                failed.push(format!("moe_experts T={} round {round}: rel L2 {e:.3e}", j.t));
                            } else if !p.fast() && worst > 1e-4 {
                                failed.push(format!(
                                    "moe_experts T={} round {round}: error {worst:.3e} of Σ|terms|",
                                    j.t
                                ));
                            }
                            if got_am != j.want_argmax {
                                failed.push(format!("argmax T={} round {round}", j.t));
                            }
                        }
                        failed
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().expect("thread")).collect()
        });
        assert!(
            failures.is_empty(),
            "{}: {} failures, first: {}",
            p.name(),
            failures.len(),
            failures.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        );
    }
}
