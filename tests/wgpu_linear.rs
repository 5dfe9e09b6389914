//! wgpu `matmul` and `embed` for every weight format, against the CPU backend.

mod common;

use std::path::PathBuf;

use common::*;
use rill::backend::{Backend, DType, Tensor, WeightData};
use rill::gguf::{GgmlType, TensorBytes};
use rill::quant;

/// Every weight type the CPU backend runs.
const TYPES: [GgmlType; 16] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
];

/// A small normal f16 (about 0.002..0.01), little-endian.
fn small_f16(rng: &mut Rng) -> [u8; 2] {
    half::f16::from_f32(0.002 + 0.008 * rng.uniform())
        .to_bits()
        .to_le_bytes()
}

/// `rows` rows of `cols` elements of `ty`: quantized random normals where rill has a quantizer,
/// otherwise random blocks whose scale fields are set to sane values.
fn weight_bytes(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if quant::can_quantize(ty) {
        let src = rng.normals(rows * cols, 0.5);
        let mut dst = vec![0u8; ty.row_size(cols as u64).unwrap() as usize * rows];
        quant::quantize_rows_par(ty, &src, cols, &mut dst).unwrap();
        return dst;
    }
    let bs = ty.type_size() as usize;
    let n = ty.row_size(cols as u64).unwrap() as usize * rows;
    let mut b: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
    for blk in b.chunks_exact_mut(bs) {
        match ty {
            GgmlType::Q2K => {
                let (d, m) = (small_f16(rng), small_f16(rng));
                blk[80..82].copy_from_slice(&d);
                blk[82..84].copy_from_slice(&m);
            }
            GgmlType::Q3K => blk[108..110].copy_from_slice(&small_f16(rng)),
            GgmlType::Iq4Nl | GgmlType::Iq4Xs => blk[0..2].copy_from_slice(&small_f16(rng)),
            // E8M0 exponent near 2^0: values up to about +-12 * 2^-4.
            GgmlType::Mxfp4 => blk[0] = 118 + (rng.next_u64() % 8) as u8,
            _ => unreachable!("{ty}"),
        }
    }
    b
}

fn upload(be: &dyn Backend, ty: GgmlType, shape: &[usize], bytes: &[u8]) -> Tensor {
    be.upload_weight(&WeightData {
        name: format!("w.{ty}"),
        ggml_type: ty,
        shape: shape.to_vec(),
        bytes: TensorBytes::from_vec(bytes.to_vec()),
    })
    .unwrap_or_else(|e| panic!("upload {ty}: {e}"))
}

fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    quant::dequantize(ty, bytes, &mut y).unwrap();
    y
}

/// Compare wgpu and CPU `matmul` outputs: `|g - c| <= 1e-5 * sum_i |w_i x_i|` per output (the
/// bound of f32 summation-order differences), plus a tiny absolute floor.
fn check_matmul(what: &str, got: &[f32], want: &[f32], w: &[f32], x: &[f32], n_in: usize) {
    let n_out = w.len() / n_in;
    let n_tok = x.len() / n_in;
    assert_eq!(got.len(), n_tok * n_out, "{what}: length");
    for t in 0..n_tok {
        for o in 0..n_out {
            let mag: f32 = (0..n_in).map(|i| (w[o * n_in + i] * x[t * n_in + i]).abs()).sum();
            let (g, c) = (got[t * n_out + o], want[t * n_out + o]);
            assert!(
                (g - c).abs() <= 1e-5 * mag + 1e-30,
                "{what} [t {t}, o {o}]: wgpu {g} cpu {c} (sum |w x| {mag})"
            );
        }
    }
}

/// Run `matmul` on both backends for one weight and all the token counts.
fn matmul_case(g: &dyn Backend, c: &dyn Backend, ty: GgmlType, bytes: &[u8], n_out: usize, n_in: usize, rng: &mut Rng) {
    let (gw, cw) = (
        upload(g, ty, &[n_out, n_in], bytes),
        upload(c, ty, &[n_out, n_in], bytes),
    );
    let wf = dequant(ty, bytes, n_out * n_in);
    for n_tok in [1usize, 3, 8, 9, 65] {
        let x = rng.normals(n_tok * n_in, 1.0);
        let (gx, cx) = (up(g, &x, &[n_tok, n_in]), up(c, &x, &[n_tok, n_in]));
        let go = g.alloc(DType::F32, &[n_tok, n_out]).unwrap();
        let co = c.alloc(DType::F32, &[n_tok, n_out]).unwrap();
        g.matmul(&gw, &gx, &go)
            .unwrap_or_else(|e| panic!("wgpu matmul {ty}: {e}"));
        c.matmul(&cw, &cx, &co)
            .unwrap_or_else(|e| panic!("cpu matmul {ty}: {e}"));
        let what = format!("matmul {ty} [{n_out}, {n_in}] T {n_tok}");
        check_matmul(
            &what,
            &g.read_f32(&go).unwrap(),
            &c.read_f32(&co).unwrap(),
            &wf,
            &x,
            n_in,
        );
    }
}

#[test]
fn matmul_every_type_matches_cpu() {
    let (g, c) = (wgpu(), cpu());
    let mut rng = Rng::new(7);
    for ty in TYPES {
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
                let bytes = weight_bytes(ty, n_out, n_in, &mut rng);
                matmul_case(g.as_ref(), c.as_ref(), ty, &bytes, n_out, n_in, &mut rng);
            }
        }
    }
}

/// `DType::F32` weights (router, shared-expert gate) go through the `f32` format.
#[test]
fn matmul_f32_tensor_weight() {
    let (g, c) = (wgpu(), cpu());
    let mut rng = Rng::new(11);
    for (n_out, n_in, n_tok) in [(1usize, 64usize, 5usize), (300, 96, 9), (17, 33, 1)] {
        let w = rng.normals(n_out * n_in, 0.3);
        let x = rng.normals(n_tok * n_in, 1.0);
        let go = g.alloc(DType::F32, &[n_tok, n_out]).unwrap();
        let co = c.alloc(DType::F32, &[n_tok, n_out]).unwrap();
        g.matmul(
            &up(g.as_ref(), &w, &[n_out, n_in]),
            &up(g.as_ref(), &x, &[n_tok, n_in]),
            &go,
        )
        .unwrap();
        c.matmul(
            &up(c.as_ref(), &w, &[n_out, n_in]),
            &up(c.as_ref(), &x, &[n_tok, n_in]),
            &co,
        )
        .unwrap();
        check_matmul(
            "matmul F32 tensor",
            &g.read_f32(&go).unwrap(),
            &c.read_f32(&co).unwrap(),
            &w,
            &x,
            n_in,
        );
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// ggml's stored blocks from `quants.gguf` (8 rows of 512; row 5 has f16-subnormal scales and
/// some rows all-zero blocks) through `matmul` and `embed`.
#[test]
fn stored_ggml_blocks_match_cpu() {
    let (g, c) = (wgpu(), cpu());
    let file = rill::gguf::GgufFile::open(fixture("quants.gguf")).expect("open quants.gguf");
    let mut rng = Rng::new(13);
    let (rows, cols) = (8usize, 512usize);
    let mut seen = 0;
    for ty in TYPES {
        let Some(info) = file.tensor(&format!("q.{}", ty.name())) else {
            continue;
        };
        seen += 1;
        assert_eq!(info.ggml_type, ty);
        assert_eq!(info.ne, vec![cols as u64, rows as u64]);
        let bytes = file.tensor_data(info).to_vec();
        matmul_case(g.as_ref(), c.as_ref(), ty, &bytes, rows, cols, &mut rng);

        // Embedding every row: pure dequantization, equal up to FMA contraction of d*q - m.
        let ids = [5u32, 0, 7, 5, 1, 2, 3, 4, 6];
        let (gt, ct) = (
            upload(g.as_ref(), ty, &[rows, cols], &bytes),
            upload(c.as_ref(), ty, &[rows, cols], &bytes),
        );
        let want = embed_both(g.as_ref(), c.as_ref(), &gt, &ct, &ids, cols);
        let got = want.0;
        let scale = want.1.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_close(&format!("embed {ty} stored"), &got, &want.1, 1e-6 * scale, 1e-6);
        // Row 5 exercises the f16-subnormal scales exactly (no d*q - m form for most types).
        let row5 = &want.1[..cols];
        assert!(row5.iter().any(|&v| v != 0.0), "{ty}: row 5 is all zero");
    }
    assert!(seen >= 14, "quants.gguf: only {seen} types found");
}

/// Run `embed` on both backends; returns (wgpu, cpu) outputs.
fn embed_both(
    g: &dyn Backend,
    c: &dyn Backend,
    gt: &Tensor,
    ct: &Tensor,
    ids: &[u32],
    d: usize,
) -> (Vec<f32>, Vec<f32>) {
    let n = ids.len();
    let (gi, ci) = (g.upload_u32(ids, &[n]).unwrap(), c.upload_u32(ids, &[n]).unwrap());
    let go = g.alloc(DType::F32, &[n, d]).unwrap();
    let co = c.alloc(DType::F32, &[n, d]).unwrap();
    g.embed(gt, &gi, &go).unwrap_or_else(|e| panic!("wgpu embed: {e}"));
    c.embed(ct, &ci, &co).unwrap_or_else(|e| panic!("cpu embed: {e}"));
    (g.read_f32(&go).unwrap(), c.read_f32(&co).unwrap())
}

#[test]
fn embed_every_type_matches_cpu() {
    let (g, c) = (wgpu(), cpu());
    let mut rng = Rng::new(17);
    for ty in TYPES {
        let d = if ty.block_size() == 256 { 512 } else { 96 };
        let vocab = 37;
        let bytes = weight_bytes(ty, vocab, d, &mut rng);
        let (gt, ct) = (
            upload(g.as_ref(), ty, &[vocab, d], &bytes),
            upload(c.as_ref(), ty, &[vocab, d], &bytes),
        );
        let ids = [0u32, 36, 5, 5, 17, 1];
        let (got, want) = embed_both(g.as_ref(), c.as_ref(), &gt, &ct, &ids, d);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_close(&format!("embed {ty}"), &got, &want, 1e-6 * scale, 1e-6);
    }
    // A DType::F32 table is exact.
    let t = rng.normals(10 * 8, 1.0);
    let (got, want) = embed_both(
        g.as_ref(),
        c.as_ref(),
        &up(g.as_ref(), &t, &[10, 8]),
        &up(c.as_ref(), &t, &[10, 8]),
        &[9, 0, 3],
        8,
    );
    assert_eq!(got, want);
}

/// Ids past the vocabulary never read out of bounds: the wgpu backend writes a zero row (the CPU
/// backend returns an error; the executor never produces such ids).
#[test]
fn embed_out_of_range_id_gives_zero_row() {
    let g = wgpu();
    let mut rng = Rng::new(19);
    let (vocab, d) = (4usize, 64usize);
    let bytes = weight_bytes(GgmlType::Q8_0, vocab, d, &mut rng);
    let t = upload(g.as_ref(), GgmlType::Q8_0, &[vocab, d], &bytes);
    let ids = g.upload_u32(&[1, 4, u32::MAX, 3], &[4]).unwrap();
    let out = g.alloc(DType::F32, &[4, d]).unwrap();
    g.embed(&t, &ids, &out).unwrap();
    let y = g.read_f32(&out).unwrap();
    let wf = dequant(GgmlType::Q8_0, &bytes, vocab * d);
    assert_eq!(&y[..d], &wf[d..2 * d]);
    assert!(y[d..3 * d].iter().all(|&v| v == 0.0));
    assert_eq!(&y[3 * d..], &wf[3 * d..]);
}

#[test]
fn shape_dtype_and_alias_errors() {
    let g = wgpu();
    let mut rng = Rng::new(23);
    let bytes = weight_bytes(GgmlType::Q4_0, 4, 64, &mut rng);
    let w = upload(g.as_ref(), GgmlType::Q4_0, &[4, 64], &bytes);
    let x = up(g.as_ref(), &rng.normals(2 * 64, 1.0), &[2, 64]);
    let out = g.alloc(DType::F32, &[2, 4]).unwrap();
    g.matmul(&w, &x, &out).expect("valid matmul");

    // Shapes.
    let x_bad = up(g.as_ref(), &rng.normals(2 * 32, 1.0), &[2, 32]);
    assert!(g.matmul(&w, &x_bad, &out).is_err(), "n_in mismatch");
    let out_bad = g.alloc(DType::F32, &[3, 4]).unwrap();
    assert!(g.matmul(&w, &x, &out_bad).is_err(), "T mismatch");
    let out_bad = g.alloc(DType::F32, &[2, 5]).unwrap();
    assert!(g.matmul(&w, &x, &out_bad).is_err(), "n_out mismatch");
    // A DType::F32 weight is checked the same way.
    let wf = up(g.as_ref(), &rng.normals(4 * 32, 1.0), &[4, 32]);
    assert!(g.matmul(&wf, &x, &out).is_err(), "F32 weight n_in mismatch");

    // Dtypes.
    let xu = g.alloc(DType::U32, &[2, 64]).unwrap();
    assert!(g.matmul(&w, &xu, &out).is_err(), "U32 x");
    let outu = g.alloc(DType::U32, &[2, 4]).unwrap();
    assert!(g.matmul(&w, &x, &outu).is_err(), "U32 out");
    let wu = g.alloc(DType::U32, &[4, 64]).unwrap();
    assert!(g.matmul(&wu, &x, &out).is_err(), "U32 weight");
    // A type the backend has no dequantizer for (Q8_1 uploads fine: 36-byte blocks of 32).
    let q81 = upload(g.as_ref(), GgmlType::Q8_1, &[4, 64], &vec![0u8; 4 * 2 * 36]);
    let err = g.matmul(&q81, &x, &out).expect_err("Q8_1");
    assert!(err.to_string().contains("Q8_1"), "{err}");

    // Aliasing: out must not share a buffer with x (or the weight).
    let sq = up(g.as_ref(), &rng.normals(4 * 4, 1.0), &[4, 4]);
    let sq_w = up(g.as_ref(), &rng.normals(4 * 4, 1.0), &[4, 4]);
    assert!(g.matmul(&sq_w, &sq, &sq).is_err(), "out aliases x");
    assert!(g.matmul(&sq, &sq_w, &sq).is_err(), "out aliases W");

    // embed.
    let ids = g.upload_u32(&[0, 3], &[2]).unwrap();
    let e_out = g.alloc(DType::F32, &[2, 64]).unwrap();
    g.embed(&w, &ids, &e_out).expect("valid embed");
    let e_bad = g.alloc(DType::F32, &[2, 32]).unwrap();
    assert!(g.embed(&w, &ids, &e_bad).is_err(), "d mismatch");
    let e_bad = g.alloc(DType::F32, &[3, 64]).unwrap();
    assert!(g.embed(&w, &ids, &e_bad).is_err(), "T mismatch");
    let ids_f = up(g.as_ref(), &[0.0, 3.0], &[2]);
    assert!(g.embed(&w, &ids_f, &e_out).is_err(), "F32 ids");
    assert!(g.embed(&wu, &ids, &e_out).is_err(), "U32 table");
    assert!(g.embed(&q81, &ids, &e_out).is_err(), "Q8_1 table");
    let t32 = up(g.as_ref(), &rng.normals(8, 1.0), &[4, 2]);
    assert!(g.embed(&t32, &ids, &t32).is_err(), "out aliases table");
}

/// `matmul_swiglu` (one dispatch for a token on wgpu) against the CPU's gate and up matmuls and
/// swiglu. Bound: with |Δg|, |Δu| <= 1e-5 sum |w x| (check_matmul's bound) and silu' <= 1.1,
/// |Δ(silu(g) u)| <= 1.1 |Δg| |u| + |silu(g)| |Δu|.
#[test]
fn matmul_swiglu_matches_cpu() {
    let (g, c) = (wgpu(), cpu());
    let (g, c) = (g.as_ref(), c.as_ref());
    let mut rng = Rng::new(29);
    let silu = |v: f32| v / (1.0 + (-v).exp());
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q4_0,
    ] {
        let (n_ff, n_in) = (301usize, 512usize);
        let gb = weight_bytes(ty, n_ff, n_in, &mut rng);
        let ub = weight_bytes(ty, n_ff, n_in, &mut rng);
        let (wg, wu) = (dequant(ty, &gb, n_ff * n_in), dequant(ty, &ub, n_ff * n_in));
        let (ggw, guw) = (upload(g, ty, &[n_ff, n_in], &gb), upload(g, ty, &[n_ff, n_in], &ub));
        let (cgw, cuw) = (upload(c, ty, &[n_ff, n_in], &gb), upload(c, ty, &[n_ff, n_in], &ub));
        for t in [1usize, 3] {
            let x = rng.normals(t * n_in, 1.0);
            let run = |be: &dyn Backend, gw: &Tensor, uw: &Tensor| {
                let f = |shape: &[usize]| be.alloc(DType::F32, shape).unwrap();
                let (gt, ut, out) = (f(&[t, n_ff]), f(&[t, n_ff]), f(&[t, n_ff]));
                let xt = up(be, &x, &[t, n_in]);
                be.matmul_swiglu(gw, uw, &xt, &gt, &ut, &out)
                    .unwrap_or_else(|e| panic!("{} matmul_swiglu {ty}: {e}", be.name()));
                be.read_f32(&out).unwrap()
            };
            let (got, want) = (run(g, &ggw, &guw), run(c, &cgw, &cuw));
            for tt in 0..t {
                for o in 0..n_ff {
                    let xr = &x[tt * n_in..(tt + 1) * n_in];
                    let dot = |w: &[f32]| -> (f32, f32) {
                        let row = &w[o * n_in..(o + 1) * n_in];
                        (
                            row.iter().zip(xr).map(|(a, b)| a * b).sum(),
                            row.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum(),
                        )
                    };
                    let ((gv, gm), (uv, um)) = (dot(&wg), dot(&wu));
                    let tol = 1.1 * 1e-5 * gm * uv.abs() + silu(gv).abs() * 1e-5 * um + 1e-5 * 1e-5 * gm * um + 1e-30;
                    let (a, b) = (got[tt * n_ff + o], want[tt * n_ff + o]);
                    assert!(
                        (a - b).abs() <= tol,
                        "matmul_swiglu {ty} t={tt}/{t} o={o}: {a} vs {b} (tol {tol})"
                    );
                }
            }
        }
    }
}
