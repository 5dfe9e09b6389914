//! End-to-end: rill's logits and greedy continuations against the fixture references
//! (transformers float32 for the F16 models, llama.cpp float32-on-dequantized-weights for Q8_0 / Q4_K_M),
//! both for one batched prefill (chunked delta rule) and for token-by-token decode.

mod common;

use std::path::Path;

use rill::exec::{DeltaMode, Logits, Model};

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

struct Reference {
    prompt_a: Vec<u32>,
    prompt_b: Vec<u32>,
    logits_a: Vec<f32>,
    logits_b: Vec<f32>,
    b_positions: Vec<usize>,
    greedy: Vec<u32>,
    vocab: usize,
}

fn read_tensor<'a>(st: &'a safetensors::SafeTensors<'a>, name: &str) -> safetensors::tensor::TensorView<'a> {
    st.tensor(name)
        .unwrap_or_else(|e| panic!("reference tensor {name}: {e}"))
}

fn f32s(v: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    v.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn i32s(v: &safetensors::tensor::TensorView<'_>) -> Vec<i32> {
    v.data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `ids_from` holds the prompt ids (the transformers reference); `logits_from` the logits to compare with.
fn reference(ids_from: &str, logits_from: &str) -> Reference {
    let ids_bytes = std::fs::read(Path::new(FIX).join(ids_from)).expect("reference file");
    let ids = safetensors::SafeTensors::deserialize(&ids_bytes).expect("safetensors");
    let l_bytes = std::fs::read(Path::new(FIX).join(logits_from)).expect("reference file");
    let l = safetensors::SafeTensors::deserialize(&l_bytes).expect("safetensors");
    let la = read_tensor(&l, "logits_a");
    let vocab = la.shape()[1];
    let to_u32 = |v: Vec<i32>| v.into_iter().map(|x| x as u32).collect::<Vec<u32>>();
    Reference {
        prompt_a: to_u32(i32s(&read_tensor(&ids, "prompt_a_ids"))),
        prompt_b: to_u32(i32s(&read_tensor(&ids, "prompt_b_ids"))),
        logits_a: f32s(&la),
        logits_b: f32s(&read_tensor(&l, "logits_b")),
        b_positions: i32s(&read_tensor(&l, "logits_b_positions"))
            .into_iter()
            .map(|x| x as usize)
            .collect(),
        greedy: to_u32(i32s(&read_tensor(&l, "greedy_ids"))),
        vocab,
    }
}

/// Every backend compiled into this build: each end-to-end test runs on all of them (wgpu on
/// lavapipe in CI, cuda where an NVIDIA GPU is; `common::backends`).
fn backends() -> Vec<&'static str> {
    common::backends()
}

fn load(backend_name: &str, file: &str, mode: DeltaMode) -> Model {
    let be = common::shared(backend_name);
    let mut m = Model::open(Path::new(FIX).join(file), be).expect("model loads");
    m.options.delta = mode;
    m
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Compare one position's logits: max abs diff, relative L2, argmax.
fn check_row(what: &str, got: &[f32], want: &[f32], max_abs: f32, max_rel_l2: f32) {
    assert_eq!(got.len(), want.len(), "{what}: vocab size");
    let mut worst = 0f32;
    let mut num = 0f64;
    let mut den = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "{what}: non-finite logit");
        worst = worst.max((g - w).abs());
        num += ((g - w) as f64).powi(2);
        den += (w as f64).powi(2);
    }
    let rel = (num / den).sqrt() as f32;
    assert!(worst <= max_abs, "{what}: max abs diff {worst} > {max_abs}");
    assert!(rel <= max_rel_l2, "{what}: rel L2 {rel} > {max_rel_l2}");
    assert_eq!(argmax(got), argmax(want), "{what}: argmax differs");
}

/// Logits of every position of `tokens`, by one batched prefill or by token-by-token decode.
fn all_logits(m: &Model, tokens: &[u32], by_decode: bool) -> Vec<f32> {
    let mut s = m.new_session(tokens.len() + 64).expect("session");
    if by_decode {
        let mut out = Vec::new();
        for &t in tokens {
            out.extend(m.decode(&mut s, t).expect("decode"));
        }
        out
    } else {
        m.prefill(&mut s, tokens, Logits::All, &mut |_, _| {}).expect("prefill")
    }
}

fn check_prompts(m: &Model, r: &Reference, by_decode: bool, max_abs: f32, max_rel: f32, tag: &str) {
    let v = r.vocab;
    let la = all_logits(m, &r.prompt_a, by_decode);
    assert_eq!(la.len(), r.prompt_a.len() * v);
    for p in 0..r.prompt_a.len() {
        check_row(
            &format!("{tag} A[{p}]"),
            &la[p * v..(p + 1) * v],
            &r.logits_a[p * v..(p + 1) * v],
            max_abs,
            max_rel,
        );
    }
    let lb = all_logits(m, &r.prompt_b, by_decode);
    for (i, &p) in r.b_positions.iter().enumerate() {
        check_row(
            &format!("{tag} B[{p}]"),
            &lb[p * v..(p + 1) * v],
            &r.logits_b[i * v..(i + 1) * v],
            max_abs,
            max_rel,
        );
    }
}

/// Greedy continuation of prompt A: prefill, then on-device argmax decode.
fn greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = m.new_session(prompt.len() + n + 1).expect("session");
    let mut next = m.prefill_greedy(&mut s, prompt, &mut |_, _| {}).expect("prefill");
    let mut out = vec![next];
    while out.len() < n {
        next = m.decode_greedy(&mut s, next).expect("decode");
        out.push(next);
    }
    out
}

/// Greedy continuation computed from host-side logits of token-by-token decode.
fn greedy_by_decode(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = m.new_session(prompt.len() + n + 1).expect("session");
    let mut logits = Vec::new();
    for &t in prompt {
        logits = m.decode(&mut s, t).expect("decode");
    }
    let mut out = Vec::new();
    while out.len() < n {
        let t = argmax(&logits) as u32;
        out.push(t);
        if out.len() < n {
            logits = m.decode(&mut s, t).expect("decode");
        }
    }
    out
}

// F16 models vs transformers float32: max abs <= 1e-3, rel L2 <= 1e-4 (fixtures README).
const F16_ABS: f32 = 1e-3;
const F16_REL: f32 = 1e-4;
// Quantized models vs llama.cpp float32 on the dequantized weights: max abs <= 2e-3, rel L2 <= 1e-4.
const Q_ABS: f32 = 2e-3;
const Q_REL: f32 = 1e-4;

#[test]
fn dense_f16_prefill_matches_transformers() {
    for b in backends() {
        let r = reference("tiny-dense.reference.safetensors", "tiny-dense.reference.safetensors");
        check_prompts(
            &load(b, "tiny-dense.F16.gguf", DeltaMode::Auto),
            &r,
            false,
            F16_ABS,
            F16_REL,
            &format!("{b} dense prefill"),
        );
    }
}

#[test]
fn dense_f16_decode_matches_transformers() {
    for b in backends() {
        let r = reference("tiny-dense.reference.safetensors", "tiny-dense.reference.safetensors");
        check_prompts(
            &load(b, "tiny-dense.F16.gguf", DeltaMode::Auto),
            &r,
            true,
            F16_ABS,
            F16_REL,
            &format!("{b} dense decode"),
        );
    }
}

#[test]
fn dense_f16_greedy_matches_transformers() {
    for b in backends() {
        let r = reference("tiny-dense.reference.safetensors", "tiny-dense.reference.safetensors");
        let m = load(b, "tiny-dense.F16.gguf", DeltaMode::Auto);
        assert_eq!(greedy(&m, &r.prompt_a, 32), r.greedy, "{b}: greedy after prefill");
        assert_eq!(
            greedy_by_decode(&m, &r.prompt_a, 32),
            r.greedy,
            "{b}: greedy token by token"
        );
    }
}

#[test]
fn moe_f16_prefill_matches_transformers() {
    for b in backends() {
        let r = reference("tiny-moe.reference.safetensors", "tiny-moe.reference.safetensors");
        check_prompts(
            &load(b, "tiny-moe.F16.gguf", DeltaMode::Auto),
            &r,
            false,
            F16_ABS,
            F16_REL,
            &format!("{b} moe prefill"),
        );
    }
}

#[test]
fn moe_f16_decode_matches_transformers() {
    for b in backends() {
        let r = reference("tiny-moe.reference.safetensors", "tiny-moe.reference.safetensors");
        check_prompts(
            &load(b, "tiny-moe.F16.gguf", DeltaMode::Auto),
            &r,
            true,
            F16_ABS,
            F16_REL,
            &format!("{b} moe decode"),
        );
    }
}

#[test]
fn moe_f16_greedy_matches_transformers() {
    for b in backends() {
        let r = reference("tiny-moe.reference.safetensors", "tiny-moe.reference.safetensors");
        let m = load(b, "tiny-moe.F16.gguf", DeltaMode::Auto);
        assert_eq!(greedy(&m, &r.prompt_a, 32), r.greedy, "{b}: greedy after prefill");
        assert_eq!(
            greedy_by_decode(&m, &r.prompt_a, 32),
            r.greedy,
            "{b}: greedy token by token"
        );
    }
}

/// Chunked prefill of part of prompt B, then recurrent decode of the rest, equals the reference.
#[test]
fn prefill_then_decode_continues_the_state() {
    for b in backends() {
        for (file, refname) in [
            ("tiny-dense.F16.gguf", "tiny-dense.reference.safetensors"),
            ("tiny-moe.F16.gguf", "tiny-moe.reference.safetensors"),
        ] {
            let r = reference(refname, refname);
            let m = load(b, file, DeltaMode::Auto);
            let v = r.vocab;
            let split = 130;
            let mut s = m.new_session(r.prompt_b.len()).expect("session");
            let mut logits = m
                .prefill(&mut s, &r.prompt_b[..split], Logits::All, &mut |_, _| {})
                .expect("prefill");
            for &t in &r.prompt_b[split..] {
                logits.extend(m.decode(&mut s, t).expect("decode"));
            }
            for (i, &p) in r.b_positions.iter().enumerate() {
                check_row(
                    &format!("{file} split B[{p}]"),
                    &logits[p * v..(p + 1) * v],
                    &r.logits_b[i * v..(i + 1) * v],
                    F16_ABS,
                    F16_REL,
                );
            }
        }
    }
}

/// Small micro-batches (prefill split across many calls, each chunked) give the same logits.
#[test]
fn ubatch_size_does_not_change_results() {
    for b in backends() {
        let r = reference("tiny-dense.reference.safetensors", "tiny-dense.reference.safetensors");
        let mut m = load(b, "tiny-dense.F16.gguf", DeltaMode::Auto);
        m.options.ubatch = 37;
        let v = r.vocab;
        let lb = all_logits(&m, &r.prompt_b, false);
        for (i, &p) in r.b_positions.iter().enumerate() {
            check_row(
                &format!("ubatch37 B[{p}]"),
                &lb[p * v..(p + 1) * v],
                &r.logits_b[i * v..(i + 1) * v],
                F16_ABS,
                F16_REL,
            );
        }
    }
}

#[test]
fn q8_0_matches_llamacpp_dequant_f32() {
    for b in backends() {
        let r = reference(
            "tiny-dense.reference.safetensors",
            "tiny-dense.Q8_0.dequant-f32.llamacpp.safetensors",
        );
        let m = load(b, "tiny-dense.Q8_0.gguf", DeltaMode::Auto);
        check_prompts(&m, &r, false, Q_ABS, Q_REL, &format!("{b} q8_0 prefill"));
        check_prompts(&m, &r, true, Q_ABS, Q_REL, &format!("{b} q8_0 decode"));
        assert_eq!(greedy(&m, &r.prompt_a, 32), r.greedy, "{b}: q8_0 greedy");
    }
}

#[test]
fn q4_k_m_matches_llamacpp_dequant_f32() {
    for b in backends() {
        let r = reference(
            "tiny-dense.reference.safetensors",
            "tiny-dense.Q4_K_M.dequant-f32.llamacpp.safetensors",
        );
        let m = load(b, "tiny-dense.Q4_K_M.gguf", DeltaMode::Auto);
        check_prompts(&m, &r, false, Q_ABS, Q_REL, &format!("{b} q4_k_m prefill"));
        check_prompts(&m, &r, true, Q_ABS, Q_REL, &format!("{b} q4_k_m decode"));
        assert_eq!(greedy(&m, &r.prompt_a, 32), r.greedy, "{b}: q4_k_m greedy");
    }
}

#[test]
fn prompt_longer_than_context_is_a_typed_error() {
    for b in backends() {
        let m = load(b, "tiny-dense.F16.gguf", DeltaMode::Auto);
        let mut s = m.new_session(8).expect("session");
        let err = m.prefill(&mut s, &[1; 9], Logits::Last, &mut |_, _| {}).unwrap_err();
        assert!(matches!(err, rill::Error::ContextOverflow { .. }), "{err}");
        m.prefill(&mut s, &[1; 8], Logits::Last, &mut |_, _| {})
            .expect("fits exactly");
        let err = m.decode(&mut s, 1).unwrap_err();
        assert!(matches!(err, rill::Error::ContextOverflow { .. }), "{err}");
    }
}

/// A snapshot taken after a prompt continues exactly like the original session (multi-turn reuse,
/// prompt caching), and the original is unaffected by work done on the copy.
#[test]
fn session_snapshot_restores_exactly() {
    for b in backends() {
        let r = reference("tiny-moe.reference.safetensors", "tiny-moe.reference.safetensors");
        let m = load(b, "tiny-moe.F16.gguf", DeltaMode::Auto);
        let mut s = m.new_session(64).expect("session");
        m.prefill(&mut s, &r.prompt_a, Logits::None, &mut |_, _| {})
            .expect("prefill");
        let mut copy = s.snapshot(m.backend().as_ref()).expect("snapshot");
        // Advance the copy by some unrelated tokens first, then restore from a second snapshot.
        let fresh = s.snapshot(m.backend().as_ref()).expect("snapshot");
        for t in [5u32, 6, 7] {
            m.decode(&mut copy, t).expect("decode");
        }
        let mut restored = fresh;
        let a = m.decode(&mut s, r.greedy[0]).expect("decode original");
        let b = m.decode(&mut restored, r.greedy[0]).expect("decode restored");
        assert_eq!(a, b, "restored snapshot must continue bit-identically");
        assert_eq!(copy.pos, r.prompt_a.len() + 3);
        assert_eq!(s.pos, r.prompt_a.len() + 1);
    }
}

/// Layer by layer: the embedding, every decoder layer's output and the final norm at the last
/// position of prompt A against transformers (fixture README: ~1e-4 relative).
#[test]
fn hidden_states_match_transformers_layer_by_layer() {
    for b in backends() {
        for (file, refname) in [
            ("tiny-dense.F16.gguf", "tiny-dense.reference.safetensors"),
            ("tiny-moe.F16.gguf", "tiny-moe.reference.safetensors"),
        ] {
            let bytes = std::fs::read(Path::new(FIX).join(refname)).expect("reference");
            let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
            let r = reference(refname, refname);
            let m = load(b, file, DeltaMode::Auto);
            let d = m.config.n_embd;
            let mut s = m.new_session(r.prompt_a.len()).expect("session");
            let tr = m.trace_hidden(&mut s, &r.prompt_a).expect("trace");
            let last = |v: &[f32]| v[v.len() - d..].to_vec();
            let rel = |got: &[f32], want: &[f32]| {
                let num: f64 = got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
                let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
                (num / den).sqrt()
            };
            let embed = f32s(&read_tensor(&st, "embed_a_last"));
            assert!(rel(&last(&tr.embed), &embed) <= 1e-6, "{file}: embedding");
            let per_layer = f32s(&read_tensor(&st, "hidden_a_last_per_layer"));
            assert_eq!(tr.layers.len() * d, per_layer.len());
            for (i, h) in tr.layers.iter().enumerate() {
                let e = rel(&last(h), &per_layer[i * d..(i + 1) * d]);
                assert!(e <= 1e-4, "{file}: layer {i} rel error {e}");
            }
            let fin = f32s(&read_tensor(&st, "hidden_a_last_final_norm"));
            let e = rel(&last(&tr.final_norm), &fin);
            assert!(e <= 1e-4, "{file}: final norm rel error {e}");
        }
    }
}
