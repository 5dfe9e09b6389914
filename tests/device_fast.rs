//! Every device backend at `Precision::Fast` (this binary's only instance of each device):
//! wgpu's prefill matmuls on f16 cooperative matrices where the adapter has them (the H200's
//! Vulkan driver), or their emulation with `RILL_TEST_WGPU=coop_emulate` (scripts/test.sh runs
//! this binary so on lavapipe); a backend without a faster tier runs exact, which is within the tier
//! too. Checked at the f16-rounded tier of ../shared/fixtures/README.md against the CPU
//! backend's exact results.

mod common;

use std::sync::Arc;

use common::weights::{dequant, random_weight, upload};
use common::*;
use rill::backend::compose;
use rill::backend::{Backend, DType, Precision, Tensor};
use rill::exec::{Logits, Model};
use rill::gguf::GgmlType;

fn fast() -> Vec<Arc<dyn Backend>> {
    device_backends_at(Precision::Fast)
}

/// The variant asked for (`RILL_TEST_WGPU`) is really what runs (a test of wgpu's variant
/// choice).
#[cfg(feature = "wgpu")]
#[test]
fn variant_asked_for_is_selected() {
    let asked = wgpu_options();
    for be in fast().into_iter().filter(|be| be.name() == "wgpu") {
        let info = be.driver_info();
        if asked.coop_emulate {
            assert_eq!(be.precision(), Precision::Fast);
            assert!(info.contains("emulated cooperative-matrix"), "{info}");
        }
        // The fast tier is the tensor-core kernel (on tensor cores or emulated) and nothing else;
        // its geometry is the one asked for (a geometry the device cannot hold falls back to the
        // default: said here).
        assert_eq!(be.precision() == Precision::Fast, info.contains("coop2 "), "{info}");
        if be.precision() == Precision::Fast {
            if let Some(t) = asked.tuning.coop_tile {
                let tile = format!(
                    "coop2 {}x{}x{}/{}x{}, {} buffer",
                    t.rows, t.toks, t.k, t.sg_rows, t.sg_toks, t.bufs
                );
                assert!(info.contains(&tile), "{tile} asked for: {info}");
            }
        }
        if asked.plain {
            assert_eq!(be.precision(), Precision::Exact, "the plain path has no f16 products");
        }
    }
}

/// Whether `be`'s fast tier keeps the activations of F16 and BF16 weight products at f32 class:
/// the cuda backend splits them into two f16 terms, hi + lo (kernels-cuda/gemm_q.cu), because
/// those weights carry no quantization error for an f16 rounding of x to hide behind. Other
/// backends round x to f16 there (the f16 tier).
fn splits_exact_weights(be: &dyn Backend) -> bool {
    be.name() == "cuda"
}

/// Relative L2 error allowed to a split product against the CPU's: x is carried to 2^-22 of
/// itself, and the tensor cores' f32 accumulation measured ~1e-6 at K = 832 on the H200 (run B).
/// A single f16 term of x gives ~2e-4 with these inputs, ten times over it.
const SPLIT_REL_L2: f64 = 2e-5;

/// Per-output bound of a split product: x's two-term error 2^-22 |x| relative plus the lo term's
/// f16 subnormal spacing (absolute 2^-25; also BF16 weights below 2^-17 in f16), and the f32
/// rounding of the 2n partial sums the two products add (2n 2^-24 sum |w x|).
fn split_tolerance(mag: f32, sub: f32, n_in: usize) -> f32 {
    (2f32.powi(-22) + 2.0 * n_in as f32 * 2f32.powi(-24)) * mag + 2f32.powi(-25) * sub
}

/// f16-rounded inputs, f32 accumulation: each product is within 2^-10 |w x| (two roundings of
/// 2^-11 relative) plus f16 subnormals' absolute 2^-25 per operand, and the sum adds the f32
/// rounding of n terms (n 2^-24 sum |w x|). F16 and BF16 weights on a backend that splits x
/// (`splits_exact_weights`) are held to the split's bounds instead.
#[test]
fn fast_matmul_is_within_the_f16_tier() {
    for g in fast() {
        fast_matmul_case(g.as_ref(), cpu().as_ref());
    }
}

fn fast_matmul_case(g: &dyn Backend, c: &dyn Backend) {
    let mut rng = Rng::new(53);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q4_0,
    ] {
        fast_matmul_check(g, c, ty, 300, 512, &[2, 9, 64, 65, 130], &mut rng);
    }
}

/// Shapes around the edges of the tensor-core kernels' tiles: rows not a multiple of a tile's
/// (and not of 4: no straight stores), several row and token tiles, a row whose length is a
/// multiple of 32 but not 64 (k steps of 32, or the other kernel under k steps of 64), and a long
/// row (many k steps through the staging buffers).
#[test]
fn fast_matmul_tile_edges_are_within_the_f16_tier() {
    for g in fast() {
        let (g, c) = (g.as_ref(), cpu());
        let mut rng = Rng::new(59);
        fast_matmul_check(g, c.as_ref(), GgmlType::Q8_0, 130, 96, &[31, 64, 129], &mut rng);
        fast_matmul_check(g, c.as_ref(), GgmlType::F16, 264, 160, &[3, 128, 200], &mut rng);
        fast_matmul_check(g, c.as_ref(), GgmlType::Q4K, 392, 1024, &[70, 192], &mut rng);
        fast_matmul_check(g, c.as_ref(), GgmlType::Q6K, 128, 256, &[64], &mut rng);
    }
}

/// `g`'s matmul of a random `ty` weight [n_out, n_in] with `tokens` rows of x, each output within
/// the f16 tier of the CPU's (or the split's bounds, `splits_exact_weights`).
fn fast_matmul_check(
    g: &dyn Backend,
    c: &dyn Backend,
    ty: GgmlType,
    n_out: usize,
    n_in: usize,
    tokens: &[usize],
    rng: &mut Rng,
) {
    let bytes = random_weight(ty, n_out, n_in, 0.5, rng);
    let w = dequant(ty, &bytes, n_out * n_in);
    let (gw, cw) = (
        upload(g, ty, &[n_out, n_in], &bytes),
        upload(c, ty, &[n_out, n_in], &bytes),
    );
    for &t in tokens {
        let x = rng.normals(t * n_in, 1.0);
        let run = |be: &dyn Backend, w: &Tensor| {
            let o = be.alloc(DType::F32, &[t, n_out]).unwrap();
            be.matmul(w, &up(be, &x, &[t, n_in]), &o)
                .unwrap_or_else(|e| panic!("{} matmul {ty}: {e}", be.name()));
            be.read_f32(&o).unwrap()
        };
        let (got, want) = (run(g, &gw), run(c, &cw));
        let split = splits_exact_weights(g) && matches!(ty, GgmlType::F16 | GgmlType::Bf16);
        if split {
            let e = rel_l2(&got, &want);
            assert!(
                e <= SPLIT_REL_L2,
                "{} fast matmul {ty} T={t}: rel L2 {e:.3e} > {SPLIT_REL_L2:.0e} (activations rounded to f16?)",
                g.name()
            );
        }
        let rel = 2f32.powi(-10) + n_in as f32 * 2f32.powi(-24);
        for tt in 0..t {
            let xr = &x[tt * n_in..(tt + 1) * n_in];
            for o in 0..n_out {
                let wr = &w[o * n_in..(o + 1) * n_in];
                let mag: f32 = wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
                let sub: f32 = wr.iter().zip(xr).map(|(a, b)| a.abs() + b.abs()).sum();
                let tol = if split {
                    split_tolerance(mag, sub, n_in)
                } else {
                    rel * mag + 2f32.powi(-25) * sub
                };
                let (a, b) = (got[tt * n_out + o], want[tt * n_out + o]);
                assert!(
                    (a - b).abs() <= tol,
                    "{} fast matmul {ty} {n_out}x{n_in} T={t} t={tt} o={o}: {a} vs {b} (tol {tol})",
                    g.name()
                );
            }
        }
    }
}

/// The lo plane of an activation's f16 copy is made wherever a split product reads it: a copy
/// kept from a quantized-weight product gains it on demand, the FFN's SwiGLU writes it for the
/// down projection when gate/up are F16 (and a quantized gate/up leaves it to be made on demand
/// from the f32 output). Each F16 product is checked at the split's bound against the CPU's
/// product of the same input (read back from the device).
#[test]
fn fast_split_products_get_their_lo_plane() {
    // The choice itself, without a GPU: this batch takes the tensor cores in the fast tier, F16
    // weights with the two-plane activations, quantized ones with one.
    #[cfg(feature = "cuda")]
    {
        use rill::backend::cuda::policy::{gemm_activations, Batch, Device, GemmActivations, Policy};
        let p = Policy {
            device: Device::H200,
            precision: Precision::Fast,
            fusion: true,
        };
        assert_eq!(p.batch(70, false), Batch::TensorCores);
        assert_eq!(gemm_activations(GgmlType::F16), Some(GemmActivations::HiLo));
        assert_eq!(gemm_activations(GgmlType::Q8_0), Some(GemmActivations::F16));
    }
    for g in fast().into_iter().filter(|g| splits_exact_weights(g.as_ref())) {
        split_lo_plane_case(g.as_ref(), cpu().as_ref());
    }
}

fn split_lo_plane_case(g: &dyn Backend, c: &dyn Backend) {
    let mut rng = Rng::new(71);
    let (t, d, f) = (70usize, 256usize, 192usize);
    let weight = |ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng| {
        let bytes = random_weight(ty, rows, cols, 0.5, rng);
        (
            upload(g, ty, &[rows, cols], &bytes),
            upload(c, ty, &[rows, cols], &bytes),
        )
    };
    // The device's product of `w` and its tensor `x`, against the CPU's of the same x values.
    let check = |what: &str, w: &(Tensor, Tensor), x: &Tensor, n_out: usize, n_in: usize| {
        let o = g.alloc(DType::F32, &[t, n_out]).unwrap();
        g.matmul(&w.0, x, &o).unwrap_or_else(|e| panic!("{what}: {e}"));
        let xv = g.read_f32(x).unwrap();
        let co = c.alloc(DType::F32, &[t, n_out]).unwrap();
        c.matmul(&w.1, &up(c, &xv, &[t, n_in]), &co).unwrap();
        let e = rel_l2(&g.read_f32(&o).unwrap(), &c.read_f32(&co).unwrap());
        assert!(
            e <= SPLIT_REL_L2,
            "{} {what}: rel L2 {e:.3e} > {SPLIT_REL_L2:.0e}",
            g.name()
        );
    };
    let x = up(g, &rng.normals(t * d, 1.0), &[t, d]);
    let q8 = weight(GgmlType::Q8_0, f, d, &mut rng);
    let f16 = weight(GgmlType::F16, f, d, &mut rng);
    // A Q8_0 product first keeps x's copy without the lo plane; the F16 product then needs it.
    let o = g.alloc(DType::F32, &[t, f]).unwrap();
    g.matmul(&q8.0, &x, &o).unwrap();
    check("F16 after Q8_0 on one input", &f16, &x, f, d);
    // SwiGLU outputs read by an F16 down projection, after F16 and after Q8_0 gate/up.
    let down = weight(GgmlType::F16, d, f, &mut rng);
    for ty in [GgmlType::F16, GgmlType::Q8_0] {
        let (gate, upw) = (weight(ty, f, d, &mut rng), weight(ty, f, d, &mut rng));
        let scratch = || g.alloc(DType::F32, &[t, f]).unwrap();
        let (gt, ut, h) = (scratch(), scratch(), scratch());
        compose::matmul_swiglu(g, &gate.0, &upw.0, &x, &gt, &ut, &h)
            .unwrap_or_else(|e| panic!("matmul_swiglu {ty}: {e}"));
        check(&format!("F16 down after {ty} gate/up"), &down, &h, d, f);
    }
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

/// Second largest minus largest logit.
fn top_gap(v: &[f32]) -> f32 {
    let b = argmax(v);
    let second = v
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != b)
        .fold(f32::NEG_INFINITY, |m, (_, &x)| m.max(x));
    v[b] - second
}

/// Prefill logits of the tiny models at Fast against the CPU's exact logits, at the tier of
/// F16-rounded activations (fixtures README: max abs ~0.03-0.1, rel L2 <= ~6e-3). Argmax may
/// differ only where the exact top-2 gap is within the position's error (near-ties), and agrees
/// at >= 90% of the positions. The MoE model's routing flips on near-ties (fixtures README,
/// "Measured at real shapes"): one flipped expert moves that position far outside the tier and
/// the next few a little, so for it only prompt A's positions must be in the tier and the whole
/// prompt within rel L2 0.05 (llama.cpp's own batch-vs-sequential spread).
#[test]
fn fast_prefill_is_within_the_f16_tier() {
    for be in fast() {
        fast_prefill_case(be);
    }
}

fn fast_prefill_case(dev: Arc<dyn Backend>) {
    // Prompt A of the fixtures, then a longer mix (crosses a 64-token tile).
    let prompt_a = [
        785u32, 3974, 293, 4830, 282, 5131, 7784, 82, 916, 279, 1187, 4246, 5562, 13,
    ];
    let mut tokens = prompt_a.to_vec();
    tokens.extend((0..60u32).map(|i| (i * 977 + 31) % 8166));
    for (file, moe) in [
        ("tiny-dense.F16.gguf", false),
        ("tiny-dense.Q8_0.gguf", false),
        ("tiny-moe.F16.gguf", true),
    ] {
        let logits = |be: Arc<dyn Backend>| {
            let m = Model::open(fixture(file), be).expect("model loads");
            let mut s = m.new_session(tokens.len()).expect("session");
            m.prefill(&mut s, &tokens, Logits::All, &mut |_, _| {})
                .expect("prefill")
        };
        let (got, want) = (logits(Arc::clone(&dev)), logits(cpu()));
        let v = want.len() / tokens.len();
        let (mut num_all, mut den_all, mut agree) = (0f64, 0f64, 0usize);
        for p in 0..tokens.len() {
            let (g, w) = (&got[p * v..(p + 1) * v], &want[p * v..(p + 1) * v]);
            let max_abs = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let num: f64 = g.iter().zip(w).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
            let den: f64 = w.iter().map(|b| (*b as f64).powi(2)).sum();
            let rel = (num / den).sqrt();
            (num_all, den_all) = (num_all + num, den_all + den);
            if !moe || p < prompt_a.len() {
                assert!(max_abs <= 0.1, "{} {file} position {p}: max abs {max_abs}", dev.name());
                assert!(rel <= 6e-3, "{} {file} position {p}: rel L2 {rel}", dev.name());
            }
            if argmax(g) == argmax(w) {
                agree += 1;
            } else {
                assert!(
                    top_gap(w) <= 2.0 * max_abs,
                    "{file} position {p}: argmax differs with a top-2 gap of {} (max abs {max_abs})",
                    top_gap(w)
                );
            }
        }
        let rel_all = (num_all / den_all).sqrt();
        assert!(rel_all <= if moe { 0.05 } else { 6e-3 }, "{file}: rel L2 {rel_all}");
        assert!(
            agree * 10 >= tokens.len() * 9,
            "{file}: argmax agrees at {agree}/{}",
            tokens.len()
        );
    }
}
