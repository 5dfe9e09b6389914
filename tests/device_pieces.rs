//! Weights larger than one storage binding (issue 12, finding 9): lavapipe and browsers bind at
//! most 128 MiB, less than a 0.8B model's embedding. This binary lowers wgpu's limit to 512 KiB
//! (`common::lower_wgpu_binding`, before any backend starts) so small tensors exercise the
//! piecewise binding: matmul, embed, matmul_swiglu and the MoE experts run piece by piece and
//! equal the CPU, the row ops of many sequences run on state pools bound in pieces of whole slots
//! and equal the CPU, a whole model runs, and a weight that cannot be split is refused at upload
//! naming the tensor, the limit and `--backend cpu`. Every device backend runs the same cases (a
//! backend without a binding limit simply runs them whole).

mod common;

use std::sync::Arc;

use common::device::{Both, Pt, Side, GDN_REAL};
use common::weights::{check_matmul, dequant, random_weight, upload};
use common::*;
use rill::backend::compose;
use rill::backend::{AttnDims, Backend, DType, Rows, SeqRow, Tensor, WeightData};
use rill::exec::{Logits, Model};
use rill::gguf::{GgmlType, TensorBytes};

const LIMIT: u64 = 512 << 10;

/// The device backends of this process at the exact tier (binding in pieces is the same at every
/// tier; the checks here are exact), wgpu's with the lowered binding limit.
fn each() -> Vec<Both> {
    lower_wgpu_binding(LIMIT);
    Both::each().into_iter().filter(|p| !p.fast()).collect()
}

fn quantized(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let q = random_weight(ty, rows, cols, 0.5, rng);
    let deq = dequant(ty, &q, rows * cols);
    (q, deq)
}

fn weight(be: &dyn Backend, name: &str, ty: GgmlType, shape: &[usize], bytes: &[u8]) -> rill::error::Result<Tensor> {
    be.upload_weight(&WeightData {
        name: name.into(),
        ggml_type: ty,
        shape: shape.to_vec(),
        bytes: TensorBytes::from_vec(bytes.to_vec()),
    })
}

#[test]
fn matmul_in_pieces_matches_cpu() {
    for p in each() {
        matmul_case(p.dev.as_ref(), p.cpu.as_ref());
    }
}

fn matmul_case(g: &dyn Backend, c: &dyn Backend) {
    let mut rng = Rng::new(41);
    // 2400 rows of Q4_K (288 bytes each): 675 KiB, two pieces; Q6_K, Q8_0 and F16 too.
    for (ty, n_out, n_in) in [
        (GgmlType::Q4K, 2400usize, 512usize),
        (GgmlType::Q6K, 1401, 512),
        (GgmlType::Q8_0, 12001, 96),
        // Rows of whole Q8_0 block pairs: the matrix-vector kernel at T = 1 (96 is not).
        (GgmlType::Q8_0, 4001, 192),
        (GgmlType::F16, 1100, 256),
    ] {
        let (bytes, wf) = quantized(ty, n_out, n_in, &mut rng);
        assert!(bytes.len() as u64 > LIMIT, "{ty}: the weight must exceed one binding");
        let (gw, cw) = (
            upload(g, ty, &[n_out, n_in], &bytes),
            upload(c, ty, &[n_out, n_in], &bytes),
        );
        // Batches whose output still fits one binding (activations are not split).
        for t in [1usize, 3, 9, 40]
            .into_iter()
            .filter(|t| (t * n_out * 4) as u64 <= LIMIT)
        {
            let x = rng.normals(t * n_in, 1.0);
            let out = |be: &dyn Backend, w: &Tensor| {
                let o = be.alloc(DType::F32, &[t, n_out]).unwrap();
                be.matmul(w, &up(be, &x, &[t, n_in]), &o)
                    .unwrap_or_else(|e| panic!("{} matmul {ty}: {e}", be.name()));
                be.read_f32(&o).unwrap()
            };
            check_matmul(
                g,
                &format!("{} matmul {ty} [{n_out}, {n_in}] T {t}", g.name()),
                &out(g, &gw),
                &out(c, &cw),
                &wf,
                &x,
                n_in,
            );
        }
    }
}

#[test]
fn embed_and_swiglu_in_pieces_match_cpu() {
    for p in each() {
        embed_and_swiglu_case(p.dev.as_ref(), p.cpu.as_ref());
    }
}

fn embed_and_swiglu_case(g: &dyn Backend, c: &dyn Backend) {
    let mut rng = Rng::new(43);
    let (vocab, d) = (20000usize, 64usize);
    let (bytes, _) = quantized(GgmlType::Q8_0, vocab, d, &mut rng);
    let (gt, ct) = (
        upload(g, GgmlType::Q8_0, &[vocab, d], &bytes),
        upload(c, GgmlType::Q8_0, &[vocab, d], &bytes),
    );
    // Ids in the first, middle and last pieces, at their edges (7680 rows of 68 bytes per piece
    // with a 256-byte binding alignment).
    let ids = [0u32, 19999, 10000, 7679, 7680, 15360, 7];
    let run = |be: &dyn Backend, t: &Tensor| {
        let o = be.alloc(DType::F32, &[ids.len(), d]).unwrap();
        be.embed(t, &be.upload_u32(&ids, &[ids.len()]).unwrap(), &o)
            .unwrap_or_else(|e| panic!("{} embed: {e}", be.name()));
        be.read_f32(&o).unwrap()
    };
    let (got, want) = (run(g, &gt), run(c, &ct));
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_close(
        &format!("{} embed in pieces", g.name()),
        &got,
        &want,
        1e-6 * scale,
        1e-6,
    );

    // The FFN's fused gate/up falls back to two matmuls when its weights need pieces.
    let (n_ff, n_in) = (2400usize, 256usize);
    let (gb, _) = quantized(GgmlType::Q8_0, n_ff, n_in, &mut rng);
    let (ub, _) = quantized(GgmlType::Q8_0, n_ff, n_in, &mut rng);
    let x = rng.normals(n_in, 1.0);
    let swiglu = |be: &dyn Backend| {
        let gw = weight(be, "gate", GgmlType::Q8_0, &[n_ff, n_in], &gb).unwrap();
        let uw = weight(be, "up", GgmlType::Q8_0, &[n_ff, n_in], &ub).unwrap();
        let f = |shape: &[usize]| be.alloc(DType::F32, shape).unwrap();
        let (gtmp, utmp, out) = (f(&[1, n_ff]), f(&[1, n_ff]), f(&[1, n_ff]));
        compose::matmul_swiglu(be, &gw, &uw, &up(be, &x, &[1, n_in]), &gtmp, &utmp, &out)
            .unwrap_or_else(|e| panic!("{} matmul_swiglu: {e}", be.name()));
        be.read_f32(&out).unwrap()
    };
    let (got, want) = (swiglu(g), swiglu(c));
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_close(
        &format!("{} matmul_swiglu in pieces", g.name()),
        &got,
        &want,
        1e-4 * scale,
        1e-4,
    );
}

#[test]
fn moe_experts_in_pieces_match_cpu() {
    for p in each() {
        moe_case(p.dev.as_ref(), p.cpu.as_ref());
    }
}

fn moe_case(g: &dyn Backend, c: &dyn Backend) {
    let mut rng = Rng::new(47);
    let (n_exp, k, d, n_ff, t) = (16usize, 4usize, 128usize, 256usize, 3usize);
    // Each expert's gate is 256 rows of 136 bytes (34 KiB): 15 experts per 512 KiB piece.
    let ws: Vec<(Vec<u8>, [usize; 3])> = [[n_exp, n_ff, d], [n_exp, n_ff, d], [n_exp, d, n_ff]]
        .into_iter()
        .map(|s| (quantized(GgmlType::Q8_0, s[0] * s[1], s[2], &mut rng).0, s))
        .collect();
    let x = rng.normals(t * d, 1.0);
    let ids: Vec<u32> = (0..t * k).map(|i| ((i * 5 + 3) % n_exp) as u32).collect();
    let wts: Vec<f32> = (0..t * k).map(|i| 0.1 + 0.05 * i as f32).collect();
    let run = |be: &dyn Backend| {
        let w: Vec<Tensor> = ws
            .iter()
            .map(|(b, s)| weight(be, "exps", GgmlType::Q8_0, s, b).unwrap())
            .collect();
        let out = be.alloc(DType::F32, &[t, d]).unwrap();
        be.moe_experts(
            &up(be, &x, &[t, d]),
            &w[0],
            &w[1],
            &w[2],
            &be.upload_u32(&ids, &[t, k]).unwrap(),
            &up(be, &wts, &[t, k]),
            &out,
        )
        .unwrap_or_else(|e| panic!("{} moe_experts: {e}", be.name()));
        be.read_f32(&out).unwrap()
    };
    let (got, want) = (run(g), run(c));
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_close(
        &format!("{} moe_experts in pieces", g.name()),
        &got,
        &want,
        1e-4 * scale,
        1e-4,
    );
}

/// A whole model whose embedding (8192 x 64 F16 = 1 MiB) and LM head exceed the binding limit:
/// its logits equal the CPU backend's at the strict tier.
#[test]
fn model_larger_than_a_binding_runs() {
    let fix = fixture("tiny-dense.F16.gguf");
    let tokens = [785u32, 3974, 293, 4830, 282, 5131];
    let logits = |be: Arc<dyn Backend>| {
        let m = Model::open(&fix, be).expect("model loads");
        let mut s = m.new_session(16).expect("session");
        let mut l = m
            .prefill(&mut s, &tokens, Logits::All, &mut |_, _| {})
            .expect("prefill");
        l.extend(m.decode(&mut s, 13).expect("decode"));
        l
    };
    for p in each() {
        let (got, want) = (logits(Arc::clone(&p.dev)), logits(cpu()));
        assert_close(&format!("{} tiny-dense logits", p.name()), &got, &want, 1e-3, 1e-4);
    }
}

/// A weight whose single row is larger than a binding cannot be split: wgpu (its limit lowered
/// here) refuses the upload with the tensor's name, the limit and the way out (the old code
/// accepted it and failed at the first dispatch), and so does the loader's check of every tensor
/// before any upload (`Backend::check_upload`). A backend that takes the weight must compute
/// with it like the CPU.
#[test]
fn unsplittable_weight_is_refused_at_upload_or_runs() {
    let cols = (LIMIT as usize) / 4 + 64;
    let mut rng = Rng::new(49);
    let (bytes, wf) = quantized(GgmlType::F32, 2, cols, &mut rng);
    let w = WeightData {
        name: "blk.0.huge.weight".into(),
        ggml_type: GgmlType::F32,
        shape: vec![2, cols],
        bytes: TensorBytes::from_vec(bytes.clone()),
    };
    assert!(cpu().check_upload(&w).is_ok());
    for p in each() {
        let g = p.dev.as_ref();
        match weight(g, "blk.0.huge.weight", GgmlType::F32, &[2, cols], &bytes) {
            Err(err) => {
                let msg = err.to_string();
                for want in ["blk.0.huge.weight", "max_storage_buffer_binding_size", "--backend cpu"] {
                    assert!(msg.contains(want), "{}: error should name {want:?}: {msg}", p.name());
                }
                assert!(
                    g.check_upload(&w).is_err(),
                    "{}: check_upload passes what upload refuses",
                    p.name()
                );
            }
            Ok(gw) => {
                assert_ne!(p.name(), "wgpu", "wgpu bound a row over its lowered binding limit");
                assert!(
                    g.check_upload(&w).is_ok(),
                    "{}: check_upload refuses what upload takes",
                    p.name()
                );
                let x = rng.normals(cols, 1.0);
                let run = |be: &dyn Backend, w: &Tensor| {
                    let o = be.alloc(DType::F32, &[1, 2]).unwrap();
                    be.matmul(w, &up(be, &x, &[1, cols]), &o)
                        .unwrap_or_else(|e| panic!("{} matmul: {e}", be.name()));
                    be.read_f32(&o).unwrap()
                };
                let cw = upload(p.cpu.as_ref(), GgmlType::F32, &[2, cols], &bytes);
                check_matmul(
                    g,
                    &format!("{} wide matmul", p.name()),
                    &run(g, &gw),
                    &run(p.cpu.as_ref(), &cw),
                    &wf,
                    &x,
                    cols,
                );
            }
        }
    }
}

/// `b` rows in distinct random slots of `n_slots` (the first and the last slot among them, so
/// the first and the last piece are used), positions below `ctx`, and their device tensors.
fn pool_rows(p: &Both, rng: &mut Rng, b: usize, n_slots: usize, ctx: usize) -> (Vec<SeqRow>, Pt) {
    let mut rest: Vec<u32> = (1..n_slots as u32 - 1).collect();
    for i in (1..rest.len()).rev() {
        rest.swap(i, rng.below(i + 1));
    }
    let slots: Vec<u32> = [n_slots as u32 - 1, 0].into_iter().chain(rest).collect();
    let rows: Vec<SeqRow> = (0..b)
        .map(|i| SeqRow {
            slot: slots[i],
            pos: if i == 1 { ctx as u32 - 1 } else { rng.below(ctx) as u32 },
        })
        .collect();
    let pairs: Vec<u32> = rows.iter().flat_map(|r| [r.slot, r.pos]).collect();
    let dev = p.up_u32(&pairs, &[b, 2]);
    (rows, dev)
}

fn rows_on<'a>(host: &'a [SeqRow], dev: &'a Pt, s: Side) -> Rows<'a> {
    Rows { host, dev: dev.on(s) }
}

/// The row ops (tests/device_rows.rs, same tolerances) on pools of several bindings: conv
/// states of 12 KiB slots (two pieces), delta states of 256 KiB slots (four), KV pools of 10 KiB
/// slots (three) and 46 KiB slots (four; attention's partial results in three batches of rows).
#[test]
fn row_ops_on_pools_in_pieces_match_cpu() {
    for p in each() {
        let mut rng = Rng::new(47);
        let (c, k, n_slots, b) = (1024usize, 4usize, 80usize, 40usize);
        assert!((n_slots * (k - 1) * c * 4) as u64 > LIMIT);
        let (rows, rd) = pool_rows(&p, &mut rng, b, n_slots, 1000);
        let w = p.up(&rng.normals(c * k, 0.5), &[c, k]);
        let states = p.up(&rng.normals(n_slots * (k - 1) * c, 1.0), &[n_slots * (k - 1), c]);
        let (x, out) = (p.up(&rng.normals(b * c, 1.0), &[b, c]), p.zeros(&[b, c]));
        p.run("conv1d_silu_rows", |be, s| {
            be.conv1d_silu_rows(x.on(s), w.on(s), states.on(s), rows_on(&rows, &rd, s), out.on(s))
        });
        p.check("conv rows out in pieces", &out, 1e-6, 1e-5);
        p.check("conv rows states in pieces", &states, 0.0, 0.0);

        let dims = GDN_REAL;
        let (cd, hv, per_slot, n_slots, b) = (dims.conv_dim(), dims.hv, dims.hv * dims.dv, 7usize, 5usize);
        assert!((n_slots * per_slot * dims.dk * 4) as u64 > 3 * LIMIT);
        let (rows, rd) = pool_rows(&p, &mut rng, b, n_slots, 1000);
        let mut uh = rng.normals(b * cd, 1.0);
        for row in uh.chunks_exact_mut(cd) {
            for head in row[..2 * dims.hk * dims.dk].chunks_exact_mut(dims.dk) {
                let n = head.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                head.iter_mut().for_each(|x| *x /= n);
            }
        }
        let u = p.up(&uh, &[b, cd]);
        let g: Vec<f32> = (0..b * hv).map(|_| -(rng.uniform() as f32) * 2.0).collect();
        let beta: Vec<f32> = (0..b * hv).map(|_| rng.uniform() as f32).collect();
        let (g, beta) = (p.up(&g, &[b, hv]), p.up(&beta, &[b, hv]));
        let states = p.up(
            &rng.normals(n_slots * per_slot * dims.dk, 0.5),
            &[n_slots * per_slot, dims.dk],
        );
        let out = p.zeros(&[b, per_slot]);
        p.run("delta_rule_rows", |be, s| {
            let r = rows_on(&rows, &rd, s);
            be.delta_rule_rows(u.on(s), g.on(s), beta.on(s), states.on(s), out.on(s), dims, r)
        });
        p.check("delta rows out in pieces", &out, 1e-5, 1e-4);
        p.check("delta rows states in pieces", &states, 1e-5, 1e-4);

        let (w, ctx, n_slots, b) = (64usize, 40usize, 120usize, 40usize);
        assert!((n_slots * ctx * w * 4) as u64 > 2 * LIMIT);
        let (rows, rd) = pool_rows(&p, &mut rng, b, n_slots, ctx);
        let kp = p.up(&rng.normals(n_slots * ctx * w, 1.0), &[n_slots * ctx, w]);
        let vp = p.up(&rng.normals(n_slots * ctx * w, 1.0), &[n_slots * ctx, w]);
        let (k, v) = (
            p.up(&rng.normals(b * w, 1.0), &[b, w]),
            p.up(&rng.normals(b * w, 1.0), &[b, w]),
        );
        p.run("kv_store_rows", |be, s| {
            be.kv_store_rows(k.on(s), v.on(s), kp.on(s), vp.on(s), ctx, rows_on(&rows, &rd, s))
        });
        p.check("k pool in pieces", &kp, 0.0, 0.0);
        p.check("v pool in pieces", &vp, 0.0, 0.0);

        let d = AttnDims {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
        };
        let (nq, nkv, ctx, n_slots, b) = (256usize, 128usize, 90usize, 40usize, 37usize);
        assert!((n_slots * ctx * nkv * 4) as u64 > 3 * LIMIT);
        let (rows, rd) = pool_rows(&p, &mut rng, b, n_slots, ctx);
        let kp = p.up(&rng.normals(n_slots * ctx * nkv, 1.0), &[n_slots * ctx, nkv]);
        let vp = p.up(&rng.normals(n_slots * ctx * nkv, 1.0), &[n_slots * ctx, nkv]);
        let (q, out) = (p.up(&rng.normals(b * nq, 1.0), &[b, nq]), p.zeros(&[b, nq]));
        p.run("attention_rows", |be, s| {
            let r = rows_on(&rows, &rd, s);
            be.attention_rows(q.on(s), kp.on(s), vp.on(s), ctx, r, d, 0.125, out.on(s))
        });
        p.check_tier("attention rows in pieces", &out, 5e-6, 1e-4);

        // A slot larger than one binding cannot be bound in pieces: refused, naming the way out.
        let (w, ctx, n_slots, b) = (256usize, 600usize, 2usize, 2usize);
        assert!((ctx * w * 4) as u64 > LIMIT);
        let (rows, rd) = pool_rows(&p, &mut rng, b, n_slots, ctx);
        let kp = p.zeros(&[n_slots * ctx, w]);
        let vp = p.zeros(&[n_slots * ctx, w]);
        let (k, v) = (p.zeros(&[b, w]), p.zeros(&[b, w]));
        let r = p
            .dev
            .kv_store_rows(&k.dev, &v.dev, &kp.dev, &vp.dev, ctx, rows_on(&rows, &rd, Side::Dev));
        match r {
            Err(e) => assert!(e.to_string().contains("shorter context"), "{}: {e}", p.name()),
            Ok(()) => assert_ne!(p.name(), "wgpu", "wgpu bound a slot over its lowered binding limit"),
        }
    }
}
