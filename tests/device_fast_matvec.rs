//! The fast tier's decode products on cuda (kernels-cuda/matvec_q8.cuh, selected here with
//! `RILL_CUDA_MATVEC=q8`): `matmul` for a few tokens and the fused `matmul_swiglu`, for every
//! format with a q8 kernel, against the product of the dequantized weights with x quantized as the
//! kernels quantize it (8 bits per element, one scale per 32). That reference makes the check as
//! tight as the exact kernels' (1e-5 of the sum of |terms|); a second check bounds the distance
//! to the CPU's f32 result by the quantization error itself. Skipped, with a note, where there is
//! no NVIDIA GPU. A test binary of its own: the variant is read once per process.

mod common;

use std::sync::{Arc, Once};

use common::weights::{dequant, random_weight, upload};
use common::Rng;
use rill::backend::compose;
use rill::backend::{Backend, DType};
use rill::gguf::GgmlType;

/// The shared cuda backend running the q8 kernels, or None without a GPU.
fn fast_cuda() -> Option<Arc<dyn Backend>> {
    static SET: Once = Once::new();
    SET.call_once(|| std::env::set_var("RILL_CUDA_MATVEC", "q8"));
    let be = common::cuda();
    if be.is_none() {
        eprintln!("skipped: no CUDA device");
    }
    be
}

/// x quantized per 32 as matvec_q8.cuh does (the same f32 operations), dequantized, in f64.
fn quantized(x: &[f32]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for u in x.chunks(32) {
        let amax = u.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (id, d) = if amax > 0.0 {
            (127.0f32 / amax, amax / 127.0f32)
        } else {
            (0.0, 0.0)
        };
        out.extend(u.iter().map(|&v| d as f64 * (v * id).round_ties_even() as f64));
    }
    out
}

/// Row `o` of `w` `[rows, n]` dotted with `x`: (sum, sum of |terms|).
fn dot(w: &[f32], o: usize, n: usize, x: &[f64]) -> (f64, f64) {
    w[o * n..(o + 1) * n]
        .iter()
        .zip(x)
        .fold((0.0, 0.0), |(s, m), (&a, &b)| {
            (s + a as f64 * b, m + (a as f64 * b).abs())
        })
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// The q8 formats and a row length of whole blocks (and whole chunks) of each.
const CASES: [(GgmlType, usize); 5] = [
    (GgmlType::Q4K, 512),
    (GgmlType::Q4K, 4096),
    (GgmlType::Q5K, 256),
    (GgmlType::Q6K, 768),
    (GgmlType::Q8_0, 96),
];

#[test]
fn q8_products_match_the_quantized_reference() {
    let Some(g) = fast_cuda() else { return };
    let g = g.as_ref();
    let mut rng = Rng::new(77);
    for (ty, n_in) in CASES {
        for n_out in [1usize, 37, 300] {
            let wb = random_weight(ty, n_out, n_in, 1.0 / (n_in as f32).sqrt(), &mut rng);
            let wd = dequant(ty, &wb, n_out * n_in);
            let w = upload(g, ty, &[n_out, n_in], &wb);
            for t in [1usize, 3] {
                let mut xv = rng.normals(t * n_in, 1.0);
                xv[..32].fill(0.0); // an all-zero unit (scale 0)
                let x = g.upload_f32(&xv, &[t, n_in]).expect("upload");
                let out = g.alloc(DType::F32, &[t, n_out]).expect("alloc");
                g.matmul(&w, &x, &out).expect("matmul");
                let got = g.read_f32(&out).expect("read");
                for r in 0..t {
                    let xr = &xv[r * n_in..(r + 1) * n_in];
                    let xq = quantized(xr);
                    let xf: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
                    for o in 0..n_out {
                        let (want, mag) = dot(&wd, o, n_in, &xq);
                        let gv = got[r * n_out + o] as f64;
                        let what = format!("{ty:?} [{n_out}x{n_in}] T={t} row {r} out {o}");
                        assert!(
                            (gv - want).abs() <= 1e-5 * mag + 1e-30,
                            "{what}: got {gv} want {want} (sum |terms| {mag})"
                        );
                        // The distance to the f32 product is the quantization error: at most
                        // sum |w| * (scale / 2) per unit.
                        let (exact, _) = dot(&wd, o, n_in, &xf);
                        let bound: f64 = wd[o * n_in..(o + 1) * n_in]
                            .chunks(32)
                            .zip(xr.chunks(32))
                            .map(|(wu, xu)| {
                                let amax = xu.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                                wu.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / 254.0
                            })
                            .sum();
                        assert!(
                            (gv - exact).abs() <= bound * 1.0001 + 1e-5 * mag,
                            "{what}: {gv} is {} from the f32 product, more than the quantization bound {bound}",
                            (gv - exact).abs()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn q8_swiglu_matches_the_quantized_reference() {
    let Some(g) = fast_cuda() else { return };
    let g = g.as_ref();
    let mut rng = Rng::new(78);
    for (ty, n_in) in CASES {
        let n_ff = 300;
        let scale = 1.0 / (n_in as f32).sqrt();
        let (gb, ub) = (
            random_weight(ty, n_ff, n_in, scale, &mut rng),
            random_weight(ty, n_ff, n_in, scale, &mut rng),
        );
        let (gd, ud) = (dequant(ty, &gb, n_ff * n_in), dequant(ty, &ub, n_ff * n_in));
        let (gw, uw) = (upload(g, ty, &[n_ff, n_in], &gb), upload(g, ty, &[n_ff, n_in], &ub));
        let xv = rng.normals(n_in, 1.0);
        let x = g.upload_f32(&xv, &[1, n_in]).expect("upload");
        let tmp = |n| g.alloc(DType::F32, &[1, n]).expect("alloc");
        let (gt, ut, out) = (tmp(n_ff), tmp(n_ff), tmp(n_ff));
        compose::matmul_swiglu(g, &gw, &uw, &x, &gt, &ut, &out).expect("swiglu");
        let got = g.read_f32(&out).expect("read");
        let xq = quantized(&xv);
        for (o, &gv) in got.iter().enumerate() {
            let ((a, ma), (b, mb)) = (dot(&gd, o, n_in, &xq), dot(&ud, o, n_in, &xq));
            let want = silu(a) * b;
            let mag = ma * b.abs() + mb * silu(a).abs();
            assert!(
                (gv as f64 - want).abs() <= 1e-5 * mag + 1e-30,
                "{ty:?} swiglu [{n_ff}x{n_in}] out {o}: got {gv} want {want}"
            );
        }
    }
}
