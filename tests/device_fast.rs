//! Every device backend at `Precision::Fast` (this binary's only instance of each device):
//! wgpu's prefill matmuls on f16 cooperative matrices where the adapter has them (the H200's
//! Vulkan driver), or their emulation with `RILL_WGPU_COOP_EMULATE=1` (scripts/test.sh runs this
//! binary so on lavapipe); a backend without a faster tier runs exact, which is within the tier
//! too. Checked at the f16-rounded tier of ../shared/fixtures/README.md against the CPU
//! backend's exact results.

mod common;

use std::sync::Arc;

use common::weights::{dequant, random_weight, upload};
use common::*;
use rill::backend::{Backend, DType, Precision, Tensor};
use rill::exec::{Logits, Model};
use rill::gguf::GgmlType;

fn fast() -> Vec<Arc<dyn Backend>> {
    device_backends_at(Precision::Fast)
}

/// The variant asked for through the environment is really what runs (a test of wgpu's variant
/// choice: the environment variables are wgpu's).
#[test]
fn variant_asked_for_is_selected() {
    for be in fast().into_iter().filter(|be| be.name() == "wgpu") {
        if std::env::var_os("RILL_WGPU_COOP_EMULATE").is_some_and(|v| v == "1") {
            assert_eq!(be.precision(), Precision::Fast);
            assert!(
                be.driver_info().contains("emulated cooperative-matrix"),
                "{}",
                be.driver_info()
            );
        }
        if std::env::var_os("RILL_WGPU_PLAIN").is_some_and(|v| v == "1") {
            assert_eq!(be.precision(), Precision::Exact, "the plain path has no f16 products");
        }
    }
}

/// f16-rounded inputs, f32 accumulation: each product is within 2^-10 |w x| (two roundings of
/// 2^-11 relative) plus f16 subnormals' absolute 2^-25 per operand, and the sum adds the f32
/// rounding of n terms (n 2^-24 sum |w x|).
#[test]
fn fast_matmul_is_within_the_f16_tier() {
    for g in fast() {
        fast_matmul_case(g.as_ref(), cpu().as_ref());
    }
}

fn fast_matmul_case(g: &dyn Backend, c: &dyn Backend) {
    let mut rng = Rng::new(53);
    let (n_out, n_in) = (300usize, 512usize);
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q4_0,
    ] {
        let bytes = random_weight(ty, n_out, n_in, 0.5, &mut rng);
        let w = dequant(ty, &bytes, n_out * n_in);
        let (gw, cw) = (
            upload(g, ty, &[n_out, n_in], &bytes),
            upload(c, ty, &[n_out, n_in], &bytes),
        );
        for t in [2usize, 9, 64, 65, 130] {
            let x = rng.normals(t * n_in, 1.0);
            let run = |be: &dyn Backend, w: &Tensor| {
                let o = be.alloc(DType::F32, &[t, n_out]).unwrap();
                be.matmul(w, &up(be, &x, &[t, n_in]), &o)
                    .unwrap_or_else(|e| panic!("{} matmul {ty}: {e}", be.name()));
                be.read_f32(&o).unwrap()
            };
            let (got, want) = (run(g, &gw), run(c, &cw));
            let rel = 2f32.powi(-10) + n_in as f32 * 2f32.powi(-24);
            for tt in 0..t {
                let xr = &x[tt * n_in..(tt + 1) * n_in];
                for o in 0..n_out {
                    let wr = &w[o * n_in..(o + 1) * n_in];
                    let mag: f32 = wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
                    let sub: f32 = wr.iter().zip(xr).map(|(a, b)| a.abs() + b.abs()).sum();
                    let tol = rel * mag + 2f32.powi(-25) * sub;
                    let (a, b) = (got[tt * n_out + o], want[tt * n_out + o]);
                    assert!(
                        (a - b).abs() <= tol,
                        "{} fast matmul {ty} T={t} t={tt} o={o}: {a} vs {b} (tol {tol})",
                        g.name()
                    );
                }
            }
        }
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
