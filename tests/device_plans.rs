//! On a real GPU, the 9B and 35B-A3B shapes (their first four layers: three Gated DeltaNet, one
//! attention) take the fused kernels their backend has for them, and the same steps with fusion
//! off give the same logits within the exact tier. CPU adapters (lavapipe) and machines without a
//! GPU skip this (it reads multi-GB models); tests/plans.rs checks the same choices on the
//! fixtures everywhere.
mod common;

use std::path::PathBuf;
use std::sync::Arc;

use rill::backend::fusion::Fusion;
use rill::backend::Backend;
#[cfg(feature = "cuda")]
use rill::backend::Precision;
use rill::exec::{Head, Model};
use rill::synth::{synthesize, SynthOptions};

/// A synthesized model of `shape`'s first four layers.
fn synth(shape: &str, quant: &str) -> PathBuf {
    let out = common::temp_path(&format!("{shape}-{quant}.gguf"));
    synthesize(&SynthOptions {
        shape: shape.into(),
        quant: quant.into(),
        layers: Some(4),
        seed: 3,
        tokenizer_from: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rill::synth::DEFAULT_TOKENIZER),
        output: out.clone(),
        progress: false,
    })
    .expect("synth");
    out
}

/// The GPU backends of this machine at the exact tier, each with fusion on and off.
fn gpus() -> Vec<(Arc<dyn Backend>, Arc<dyn Backend>)> {
    let v = devices(false);
    if v.is_empty() {
        eprintln!("device_plans skipped: no GPU backend on this machine (CPU adapters are not run)");
    }
    v
}

/// The device backends of this machine at the exact tier, each with fusion on and off; CPU
/// adapters (lavapipe) with `cpu_adapters`.
fn devices(cpu_adapters: bool) -> Vec<(Arc<dyn Backend>, Arc<dyn Backend>)> {
    let mut v: Vec<(Arc<dyn Backend>, Arc<dyn Backend>)> = Vec::new();
    #[cfg(feature = "cuda")]
    {
        use rill::backend::cuda::{CudaBackend, CudaOptions};
        let opts = |fusion| CudaOptions {
            precision: Precision::Exact,
            fusion,
            ..CudaOptions::default()
        };
        if let (Ok(on), Ok(off)) = (
            CudaBackend::with_options(opts(true)),
            CudaBackend::with_options(opts(false)),
        ) {
            v.push((Arc::new(on), Arc::new(off)));
        }
    }
    #[cfg(feature = "wgpu")]
    {
        use rill::backend::wgpu::WgpuBackend;
        use rill::backend::BackendOptions;
        let mut opts = BackendOptions::default();
        if let Ok(on) = WgpuBackend::with_options(&opts) {
            opts.wgpu.fusion = false;
            if cpu_adapters || !on.is_cpu_adapter() {
                if let Ok(off) = WgpuBackend::with_options(&opts) {
                    v.push((Arc::new(on), Arc::new(off)));
                }
            }
        }
    }
    v
}

/// Launches of one decode step (token 17 after a 5-token prompt) and its logits.
fn decode(be: &Arc<dyn Backend>, file: &PathBuf) -> (Vec<&'static str>, Vec<f32>) {
    let m = Model::open(file, be.clone()).expect("load");
    let mut s = m.new_session(64).expect("session");
    m.prefill(&mut s, &[1, 2, 3, 4, 5], rill::exec::Logits::None, &mut |_, _| {})
        .expect("prefill");
    let launched = m.run_step_listed(&mut s, &[17], Head::LastLogits).expect("step");
    let logits = m.decode(&mut s, 18).expect("decode");
    (launched, logits)
}

fn count(v: &[&str], name: &str) -> usize {
    v.iter().filter(|n| **n == name).count()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut n) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        d += (*x as f64 - *y as f64).powi(2);
        n += (*y as f64).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0
}

#[test]
fn real_shapes_take_their_fused_kernels() {
    let gpus = gpus();
    if gpus.is_empty() {
        return;
    }
    for (shape, quant) in [("qwen3.5-9b", "q4_k_m"), ("qwen3.5-35b-a3b", "q4_k_m")] {
        let file = synth(shape, quant);
        for (on, off) in &gpus {
            let (launched, fused) = decode(on, &file);
            let (plain, unfused) = decode(off, &file);
            let what = format!("{shape} {quant} on {}: {launched:?}", on.name());
            let moe = shape.contains("a3b");
            match (on.name(), moe) {
                ("cuda", false) => {
                    assert_eq!(count(&launched, "gdn_step"), 3, "{what}");
                    assert_eq!(count(&launched, "attn_qk_prep"), 1, "{what}");
                    assert_eq!(count(&launched, "matmul_swiglu"), 4, "{what}");
                    assert_eq!(count(&launched, "matmul_add_rms_norm"), 8, "{what}");
                }
                ("cuda", true) => {
                    assert_eq!(count(&launched, "gdn_step"), 3, "{what}");
                    assert_eq!(count(&launched, "moe_ffn"), 4, "{what}");
                }
                ("wgpu", false) => {
                    assert_eq!(count(&launched, "gdn_conv_gates"), 3, "{what}");
                    assert_eq!(count(&launched, "attention_gated"), 1, "{what}");
                    assert_eq!(count(&launched, "matmul_swiglu"), 4, "{what}");
                    assert_eq!(count(&launched, "add_rms_norm"), 8, "{what}");
                }
                ("wgpu", true) => {
                    assert_eq!(count(&launched, "gdn_conv_gates"), 3, "{what}");
                    assert_eq!(count(&launched, "moe_experts_shared"), 4, "{what}");
                }
                _ => {}
            }
            // Fusion off: every op on its own, the same numbers within the exact tier.
            assert!(Fusion::ALL.iter().all(|f| !plain.contains(&f.name())), "{plain:?}");
            let e = rel_l2(&fused, &unfused);
            assert!(
                e < 1e-4,
                "{shape} on {}: fused vs unfused logits rel L2 {e:.2e}",
                on.name()
            );
            assert_eq!(argmax(&fused), argmax(&unfused), "{shape} on {}", on.name());
        }
        let _ = std::fs::remove_file(&file);
    }
}

/// On every device (lavapipe included), the fixtures' decode steps launch fused runs with fusion
/// on, none with it off, and both give the same logits within the exact tier.
#[test]
fn fixtures_run_fused_and_unfused_alike() {
    let devices = devices(true);
    if devices.is_empty() {
        eprintln!("device_plans: no device backend in this build");
        return;
    }
    for name in ["tiny-dense.Q4_K_M.gguf", "tiny-moe.F16.gguf"] {
        let file = common::fixture(name);
        for (on, off) in &devices {
            let (launched, fused) = decode(on, &file);
            let (plain, unfused) = decode(off, &file);
            let fused_runs = launched
                .iter()
                .filter(|n| Fusion::ALL.iter().any(|f| f.name() == **n))
                .count();
            assert!(fused_runs > 0, "{name} on {}: no fused run: {launched:?}", on.name());
            assert!(
                launched.len() < plain.len(),
                "{name} on {}: {launched:?} vs {plain:?}",
                on.name()
            );
            assert!(Fusion::ALL.iter().all(|f| !plain.contains(&f.name())), "{plain:?}");
            let e = rel_l2(&fused, &unfused);
            assert!(
                e < 1e-4,
                "{name} on {}: fused vs unfused logits rel L2 {e:.2e}",
                on.name()
            );
            assert_eq!(argmax(&fused), argmax(&unfused), "{name} on {}", on.name());
        }
    }
}
