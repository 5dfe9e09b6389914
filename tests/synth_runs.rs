//! Synthesized files load and run: every quant on every compiled backend, with finite activations through
//! a deep stack, and batched prefill agreeing with token-by-token decode.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixture;
use rill::backend::Backend;
use rill::exec::{Logits, Model};
use rill::synth::{self, ShapeParams, SynthOptions};

fn out(tag: &str) -> PathBuf {
    common::temp_path(&format!("synth-runs-{tag}.gguf"))
}

fn opts(shape: &str, quant: &str, tag: &str) -> SynthOptions {
    SynthOptions {
        shape: shape.into(),
        quant: quant.into(),
        layers: None,
        seed: 7,
        tokenizer_from: fixture("tiny-dense.F16.gguf"),
        output: out(tag),
        progress: false,
    }
}

/// A deep model with 256-multiple rows so the K-quant types are used (not their fallbacks).
fn deep_k_shape(moe: bool) -> ShapeParams {
    let base = synth::shape(if moe { "tiny-moe" } else { "tiny-dense" }).expect("shape");
    ShapeParams {
        n_embd: 256,
        n_layer: 24,
        n_ff: if moe { base.n_ff } else { 512 },
        n_ff_exp: if moe { 256 } else { base.n_ff_exp },
        n_ff_shexp: if moe { 256 } else { base.n_ff_shexp },
        source: "test",
        ..base
    }
}

/// Prefill 40 tokens (chunked delta rule), all finite and of sane magnitude, and compare the
/// logits of the first `DECODED` positions with token-by-token decode.
fn run_and_check(path: &Path, what: &str) {
    for be in common::backends() {
        let what = format!("{what} on {}", be.name());
        run_and_check_on(be, path, &what);
    }
}

/// Positions decoded token by token per model: every weight format's decode kernels run on each;
/// prefill against decode over a whole prompt (chunk boundaries, long contexts) is
/// tests/e2e_fixtures.rs's, and a decoded token of a 24-layer model costs ~0.3 s on lavapipe.
const DECODED: usize = 16;

fn run_and_check_on(be: std::sync::Arc<dyn Backend>, path: &Path, what: &str) {
    let m = Model::open(path, be).unwrap_or_else(|e| panic!("{what}: {e}"));
    let v = m.config.n_vocab;
    let toks: Vec<u32> = (0..40u32).map(|i| (i * 977 + 13) % 8000).collect();
    let mut s = m.new_session(64).expect("session");
    let pre = m.prefill(&mut s, &toks, Logits::All, &mut |_, _| {}).expect("prefill");
    let mut s2 = m.new_session(64).expect("session");
    let mut dec = Vec::new();
    for &t in &toks[..DECODED] {
        dec.extend(m.decode(&mut s2, t).expect("decode"));
    }
    assert_eq!(pre.len(), toks.len() * v);
    assert_eq!(dec.len(), DECODED * v);
    assert!(pre.iter().all(|p| p.is_finite()), "{what}: non-finite prefill logits");
    let max_abs = pre.iter().fold(0f32, |a, p| a.max(p.abs()));
    for (p, d) in pre.iter().zip(&dec) {
        assert!(d.is_finite(), "{what}: non-finite decode logits");
        assert!(
            (p - d).abs() <= 1e-3 * (1.0 + p.abs()),
            "{what}: prefill {p} vs decode {d}"
        );
    }
    assert!(max_abs > 1e-3 && max_abs < 1e3, "{what}: logits magnitude {max_abs}");
}

/// Synthesize every quant of `shape` and run each model (the tiny shapes: seconds each).
fn every_quant_of(shape: &str) {
    for q in synth::quant_names() {
        let o = opts(shape, q, &format!("{shape}-{q}"));
        synth::synthesize(&o).unwrap_or_else(|e| panic!("{shape} {q}: {e}"));
        run_and_check(&o.output, &format!("{shape} {q}"));
        let _ = std::fs::remove_file(&o.output);
    }
}

#[test]
fn every_quant_of_tiny_dense_runs() {
    every_quant_of("tiny-dense");
}

#[test]
fn every_quant_of_tiny_moe_runs() {
    every_quant_of("tiny-moe");
}

/// A deep (24-layer) model of one quant stays finite and prefill agrees with decode. One test per
/// model (tens of seconds each on lavapipe), so the harness and scripts/test.sh can spread them.
fn deep_k_quant_model_stays_finite(moe: bool, q: &str) {
    let o = opts(
        if moe { "tiny-moe" } else { "tiny-dense" },
        q,
        &format!("deep-{moe}-{q}"),
    );
    synth::synthesize_params(&deep_k_shape(moe), &o).unwrap_or_else(|e| panic!("deep {q}: {e}"));
    run_and_check(&o.output, &format!("deep moe={moe} {q}"));
    let _ = std::fs::remove_file(&o.output);
}

#[test]
fn deep_dense_q4_k_m_stays_finite() {
    deep_k_quant_model_stays_finite(false, "q4_k_m");
}

#[test]
fn deep_dense_q6_k_stays_finite() {
    deep_k_quant_model_stays_finite(false, "q6_k");
}

#[test]
fn deep_dense_bf16_stays_finite() {
    deep_k_quant_model_stays_finite(false, "bf16");
}

#[test]
fn deep_moe_q4_k_m_stays_finite() {
    deep_k_quant_model_stays_finite(true, "q4_k_m");
}

#[test]
fn deep_moe_q6_k_stays_finite() {
    deep_k_quant_model_stays_finite(true, "q6_k");
}

#[test]
fn deep_moe_bf16_stays_finite() {
    deep_k_quant_model_stays_finite(true, "bf16");
}

/// A dense model whose rows take the one-token fused SwiGLU (rows longer than 256) and whose FFN
/// width is whole 256-element blocks: with the packed-dot units (`RILL_TEST_WGPU=dot`, scripts/test.sh; the SwiGLU's
/// planes are on by default with the dot units) the SwiGLU writes its output's packed-dot planes and the down product reads
/// them, in recorded and replayed decode steps, against prefill (which writes none).
#[test]
fn dense_ffn_planes_decode_matches_prefill() {
    let base = synth::shape("tiny-dense").expect("shape");
    let shape = ShapeParams {
        n_embd: 512,
        n_layer: 2,
        n_ff: 768,
        source: "test",
        ..base
    };
    let o = opts("tiny-dense", "q4_k_m", "ffn-planes");
    synth::synthesize_params(&shape, &o).unwrap_or_else(|e| panic!("ffn planes: {e}"));
    run_and_check(&o.output, "ffn planes q4_k_m");
    let _ = std::fs::remove_file(&o.output);
}

#[test]
fn cli_synth_then_info_prints_the_q4_k_m_mix() {
    let path = out("cli-q4km");
    let bin = env!("CARGO_BIN_EXE_rill");
    let st = Command::new(bin)
        .args(["synth", "--shape", "tiny-dense", "--quant", "q4_k_m", "-o"])
        .arg(&path)
        .arg("--tokenizer-from")
        .arg(fixture("tiny-dense.F16.gguf"))
        .output()
        .expect("run synth");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let info = Command::new(bin)
        .args(["info", "-m"])
        .arg(&path)
        .output()
        .expect("run info");
    assert!(info.status.success());
    let s = String::from_utf8_lossy(&info.stdout);
    // The quantizer's mix for these 64/128/512-wide rows (see the fixture README): Q4_K only for the
    // 512-wide rows, Q5_0 / Q8_0 fallbacks elsewhere, F32 vectors.
    for (ty, count) in [("Q5_0", 46), ("Q8_0", 9), ("Q4_K", 8), ("F32", 45)] {
        let line = s
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{ty} ")))
            .unwrap_or_else(|| panic!("no {ty} line in:\n{s}"));
        assert!(line.contains(&format!("{count} tensors")), "{ty}: {line}");
    }
    let _ = std::fs::remove_file(&path);
}
