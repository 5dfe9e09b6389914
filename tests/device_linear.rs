//! Every device backend's `matmul`, `matmul_swiglu` and `embed`, for every weight format, against
//! the CPU backend; and the contract errors of those ops on every backend.

mod common;

use common::device::{pos_on, Both, Pt};
use common::weights::{
    check_matmul, dequant, f16_scale_offsets, product_tolerance, random_weight, upload, WEIGHT_TYPES,
};
use common::*;
use rill::backend::compose;
use rill::backend::{AttnDims, Backend, DType, Tensor, WeightData};
use rill::gguf::{GgmlType, TensorBytes};

/// A weight of format `ty` on both backends.
fn upload_both(p: &Both, ty: GgmlType, shape: &[usize], bytes: &[u8]) -> Pt {
    Pt {
        dev: upload(p.dev.as_ref(), ty, shape, bytes),
        cpu: upload(p.cpu.as_ref(), ty, shape, bytes),
    }
}

/// Token counts of the matmul tests: decode-sized (the matrix-vector kernels), the boundary to
/// the batched kernels, and one or two 64-row tiles.
const TOKEN_COUNTS: [usize; 6] = [1, 3, 8, 9, 64, 65];

/// Run `matmul` on both backends for one weight and the token counts `n_toks`.
fn matmul_case(p: &Both, ty: GgmlType, bytes: &[u8], n_out: usize, n_in: usize, n_toks: &[usize], rng: &mut Rng) {
    let w = upload_both(p, ty, &[n_out, n_in], bytes);
    let wf = dequant(ty, bytes, n_out * n_in);
    for &n_tok in n_toks {
        let x = rng.normals(n_tok * n_in, 1.0);
        let (xt, out) = (p.up(&x, &[n_tok, n_in]), p.zeros(&[n_tok, n_out]));
        let what = format!("{} matmul {ty} [{n_out}, {n_in}] T {n_tok}", p.name());
        p.run(&what, |be, s| be.matmul(w.on(s), xt.on(s), out.on(s)));
        let (got, want) = p.read(&out);
        check_matmul(p.dev.as_ref(), &what, &got, &want, &wf, &x, n_in);
    }
}

#[test]
fn matmul_every_type_matches_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(7);
        for ty in WEIGHT_TYPES {
            let bs = ty.block_size() as usize;
            // A row of 1..3 blocks of 256 (K-quants) or of 32 (legacy), and rows that are not a
            // multiple of the workgroup size; odd element counts for the plain floats.
            let mut n_ins = vec![256usize, 768];
            match bs {
                1 => n_ins.push(37),
                32 => n_ins.push(96),
                _ => {}
            }
            for &n_in in &n_ins {
                for n_out in [1usize, 7, 300] {
                    let bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
                    matmul_case(&p, ty, &bytes, n_out, n_in, &TOKEN_COUNTS, &mut rng);
                }
            }
        }
    }
}

/// Shapes that reach the CUDA tensor-core decode kernels the test above does not: Q6_K rows of
/// 2048 (its kernels need n_in % 2048 == 0; 256 and 768 fall back to the f32 kernels), and the
/// tall and LM-head kernels of dense Q8_0 and Q6_K products (8192 and 65536 rows and more, row
/// counts not a multiple of their 32-row blocks). Decode-sized T only: larger batches take other
/// kernels.
#[test]
fn matmul_tensor_core_decode_shapes_match_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(41);
        let cases = [
            (GgmlType::Q6K, 7usize, 2048usize),
            (GgmlType::Q6K, 300, 2048),
            (GgmlType::Q6K, 33, 4096),
            (GgmlType::Q8_0, 8200, 256),
            (GgmlType::Q8_0, 65560, 256),
            (GgmlType::Q6K, 65560, 2048),
        ];
        for (ty, n_out, n_in) in cases {
            let bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
            matmul_case(&p, ty, &bytes, n_out, n_in, &[1, 3], &mut rng);
        }
    }
}

/// Decode products whose input a producer op wrote just before: on CUDA the RMSNorms, the gated
/// norm and the attention output's gate write the tensor-core products' prepared copies of their
/// output themselves, in every layout the products have read from that kind of op
/// (`ops/matvec_tc.rs`). Each producer, then Q4_K, Q8_0 and Q6_K products on its output, three
/// rounds (the first teaches the producers the layouts, the later ones read their copies); rows
/// of 4096 and 2048 (Q6_K's products need a multiple of 2048), 1 and 3 tokens. Judged against
/// the dequantized weights times the device's own producer output, so that only the products'
/// error counts.
#[test]
fn products_of_prepared_producer_outputs_match() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(53);
        for (t, n) in [(1usize, 4096usize), (3, 2048)] {
            let n_out = 40;
            let weights: Vec<(GgmlType, Pt, Vec<f32>)> = [Q4K, Q8_0, Q6K]
                .into_iter()
                .map(|ty| {
                    let b = random_weight(ty, n_out, n, 0.5, &mut rng);
                    (ty, upload_both(&p, ty, &[n_out, n], &b), dequant(ty, &b, n_out * n))
                })
                .collect();
            let x = p.up(&rng.normals(t * n, 1.0), &[t, n]);
            let z = p.up(&rng.normals(t * n, 2.0), &[t, n]);
            let acc = p.up(&rng.normals(t * n, 1.0), &[t, n]);
            let (w, w_head) = (p.up(&rng.normals(n, 1.0), &[n]), p.up(&rng.normals(128, 1.0), &[128]));
            let y = p.zeros(&[t, n]);
            for round in 0..3 {
                for producer in ["rms_norm", "add_rms_norm", "gated_rms_norm", "sigmoid_mul_assign"] {
                    p.run(producer, |be, s| match producer {
                        "rms_norm" => be.rms_norm(x.on(s), w.on(s), 1e-6, y.on(s)),
                        "add_rms_norm" => compose::add_rms_norm(be, acc.on(s), x.on(s), w.on(s), 1e-6, y.on(s)),
                        "gated_rms_norm" => be.gated_rms_norm(x.on(s), z.on(s), w_head.on(s), 1e-6, y.on(s)),
                        // In place on the gated norm's output.
                        _ => be.sigmoid_mul_assign(y.on(s), z.on(s)),
                    });
                    let yd = p.dev.read_f32(&y.dev).expect("device read");
                    for (ty, wt, wf) in &weights {
                        let out = p.zeros(&[t, n_out]);
                        let what = format!("{} {ty} product of {producer} T {t} n {n} round {round}", p.name());
                        p.run(&what, |be, s| be.matmul(wt.on(s), y.on(s), out.on(s)));
                        let got = p.dev.read_f32(&out.dev).expect("device read");
                        let want = product(wf, &yd, n);
                        check_matmul(p.dev.as_ref(), &what, &got, &want, wf, &yd, n);
                    }
                }
            }
        }
    }
}

/// The product of the dequantized weight `wf` (rows of `n`) and the tokens `x` (`[T, n]`), each
/// dot product in f64: what the device's product of x is judged against.
fn product(wf: &[f32], x: &[f32], n: usize) -> Vec<f32> {
    let n_out = wf.len() / n;
    (0..x.len() / n * n_out)
        .map(|i| {
            let (r, o) = (i / n_out, i % n_out);
            let row = &wf[o * n..(o + 1) * n];
            let xr = &x[r * n..(r + 1) * n];
            row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32
        })
        .collect()
}

/// After a read of the product `got` of `y` (a host access drops any planes a norm wrote), the
/// product again quantizes y itself: it must give `got` bit for bit.
fn assert_own_prep_agrees(p: &Both, what: &str, wt: &Pt, y: &Pt, got: &[f32]) {
    let t = y.dev.rows();
    let again = p.zeros(&[t, got.len() / t]);
    p.run("product again", |be, s| be.matmul(wt.on(s), y.on(s), again.on(s)));
    let again = p.dev.read_f32(&again.dev).expect("device read");
    let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(got), bits(&again), "{what}: not what the product's own prep gives");
}

/// With the packed-dot units (`RILL_TEST_WGPU=dot`) the wgpu norms write their output's packed-dot planes and a product of
/// that output reads them instead of quantizing it again: the product must see the norm's output
/// as it is when the product runs. A norm then the Q4_K and Q6_K products; a norm, an in-place
/// op that rewrites its output, then the products (stale planes would give the old values); two
/// norms into different outputs, then the products of the first (the planes are the second's).
/// Nothing is read back before the products (a host access drops the planes). Judged against the
/// dequantized weights times the device's own output, read after the products.
#[test]
fn products_of_norm_outputs_see_their_current_values() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(71);
        let (n, n_out) = (768usize, 37usize);
        let weights: Vec<(GgmlType, Pt, Vec<f32>)> = [Q4K, Q6K]
            .into_iter()
            .map(|ty| {
                let b = random_weight(ty, n_out, n, 0.5, &mut rng);
                (ty, upload_both(&p, ty, &[n_out, n], &b), dequant(ty, &b, n_out * n))
            })
            .collect();
        for case in ["norm", "rewritten", "other norm"] {
            for producer in ["rms_norm", "add_rms_norm", "gated_rms_norm"] {
                let x = p.up(&rng.normals(n, 1.0), &[1, n]);
                let z = p.up(&rng.normals(n, 2.0), &[1, n]);
                let acc = p.up(&rng.normals(n, 1.0), &[1, n]);
                let (w, w_head) = (p.up(&rng.normals(n, 1.0), &[n]), p.up(&rng.normals(128, 1.0), &[128]));
                let (y, y2) = (p.zeros(&[1, n]), p.zeros(&[1, n]));
                let norm = |y: &Pt| {
                    p.run(producer, |be, s| match producer {
                        "rms_norm" => be.rms_norm(x.on(s), w.on(s), 1e-6, y.on(s)),
                        "add_rms_norm" => compose::add_rms_norm(be, acc.on(s), x.on(s), w.on(s), 1e-6, y.on(s)),
                        _ => be.gated_rms_norm(x.on(s), z.on(s), w_head.on(s), 1e-6, y.on(s)),
                    })
                };
                norm(&y);
                match case {
                    "rewritten" => p.run("rewrite", |be, s| be.sigmoid_mul_assign(y.on(s), z.on(s))),
                    "other norm" => {
                        p.run("other input", |be, s| be.sigmoid_mul_assign(x.on(s), z.on(s)));
                        norm(&y2);
                    }
                    _ => {}
                }
                let outs: Vec<Pt> = weights
                    .iter()
                    .map(|(_, wt, _)| {
                        let out = p.zeros(&[1, n_out]);
                        p.run("product", |be, s| be.matmul(wt.on(s), y.on(s), out.on(s)));
                        out
                    })
                    .collect();
                let yd = p.dev.read_f32(&y.dev).expect("device read");
                for ((ty, wt, wf), out) in weights.iter().zip(&outs) {
                    let what = format!("{} {ty} product of {producer} ({case})", p.name());
                    let got = p.dev.read_f32(&out.dev).expect("device read");
                    let want = product(wf, &yd, n);
                    check_matmul(p.dev.as_ref(), &what, &got, &want, wf, &yd, n);
                    // The read dropped any planes: the product again quantizes y itself, which
                    // must give the planes the norm wrote, bit for bit.
                    assert_own_prep_agrees(&p, &what, wt, &y, &got);
                }
            }
        }
    }
}

/// With the packed-dot units (`RILL_TEST_WGPU=dot`) a norm writes its output's planes from registers, eight invocations
/// per 32-element block (lib_norm_dot.wgsl): they must be what `mv_dot_prep` makes of the output,
/// bit for bit (the scale, the three planes and both half-block sums), for every row length and
/// row count the norms write planes for (rms_norm and add_rms_norm: one row of d a multiple of 256;
/// gated_rms_norm: heads of d a multiple of 32, whole 256-element blocks in all), including rows
/// of fewer vec4s than the workgroup's invocations and rows that leave the last round partial.
/// Judged through the Q4_K and Q6_K products: with the norm's planes, then (after a read drops
/// them) with the product's own prep. The norms' outputs (and add_rms_norm's updated acc) must
/// also match the CPU as in device_ops.rs. Shapes the norms write no planes for run too.
#[test]
fn norm_written_planes_match_the_products_own_prep() {
    use GgmlType::*;
    // (producer, d, rows): rows of d in one [1, rows * d] tensor.
    let mut cases = Vec::new();
    for d in [512, 768, 2304, 4096] {
        cases.push(("rms_norm", d, 1));
        cases.push(("add_rms_norm", d, 1));
    }
    for (d, rows) in [
        (32, 16),
        (32, 72),
        (96, 8),
        (96, 24),
        (128, 3),
        (128, 64),
        (128, 65),
        (128, 66),
        (2080, 8),
        (4096, 1),
    ] {
        cases.push(("gated_rms_norm", d, rows));
    }
    for p in Both::each() {
        let mut rng = Rng::new(72);
        for &(producer, d, rows) in &cases {
            let n = d * rows;
            let n_out = 5;
            let x = p.up(&rng.normals(n, 2.0), &[1, n]);
            let z = p.up(&rng.normals(n, 2.0), &[1, n]);
            let acc = p.up(&rng.normals(n, 2.0), &[1, n]);
            let w = p.up(&rng.normals(d, 1.0), &[d]);
            let y = p.zeros(&[1, n]);
            let what = format!("{} {producer} d {d} rows {rows}", p.name());
            let norm = || {
                p.run(producer, |be, s| match producer {
                    "rms_norm" => be.rms_norm(x.on(s), w.on(s), 1e-6, y.on(s)),
                    "add_rms_norm" => compose::add_rms_norm(be, acc.on(s), x.on(s), w.on(s), 1e-6, y.on(s)),
                    _ => be.gated_rms_norm(x.on(s), z.on(s), w.on(s), 1e-6, y.on(s)),
                })
            };
            // A read drops the planes: only after the products.
            let check_norm = || {
                p.check(&format!("{what}: output"), &y, 1e-6, 1e-5);
                if producer == "add_rms_norm" {
                    p.check(&format!("{what}: acc"), &acc, 0.0, 0.0);
                }
            };
            // No K-quant row of that length: no planes, the norm alone.
            if !n.is_multiple_of(256) {
                norm();
                check_norm();
                continue;
            }
            for ty in [Q4K, Q6K] {
                let b = random_weight(ty, n_out, n, 0.5, &mut rng);
                let wt = upload_both(&p, ty, &[n_out, n], &b);
                norm();
                let out = p.zeros(&[1, n_out]);
                p.run("product", |be, s| be.matmul(wt.on(s), y.on(s), out.on(s)));
                let got = p.dev.read_f32(&out.dev).expect("device read");
                assert_own_prep_agrees(&p, &format!("{what} {ty}"), &wt, &y, &got);
                let yd = p.dev.read_f32(&y.dev).expect("device read");
                let wf = dequant(ty, &b, n_out * n);
                let want = product(&wf, &yd, n);
                check_matmul(p.dev.as_ref(), &format!("{what} {ty}"), &got, &want, &wf, &yd, n);
                check_norm();
            }
        }
    }
}

/// With the packed-dot units (`RILL_TEST_WGPU=dot`) the gated attention's merging dispatch writes its output's packed-dot
/// planes (lib_att_xq.wgsl: the row through workgroup memory, each block whole): the output
/// projection's Q4_K and Q6_K products that read them must give what their own prep gives, bit
/// for bit, and match the dequantized weights times the device's output. Qwen3.5's 16 heads of
/// 256 (GQA 4:1) and heads of one block at 1 token; 3 and 2 tokens (no planes: only one-token
/// products read them) with heads of 8 and 4 blocks.
#[test]
fn attention_gate_planes_match_the_products_own_prep() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(74);
        for (t, nh, nkv, d) in [
            (1usize, 16usize, 4usize, 256usize),
            (3, 16, 4, 256),
            (1, 8, 2, 32),
            (2, 4, 1, 128),
        ] {
            let (n, n_out, pos0, ctx) = (nh * d, 7usize, 5usize, 9usize);
            let dims = AttnDims {
                n_head: nh,
                n_head_kv: nkv,
                head_dim: d,
            };
            let q = p.up(&rng.normals(t * n, 1.0), &[t, n]);
            let kc = p.up(&rng.normals(ctx * nkv * d, 1.0), &[ctx, nkv * d]);
            let vc = p.up(&rng.normals(ctx * nkv * d, 1.0), &[ctx, nkv * d]);
            let gate = p.up(&rng.normals(t * n, 2.0), &[t, n]);
            let y = p.zeros(&[t, n]);
            let pt = p.pos(pos0);
            let scale = 1.0 / (d as f32).sqrt();
            for ty in [Q4K, Q6K] {
                let what = format!("{} attention_gated t {t} {dims:?} {ty}", p.name());
                let b = random_weight(ty, n_out, n, 0.5, &mut rng);
                let wt = upload_both(&p, ty, &[n_out, n], &b);
                p.run("attention_gated", |be, s| {
                    let at = pos_on(pos0, &pt, s);
                    compose::attention_gated(be, q.on(s), kc.on(s), vc.on(s), at, dims, scale, gate.on(s), y.on(s))
                });
                let out = p.zeros(&[t, n_out]);
                p.run("product", |be, s| be.matmul(wt.on(s), y.on(s), out.on(s)));
                let got = p.dev.read_f32(&out.dev).expect("device read");
                assert_own_prep_agrees(&p, &what, &wt, &y, &got);
                let yd = p.dev.read_f32(&y.dev).expect("device read");
                let wf = dequant(ty, &b, n_out * n);
                check_matmul(p.dev.as_ref(), &what, &got, &product(&wf, &yd, n), &wf, &yd, n);
                // The output itself against the CPU's (tests/device_ops.rs' attention bounds).
                p.check_tier(&format!("{what}: output"), &y, 5e-6, 1e-4);
            }
        }
    }
}

/// Prompt-sized batches (issue 8's T in {63, 64, 65, 200, 1000}) for the formats of the quantized
/// model files, whose products run on the tensor cores at the fast tier (with split-K at some
/// shapes: K = 1024 gives up to 16 steps of 64 to split), and on whole tiles and ragged ones.
#[test]
fn matmul_prompt_batches_match_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(41);
        for ty in [
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::Q8_0,
            GgmlType::F16,
            GgmlType::Bf16,
        ] {
            for (n_out, n_in) in [(300usize, 1024usize), (128, 256)] {
                let bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
                matmul_case(&p, ty, &bytes, n_out, n_in, &[63, 64, 65, 200, 1000], &mut rng);
            }
        }
    }
}

/// The decode kernels' edges (`matvec.wgsl` and `matvec_swiglu.wgsl`: a row group's lanes stride
/// over a row's units, each invocation owns several rows): rows longer than 256 values (shorter
/// ones take one invocation per row), row counts that are not a multiple of a workgroup's rows
/// (1, 33, 129, 515), rows whose units are not a multiple of the lanes (2304 = 9 K-quant blocks
/// = 36 units of 64) or fewer than the lanes (512: 8 units), for the formats with their own
/// decoders, one without (Q4_0), and the two-weight SwiGLU. scripts/test.sh runs it under several
/// geometries of the tuning options (`RILL_TEST_WGPU=mv_rows=..,mv_lanes=..`).
#[test]
fn matvec_geometry_edges_match_cpu() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(43);
        for ty in [Q4K, Q5K, Q6K, Q8_0, F16, Bf16, F32, Q4_0] {
            for n_in in [512usize, 2304] {
                for n_out in [1usize, 33, 129, 515] {
                    let bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
                    matmul_case(&p, ty, &bytes, n_out, n_in, &[1], &mut rng);
                }
            }
            let (n_ff, n_in) = (129usize, 2304usize);
            let c = gate_up(&p, ty, n_ff, n_in, &mut rng);
            swiglu_case(&p, &c, n_in, n_ff, &[1], &mut rng);
        }
    }
}

/// The decode products with a geometry of their own: tall ones (at least 65536 rows, the LM head:
/// wgpu's `matvec_tall` with its own rows per invocation, CUDA's tall tiling) and long rows (12288
/// elements and more, the FFN down products: wgpu's lanes for long rows), an odd row count past
/// the threshold so that the last workgroup is partial.
#[test]
fn tall_and_long_row_products_match_cpu() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(61);
        for ty in [Q4K, Q6K, Q8_0, F32] {
            let (n_out, n_in) = (65536 + 37, 256);
            let bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
            matmul_case(&p, ty, &bytes, n_out, n_in, &[1], &mut rng);
            for n_in in [12288usize, 12288 + 4096] {
                let bytes = random_weight(ty, 33, n_in, 0.5, &mut rng);
                matmul_case(&p, ty, &bytes, 33, n_in, &[1], &mut rng);
            }
        }
    }
}

/// One token's `matmul` on both backends for a given x.
fn matvec_x_case(p: &Both, ty: GgmlType, bytes: &[u8], n_out: usize, n_in: usize, x: &[f32], what: &str) {
    let w = upload_both(p, ty, &[n_out, n_in], bytes);
    let wf = dequant(ty, bytes, n_out * n_in);
    let (xt, out) = (p.up(x, &[1, n_in]), p.zeros(&[1, n_out]));
    let what = format!("{} matmul {ty} [{n_out}, {n_in}] {what}", p.name());
    p.run(&what, |be, s| be.matmul(w.on(s), xt.on(s), out.on(s)));
    let (got, want) = p.read(&out);
    check_matmul(p.dev.as_ref(), &what, &got, &want, &wf, x, n_in);
}

/// Decode products of inputs whose 32-element blocks differ wildly, for the wgpu dot units
/// (`RILL_TEST_WGPU=dot`: x quantized per block into three int8 planes under a power-of-two scale,
/// mv_dot_prep.wgsl): zero blocks, a large outlier in a block, block scales from 1e-3 to 1e3,
/// and whole rows of tiny (1e-30) and huge (1e30) magnitudes, which the scale's exponent must
/// follow. Every backend must stay within the exact tier's bound here.
#[test]
fn matvec_block_extremes_of_x_match_cpu() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(59);
        for ty in [Q4K, Q6K, Q8_0] {
            for n_in in [256usize, 2304] {
                let n_out = 67;
                let bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
                let mut mixed = rng.normals(n_in, 1.0);
                for (b, blk) in mixed.chunks_mut(32).enumerate() {
                    match b % 4 {
                        0 => blk.fill(0.0),
                        1 => blk[(b * 7) % 32] *= 1000.0,
                        2 => blk.iter_mut().for_each(|v| *v *= 10f32.powi((b % 7) as i32 - 3)),
                        _ => blk[..31].fill(0.0),
                    }
                }
                for (x, what) in [
                    (mixed, "mixed blocks"),
                    (rng.normals(n_in, 1e-30), "tiny x"),
                    (rng.normals(n_in, 1e30), "huge x"),
                    (vec![0.0; n_in], "zero x"),
                ] {
                    matvec_x_case(&p, ty, &bytes, n_out, n_in, &x, what);
                }
            }
        }
    }
}

/// Block scales that are subnormal halves (a GGUF may hold them: a block of near-zero weights,
/// and Q4_K/Q5_K mins are often tiny): every binary16 value is an f32, so the device must
/// convert them exactly, as the CPU does, not flush them to zero (the wgpu shaders convert with
/// `unpack2x16float`, common.wgsl). Every format with f16 scales, decode-sized and batched T.
#[test]
fn subnormal_scales_match_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(67);
        for ty in WEIGHT_TYPES {
            let at = f16_scale_offsets(ty);
            if at.is_empty() {
                continue;
            }
            let (n_out, n_in) = (40usize, 512usize);
            let mut bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
            for blk in bytes.chunks_exact_mut(ty.type_size() as usize) {
                for &o in at {
                    // A subnormal of either sign: exponent 0, mantissa 1..1023.
                    let h = (1 + rng.below(0x3ff) as u16) | (rng.below(2) as u16) << 15;
                    blk[o..o + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
            matmul_case(&p, ty, &bytes, n_out, n_in, &[1, 3, 9], &mut rng);
        }
    }
}

/// `DType::F32` weights (router, shared-expert gate) go through the `f32` format.
#[test]
fn matmul_f32_tensor_weight() {
    for p in Both::each() {
        let mut rng = Rng::new(11);
        for (n_out, n_in, n_tok) in [(1usize, 64usize, 5usize), (300, 96, 9), (17, 33, 1)] {
            let w = rng.normals(n_out * n_in, 0.3);
            let x = rng.normals(n_tok * n_in, 1.0);
            let (wt, xt, out) = (
                p.up(&w, &[n_out, n_in]),
                p.up(&x, &[n_tok, n_in]),
                p.zeros(&[n_tok, n_out]),
            );
            p.run("matmul F32 tensor", |be, s| be.matmul(wt.on(s), xt.on(s), out.on(s)));
            let (got, want) = p.read(&out);
            check_matmul(
                p.dev.as_ref(),
                &format!("{} matmul F32 tensor", p.name()),
                &got,
                &want,
                &w,
                &x,
                n_in,
            );
        }
    }
}

/// The two weights of `matmul_swiglu` on both backends, and the values the kernels see.
struct GateUp {
    name: String,
    gate: Pt,
    up: Pt,
    gate_deq: Vec<f32>,
    up_deq: Vec<f32>,
}

/// The FFN's input side in one op, `silu(W_gate x) * (W_up x)`, for every weight format.
#[test]
fn matmul_swiglu_every_type_matches_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(29);
        let (n_ff, n_in) = (37usize, 256usize);
        let mut cases = Vec::new();
        for ty in WEIGHT_TYPES {
            cases.push(gate_up(&p, ty, n_ff, n_in, &mut rng));
        }
        let (gv, uv) = (rng.normals(n_ff * n_in, 0.3), rng.normals(n_ff * n_in, 0.3));
        cases.push(GateUp {
            name: "F32 tensor".into(),
            gate: p.up(&gv, &[n_ff, n_in]),
            up: p.up(&uv, &[n_ff, n_in]),
            gate_deq: gv,
            up_deq: uv,
        });
        for c in &cases {
            swiglu_case(&p, c, n_in, n_ff, &[1, 3, 64, 65, 200], &mut rng);
        }
    }
}

/// `matmul_swiglu` of one gate/up pair for each token count in `tokens`, against the CPU.
fn swiglu_case(p: &Both, c: &GateUp, n_in: usize, n_ff: usize, tokens: &[usize], rng: &mut Rng) {
    for &t in tokens {
        let x = rng.normals(t * n_in, 1.0);
        let what = format!("{} matmul_swiglu {} T {t}", p.name(), c.name);
        let out = swiglu_run(p, c, &p.up(&x, &[t, n_in]), t, n_ff, &what);
        let (got, want) = p.read(&out);
        swiglu_check(p, c, &x, n_ff, &got, &want, &what);
    }
}

/// `matmul_swiglu` of `t` tokens `xt` on both backends; its output.
fn swiglu_run(p: &Both, c: &GateUp, xt: &Pt, t: usize, n_ff: usize, what: &str) -> Pt {
    let (gate_tmp, up_tmp, out) = (p.zeros(&[t, n_ff]), p.zeros(&[t, n_ff]), p.zeros(&[t, n_ff]));
    p.run(what, |be, s| {
        compose::matmul_swiglu(
            be,
            c.gate.on(s),
            c.up.on(s),
            xt.on(s),
            gate_tmp.on(s),
            up_tmp.on(s),
            out.on(s),
        )
    });
    out
}

/// A `matmul_swiglu` output of x (`[T, n_in]`) on the device (`got`) against the CPU's (`want`).
fn swiglu_check(p: &Both, c: &GateUp, x: &[f32], n_ff: usize, got: &[f32], want: &[f32], what: &str) {
    let n_in = c.gate_deq.len() / n_ff;
    let t = x.len() / n_in;
    // Error model: each product is within δ = `product_tolerance` of the CPU's
    // (matmul above); out = silu(g) u then moves by at most
    // 1.1 δg (|u| + δu) + |silu(g)| δu (|silu'| <= 1.1 everywhere), plus the few-ulp
    // 1e-5 relative of the swiglu itself.
    let (rel, floor) = product_tolerance(p.dev.as_ref());
    for tt in 0..t {
        let xr = &x[tt * n_in..(tt + 1) * n_in];
        let x_abs: f64 = xr.iter().map(|v| v.abs() as f64).sum();
        for o in 0..n_ff {
            // (value, its product's error bound)
            let dot = |m: &[f32]| -> (f64, f64) {
                let row = &m[o * n_in..(o + 1) * n_in];
                let prods = row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64);
                let (v, mag) = prods.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
                let w_abs: f64 = row.iter().map(|a| a.abs() as f64).sum();
                (v, rel * mag + floor * (w_abs + x_abs))
            };
            let ((g, dg), (u, du)) = (dot(&c.gate_deq), dot(&c.up_deq));
            let (gi, wi) = (got[tt * n_ff + o], want[tt * n_ff + o]);
            let tol = 1.1 * dg * (u.abs() + du) + silu(g).abs() * du + 1e-5 * wi.abs() as f64 + 1e-30;
            assert!(
                ((gi - wi) as f64).abs() <= tol,
                "{what} [t {tt}, o {o}]: device {gi} cpu {wi} (tol {tol:.3e})"
            );
        }
    }
}

/// A gate/up pair of format `ty`, `[n_ff, n_in]`, on both backends.
fn gate_up(p: &Both, ty: GgmlType, n_ff: usize, n_in: usize, rng: &mut Rng) -> GateUp {
    let (bg, bu) = (
        random_weight(ty, n_ff, n_in, 0.5, rng),
        random_weight(ty, n_ff, n_in, 0.5, rng),
    );
    GateUp {
        name: format!("{ty}"),
        gate: upload_both(p, ty, &[n_ff, n_in], &bg),
        up: upload_both(p, ty, &[n_ff, n_in], &bu),
        gate_deq: dequant(ty, &bg, n_ff * n_in),
        up_deq: dequant(ty, &bu, n_ff * n_in),
    }
}

/// With the packed-dot units (`RILL_TEST_WGPU=dot`, scripts/test.sh's MV-geometry passes; by default
/// where the adapter runs them natively) and with fusion on, the wgpu `matmul_swiglu` of one token writes its output's packed-dot
/// planes (matvec_swiglu_xq.wgsl: a workgroup owns whole 32-row blocks and writes them from
/// workgroup memory, each block whole) and the FFN's down product reads them instead
/// of quantizing the output again: they must be what `mv_dot_prep` makes of the output, bit for
/// bit. Judged through Q4_K and Q6_K down products: with the SwiGLU's planes, then (after a read
/// drops them) with the product's own prep; the down product against the dequantized weight
/// times the device's output, the SwiGLU against the CPU. Rows of 512 (8 units: 32 rows per
/// pass at the default geometry, one pass), 768 (2 passes) and 2048 (4 passes), 256 (short rows:
/// no fused kernel); 256 to 2048 outputs; one token and three (no fused kernel, no planes); gate
/// and up in the dot formats and in Q5_K (f32 units that write planes for a dot down product).
/// On CUDA the same holds for the tensor-core SwiGLU's prepared copies (kernels-cuda/out_prep.cuh:
/// the last block of each slice of 256 outputs prepares it, for 1 and 3 tokens), Q8_0 downs too.
/// scripts/test.sh runs it under the geometry knobs' extremes, whose workgroups hold 64 to 256
/// rows (several blocks in one pass).
#[test]
fn swiglu_written_planes_match_the_down_products_own_prep() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(75);
        for (ty, n_in, n_ff) in [
            (Q4K, 512usize, 768usize),
            (Q4K, 2048, 1280),
            (Q6K, 768, 1280),
            (Q6K, 512, 256),
            (Q5K, 768, 768),
            (Q4K, 256, 768),
            // CUDA: the tensor-core SwiGLU prepares whole slices of 256 outputs for the down
            // products of every tensor-core format (Q6_K's take rows of a multiple of 2048).
            (Q4K, 512, 2048),
            (Q8_0, 512, 768),
            (Q6K, 2048, 512),
        ] {
            let c = gate_up(&p, ty, n_ff, n_in, &mut rng);
            for t in [1usize, 3] {
                for down in [Q4K, Q6K, Q8_0] {
                    let n_out = 5;
                    let bd = random_weight(down, n_out, n_ff, 0.5, &mut rng);
                    let wd = upload_both(&p, down, &[n_out, n_ff], &bd);
                    let what = format!("{} {ty} swiglu [{n_ff}, {n_in}] T {t}, {down} down", p.name());
                    let x = rng.normals(t * n_in, 1.0);
                    let act = swiglu_run(&p, &c, &p.up(&x, &[t, n_in]), t, n_ff, &what);
                    let out = p.zeros(&[t, n_out]);
                    // Nothing read back before the down product (a host access drops the planes).
                    p.run("down", |be, s| be.matmul(wd.on(s), act.on(s), out.on(s)));
                    let got = p.dev.read_f32(&out.dev).expect("device read");
                    assert_own_prep_agrees(&p, &what, &wd, &act, &got);
                    let (ad, ac) = p.read(&act);
                    swiglu_check(&p, &c, &x, n_ff, &ad, &ac, &what);
                    let wf = dequant(down, &bd, n_out * n_ff);
                    check_matmul(p.dev.as_ref(), &what, &got, &product(&wf, &ad, n_ff), &wf, &ad, n_ff);
                }
            }
        }
    }
}

/// ggml's stored blocks from `quants.gguf` (8 rows of 512; row 5 has f16-subnormal scales and
/// some rows all-zero blocks) through `matmul` and `embed`.
#[test]
fn stored_ggml_blocks_match_cpu() {
    for p in Both::each() {
        let file = rill::gguf::GgufFile::open(fixture("quants.gguf")).expect("open quants.gguf");
        let mut rng = Rng::new(13);
        let (rows, cols) = (8usize, 512usize);
        let mut seen = 0;
        for ty in WEIGHT_TYPES {
            let Some(info) = file.tensor(&format!("q.{}", ty.name())) else {
                continue;
            };
            seen += 1;
            assert_eq!(info.ggml_type, ty);
            assert_eq!(info.ne, vec![cols as u64, rows as u64]);
            let bytes = file.tensor_data(info).to_vec();
            matmul_case(&p, ty, &bytes, rows, cols, &TOKEN_COUNTS, &mut rng);

            // Embedding every row: pure dequantization, equal up to FMA contraction of d*q - m.
            let ids = [5u32, 0, 7, 5, 1, 2, 3, 4, 6];
            let table = upload_both(&p, ty, &[rows, cols], &bytes);
            let (got, want) = embed_both(&p, &table, &ids, cols);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_close(
                &format!("{} embed {ty} stored", p.name()),
                &got,
                &want,
                1e-6 * scale,
                1e-6,
            );
            // Row 5 exercises the f16-subnormal scales exactly (no d*q - m form for most types).
            let row5 = &want[..cols];
            assert!(row5.iter().any(|&v| v != 0.0), "{ty}: row 5 is all zero");
        }
        assert!(seen >= 14, "quants.gguf: only {seen} types found");
    }
}

/// Run `embed` on both backends; returns (device, CPU) outputs.
fn embed_both(p: &Both, table: &Pt, ids: &[u32], d: usize) -> (Vec<f32>, Vec<f32>) {
    let n = ids.len();
    let (it, out) = (p.up_u32(ids, &[n]), p.zeros(&[n, d]));
    p.run("embed", |be, s| be.embed(table.on(s), it.on(s), out.on(s)));
    p.read(&out)
}

#[test]
fn embed_every_type_matches_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(17);
        for ty in WEIGHT_TYPES {
            let d = if ty.block_size() == 256 { 512 } else { 96 };
            let vocab = 37;
            let bytes = random_weight(ty, vocab, d, 0.5, &mut rng);
            let table = upload_both(&p, ty, &[vocab, d], &bytes);
            for ids in [&[17u32][..], &[0, 36, 5], &[0, 36, 5, 5, 17, 1]] {
                let (got, want) = embed_both(&p, &table, ids, d);
                let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert_close(
                    &format!("{} embed {ty} T {}", p.name(), ids.len()),
                    &got,
                    &want,
                    1e-6 * scale,
                    1e-6,
                );
            }
        }
        // A DType::F32 table is exact, for T up to 65.
        let t = rng.normals(10 * 8, 1.0);
        let table = p.up(&t, &[10, 8]);
        let ids: Vec<u32> = (0..65).map(|_| rng.below(10) as u32).collect();
        let (got, want) = embed_both(&p, &table, &ids, 8);
        assert_eq!(got, want, "{} embed F32 table", p.name());
    }
}

/// Ids past the vocabulary never read out of bounds: the device refuses them or writes a zero
/// row (the wgpu backend: no error path inside a shader); the other rows are the table's.
#[test]
fn embed_out_of_range_id_is_refused_or_zero() {
    for p in Both::each() {
        let g = p.dev.as_ref();
        let mut rng = Rng::new(19);
        let (vocab, d) = (4usize, 64usize);
        let bytes = random_weight(GgmlType::Q8_0, vocab, d, 0.5, &mut rng);
        let t = upload(g, GgmlType::Q8_0, &[vocab, d], &bytes);
        let ids = g.upload_u32(&[1, 4, u32::MAX, 3], &[4]).expect("up");
        let out = g.alloc(DType::F32, &[4, d]).expect("alloc");
        if g.embed(&t, &ids, &out).is_err() {
            continue;
        }
        let y = g.read_f32(&out).expect("read");
        let wf = dequant(GgmlType::Q8_0, &bytes, vocab * d);
        assert_eq!(&y[..d], &wf[d..2 * d], "{}", p.name());
        assert!(y[d..3 * d].iter().all(|&v| v == 0.0), "{}", p.name());
        assert_eq!(&y[3 * d..], &wf[3 * d..], "{}", p.name());
    }
}

/// A format the backend has no kernel for (Q8_1, an activation format): refused at upload or at
/// the op, with an error naming it.
fn unsupported_format_refused(be: &dyn Backend, shape: &[usize], op: impl Fn(&Tensor) -> rill::Result<()>) {
    let q81 = WeightData {
        name: "q8_1".into(),
        ggml_type: GgmlType::Q8_1,
        shape: shape.to_vec(),
        bytes: TensorBytes::from_vec(vec![0u8; shape.iter().product::<usize>() / 32 * 36]),
    };
    let err = match be.upload_weight(&q81) {
        Err(e) => e,
        Ok(w) => op(&w).expect_err("Q8_1 must be refused"),
    };
    assert!(err.to_string().contains("Q8_1"), "{}: {err}", be.name());
}

#[test]
fn shape_dtype_and_alias_errors() {
    for be in common::backends() {
        let g = be.as_ref();
        let name = g.name();
        let mut rng = Rng::new(23);
        let bytes = random_weight(GgmlType::Q4_0, 4, 64, 0.5, &mut rng);
        let w = upload(g, GgmlType::Q4_0, &[4, 64], &bytes);
        let x = up(g, &rng.normals(2 * 64, 1.0), &[2, 64]);
        let out = g.alloc(DType::F32, &[2, 4]).expect("alloc");
        g.matmul(&w, &x, &out).expect("valid matmul");
        let f = |shape: &[usize]| g.alloc(DType::F32, shape).expect("alloc");
        let refused = |r: rill::Result<()>, what: &str| assert!(r.is_err(), "{name}: {what} must be refused");

        // Shapes.
        refused(g.matmul(&w, &f(&[2, 32]), &out), "n_in mismatch");
        refused(g.matmul(&w, &x, &f(&[3, 4])), "T mismatch");
        refused(g.matmul(&w, &x, &f(&[2, 5])), "n_out mismatch");
        // A DType::F32 weight is checked the same way.
        let wf = up(g, &rng.normals(4 * 32, 1.0), &[4, 32]);
        refused(g.matmul(&wf, &x, &out), "F32 weight n_in mismatch");

        // Dtypes.
        let xu = g.alloc(DType::U32, &[2, 64]).expect("alloc");
        refused(g.matmul(&w, &xu, &out), "U32 x");
        let outu = g.alloc(DType::U32, &[2, 4]).expect("alloc");
        refused(g.matmul(&w, &x, &outu), "U32 out");
        let wu = g.alloc(DType::U32, &[4, 64]).expect("alloc");
        refused(g.matmul(&wu, &x, &out), "U32 weight");
        unsupported_format_refused(g, &[4, 64], |q| g.matmul(q, &x, &out));

        // Aliasing: out must not share a buffer with x (or the weight).
        let sq = up(g, &rng.normals(4 * 4, 1.0), &[4, 4]);
        let sq_w = up(g, &rng.normals(4 * 4, 1.0), &[4, 4]);
        refused(g.matmul(&sq_w, &sq, &sq), "out aliases x");
        refused(g.matmul(&sq, &sq_w, &sq), "out aliases W");

        // matmul_swiglu: the two weights differ, scratch of the wrong size, aliasing.
        let (gt, ut, o) = (f(&[2, 4]), f(&[2, 4]), f(&[2, 4]));
        compose::matmul_swiglu(g, &w, &w, &x, &gt, &ut, &o).expect("valid matmul_swiglu");
        let w8 = upload(
            g,
            GgmlType::Q4_0,
            &[8, 64],
            &random_weight(GgmlType::Q4_0, 8, 64, 0.5, &mut rng),
        );
        refused(compose::matmul_swiglu(g, &w, &w8, &x, &gt, &ut, &o), "W_up shape");
        refused(
            compose::matmul_swiglu(g, &w, &w, &x, &f(&[2, 3]), &ut, &o),
            "gate_tmp size",
        );
        refused(compose::matmul_swiglu(g, &w, &w, &x, &gt, &ut, &f(&[3, 4])), "out size");
        refused(
            compose::matmul_swiglu(g, &w, &w, &x, &gt, &gt, &o),
            "gate_tmp is up_tmp",
        );
        refused(compose::matmul_swiglu(g, &w, &w, &x, &gt, &ut, &gt), "out is gate_tmp");

        // embed.
        let ids = g.upload_u32(&[0, 3], &[2]).expect("up");
        let e_out = f(&[2, 64]);
        g.embed(&w, &ids, &e_out).expect("valid embed");
        refused(g.embed(&w, &ids, &f(&[2, 32])), "d mismatch");
        refused(g.embed(&w, &ids, &f(&[3, 64])), "T mismatch");
        refused(g.embed(&w, &up(g, &[0.0, 3.0], &[2]), &e_out), "F32 ids");
        refused(g.embed(&wu, &ids, &e_out), "U32 table");
        unsupported_format_refused(g, &[4, 64], |q| g.embed(q, &ids, &e_out));
        let t32 = up(g, &rng.normals(8, 1.0), &[4, 2]);
        refused(g.embed(&t32, &ids, &t32), "out aliases table");
    }
}
