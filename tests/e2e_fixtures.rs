//! End-to-end: rill's logits and greedy continuations against the fixture references
//! (transformers float32 for the F16 models, llama.cpp float32-on-dequantized-weights for Q8_0 / Q4_K_M),
//! both for one batched prefill (chunked delta rule) and for token-by-token decode, on every
//! backend compiled into this build at every precision tier it has (`common::backends_every_tier()`).
//! The reference cases are one table (`reference_table!`): a model file, its reference files, a
//! tolerance and the modes checked. A backend at the fast tier is held to the fixtures'
//! f16-rounded bound (`FAST_TOL`) where its fast paths run (batched prefill), to the table's
//! tolerance elsewhere (one-token decode), and to identical greedy continuations.

mod common;

use std::sync::Arc;

use common::fixture;
use rill::backend::Backend;
use rill::exec::{Logits, Model};

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
    let ids_bytes = std::fs::read(fixture(ids_from)).expect("reference file");
    let ids = safetensors::SafeTensors::deserialize(&ids_bytes).expect("safetensors");
    let l_bytes = std::fs::read(fixture(logits_from)).expect("reference file");
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

fn load(be: Arc<dyn Backend>, file: &str) -> Model {
    Model::open(fixture(file), be).expect("model loads")
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
fn check_row(what: &str, got: &[f32], want: &[f32], tol: Tol) {
    let Tol { max_abs, max_rel_l2 } = tol;
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

/// Prompt B's positions up to and including this one (its chunk-boundary reference positions 62-65,
/// 127-128 and 200, not 391): how far the `Decode` rows decode it token by token from the start.
/// Position 391 is decoded by the prefill-then-decode split, after a prefill through 329 (each
/// decoded token costs ~0.1 s on lavapipe, so decoding all 392 from the start would double it).
const B_SHORT: usize = 200;

fn check_prompts(m: &Model, r: &Reference, by_decode: bool, tol: Tol, tag: &str) {
    check_prompts_to(m, r, by_decode, r.prompt_b.len(), tol, tag);
}

/// `check_prompts` on the first `b_len` tokens of prompt B (the reference positions below it).
fn check_prompts_to(m: &Model, r: &Reference, by_decode: bool, b_len: usize, tol: Tol, tag: &str) {
    let v = r.vocab;
    let la = all_logits(m, &r.prompt_a, by_decode);
    assert_eq!(la.len(), r.prompt_a.len() * v);
    for p in 0..r.prompt_a.len() {
        check_row(
            &format!("{tag} A[{p}]"),
            &la[p * v..(p + 1) * v],
            &r.logits_a[p * v..(p + 1) * v],
            tol,
        );
    }
    check_prompt_b(tag, &all_logits(m, &r.prompt_b[..b_len], by_decode), r, tol);
}

/// The reference positions of prompt B in `logits` (the logits of its first `logits.len() / vocab`
/// positions, at least through the reference position 200).
fn check_prompt_b(tag: &str, logits: &[f32], r: &Reference, tol: Tol) {
    let v = r.vocab;
    let n = logits.len() / v;
    assert_eq!(logits.len(), n * v, "{tag}: partial logit row");
    assert!(n > B_SHORT && n <= r.prompt_b.len(), "{tag}: {n} positions of prompt B");
    for (i, &p) in r.b_positions.iter().enumerate().filter(|&(_, &p)| p < n) {
        check_row(
            &format!("{tag} B[{p}]"),
            &logits[p * v..(p + 1) * v],
            &r.logits_b[i * v..(i + 1) * v],
            tol,
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

/// `greedy` with the host one step ahead of the device (`Model::generate_greedy`), checked
/// against `want` (the reference continuation) twice: whole, and stopped by the callback after
/// five tokens, where the session must have consumed exactly the tokens the documentation says.
fn check_greedy_ahead(m: &Model, prompt: &[u32], want: &[u32], tag: &str) {
    let n = want.len();
    let mut s = m.new_session(prompt.len() + n + 1).expect("session");
    let first = m.prefill_greedy(&mut s, prompt, &mut |_, _| {}).expect("prefill");
    let mut seen = Vec::new();
    let rest = m
        .generate_greedy(&mut s, first, n - 1, &mut |t| {
            seen.push(t);
            Ok(true)
        })
        .expect("generate");
    assert_eq!(seen, rest, "{tag}: callback order");
    let mut all = vec![first];
    all.extend(&rest);
    assert_eq!(all, want, "{tag}");
    // `first` and every generated token but the last were fed.
    assert_eq!(s.pos, prompt.len() + n - 1, "{tag}: positions consumed");

    let mut s = m.new_session(prompt.len() + n + 1).expect("session");
    let first = m.prefill_greedy(&mut s, prompt, &mut |_, _| {}).expect("prefill");
    let mut count = 0;
    let rest = m
        .generate_greedy(&mut s, first, n - 1, &mut |_| {
            count += 1;
            Ok(count < 5)
        })
        .expect("generate, stopped");
    assert_eq!(rest, want[1..6], "{tag}: stopped");
    // Stopped early: the step fed the refused (fifth) token had been enqueued and ran too.
    assert_eq!(s.pos, prompt.len() + 6, "{tag}: positions consumed when stopped");
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

/// A tolerance on logits, from ../shared/fixtures/README.md.
#[derive(Clone, Copy)]
struct Tol {
    max_abs: f32,
    max_rel_l2: f32,
}

// F16 models vs transformers float32: max abs <= 1e-3, rel L2 <= 1e-4 (fixtures README).
const F16_TOL: Tol = Tol {
    max_abs: 1e-3,
    max_rel_l2: 1e-4,
};
// Quantized models vs llama.cpp float32 on the dequantized weights: max abs <= 2e-3, rel L2 <= 1e-4.
const Q_TOL: Tol = Tol {
    max_abs: 2e-3,
    max_rel_l2: 1e-4,
};

// F16-rounded activations (the fast tier of a backend, e.g. cuda's tensor-core prefill): max abs
// ~0.03-0.1, rel L2 <= ~6e-3, argmax equal (fixtures README).
const FAST_TOL: Tol = Tol {
    max_abs: 0.1,
    max_rel_l2: 6e-3,
};

/// `tol` for logits that `be` computes in batches (prefill): the fast tier's bound when `be` runs
/// it, else `tol`.
fn batch_tol(be: &dyn Backend, tol: Tol) -> Tol {
    if common::is_fast(be) {
        FAST_TOL
    } else {
        tol
    }
}

/// How a reference is reproduced.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Logits of every position of both prompts from one batched prefill (chunked delta rule).
    Prefill,
    /// The same logits from token-by-token decode (recurrent delta rule), through prompt B's
    /// position `B_SHORT`.
    Decode,
    /// 32 greedy tokens after prompt A: prefill, then on-device argmax decode.
    Greedy,
    /// The same 32 tokens from host-side argmax of token-by-token decode logits.
    GreedyByDecode,
    /// The same 32 tokens with the host one step ahead of the device (`generate_greedy`; the
    /// F16 rows: what it tests is the token loop, the weight formats are `Greedy`'s).
    GreedyAhead,
}
use Mode::*;

/// One row of the reference table.
struct Case {
    model: &'static str,
    /// Holds the prompt ids (the transformers reference).
    ids: &'static str,
    /// Holds the logits and greedy ids to compare with.
    logits: &'static str,
    tol: Tol,
    modes: &'static [Mode],
}

/// Check `case` in every mode on every compiled backend.
fn check_case(case: &Case) {
    let r = reference(case.ids, case.logits);
    for be in common::backends_every_tier() {
        let name = common::tagged(be.as_ref());
        let prefill_tol = batch_tol(be.as_ref(), case.tol);
        let m = load(be, case.model);
        for &mode in case.modes {
            let tag = format!("{name} {} {mode:?}", case.model);
            match mode {
                Prefill => check_prompts(&m, &r, false, prefill_tol, &tag),
                Decode => check_prompts_to(&m, &r, true, B_SHORT + 1, case.tol, &tag),
                Greedy => assert_eq!(greedy(&m, &r.prompt_a, 32), r.greedy, "{tag}"),
                GreedyByDecode => assert_eq!(greedy_by_decode(&m, &r.prompt_a, 32), r.greedy, "{tag}"),
                GreedyAhead => check_greedy_ahead(&m, &r.prompt_a, &r.greedy[..32], &tag),
            }
        }
    }
}

/// One test per row of the reference table (so rows run in parallel).
macro_rules! reference_table {
    ($($test:ident: $case:expr,)*) => {
        $(
            #[test]
            fn $test() {
                check_case(&$case);
            }
        )*
    };
}

reference_table! {
    dense_f16_matches_transformers: Case {
        model: "tiny-dense.F16.gguf",
        ids: "tiny-dense.reference.safetensors",
        logits: "tiny-dense.reference.safetensors",
        tol: F16_TOL,
        modes: &[Prefill, Decode, Greedy, GreedyByDecode, GreedyAhead],
    },
    moe_f16_matches_transformers: Case {
        model: "tiny-moe.F16.gguf",
        ids: "tiny-moe.reference.safetensors",
        logits: "tiny-moe.reference.safetensors",
        tol: F16_TOL,
        modes: &[Prefill, Decode, Greedy, GreedyByDecode, GreedyAhead],
    },
    q8_0_matches_llamacpp_dequant_f32: Case {
        model: "tiny-dense.Q8_0.gguf",
        ids: "tiny-dense.reference.safetensors",
        logits: "tiny-dense.Q8_0.dequant-f32.llamacpp.safetensors",
        tol: Q_TOL,
        modes: &[Prefill, Decode, Greedy],
    },
    q4_k_m_matches_llamacpp_dequant_f32: Case {
        model: "tiny-dense.Q4_K_M.gguf",
        ids: "tiny-dense.reference.safetensors",
        logits: "tiny-dense.Q4_K_M.dequant-f32.llamacpp.safetensors",
        tol: Q_TOL,
        modes: &[Prefill, Decode, Greedy],
    },
}

/// Chunked prefill of part of prompt B, then recurrent decode of the rest, equals the reference.
#[test]
fn prefill_then_decode_continues_the_state() {
    for be in common::backends_every_tier() {
        let name = common::tagged(be.as_ref());
        let tol = batch_tol(be.as_ref(), F16_TOL);
        for (file, refname) in [
            ("tiny-dense.F16.gguf", "tiny-dense.reference.safetensors"),
            ("tiny-moe.F16.gguf", "tiny-moe.reference.safetensors"),
        ] {
            let r = reference(refname, refname);
            let m = load(Arc::clone(&be), file);
            // Five whole chunks and ten tokens prefilled (through position 329), the rest of
            // prompt B (to its last reference position, 391) decoded.
            let split = 330;
            let mut s = m.new_session(r.prompt_b.len()).expect("session");
            let mut logits = m
                .prefill(&mut s, &r.prompt_b[..split], Logits::All, &mut |_, _| {})
                .expect("prefill");
            for &t in &r.prompt_b[split..] {
                logits.extend(m.decode(&mut s, t).expect("decode"));
            }
            check_prompt_b(&format!("{name} {file} split"), &logits, &r, tol);
        }
    }
}

/// Small micro-batches (prefill split across many calls, each chunked) give the same logits.
#[test]
fn ubatch_size_does_not_change_results() {
    for be in common::backends_every_tier() {
        let name = common::tagged(be.as_ref());
        let tol = batch_tol(be.as_ref(), F16_TOL);
        let r = reference("tiny-dense.reference.safetensors", "tiny-dense.reference.safetensors");
        let mut m = load(Arc::clone(&be), "tiny-dense.F16.gguf");
        m.options.ubatch = 37;
        check_prompt_b(
            &format!("{name} ubatch37"),
            &all_logits(&m, &r.prompt_b, false),
            &r,
            tol,
        );
    }
}

#[test]
fn prompt_longer_than_context_is_a_typed_error() {
    for be in common::backends() {
        let name = be.name();
        let m = load(Arc::clone(&be), "tiny-dense.F16.gguf");
        let mut s = m.new_session(8).expect("session");
        let err = m.prefill(&mut s, &[1; 9], Logits::Last, &mut |_, _| {}).unwrap_err();
        assert!(matches!(err, rill::Error::ContextOverflow { .. }), "{name}: {err}");
        m.prefill(&mut s, &[1; 8], Logits::Last, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: 8 tokens fit exactly: {e}"));
        let err = m.decode(&mut s, 1).unwrap_err();
        assert!(matches!(err, rill::Error::ContextOverflow { .. }), "{name}: {err}");
    }
}

/// A snapshot taken after a prompt continues exactly like the original session (multi-turn reuse,
/// prompt caching), and the original is unaffected by work done on the copy.
#[test]
fn session_snapshot_restores_exactly() {
    for be in common::backends() {
        let name = be.name();
        let r = reference("tiny-moe.reference.safetensors", "tiny-moe.reference.safetensors");
        let m = load(Arc::clone(&be), "tiny-moe.F16.gguf");
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
        assert_eq!(a, b, "{name}: restored snapshot must continue bit-identically");
        assert_eq!(copy.pos, r.prompt_a.len() + 3);
        assert_eq!(s.pos, r.prompt_a.len() + 1);
    }
}

/// Layer by layer: the embedding, every decoder layer's output and the final norm at the last
/// position of prompt A against transformers (fixture README: ~1e-4 relative).
#[test]
fn hidden_states_match_transformers_layer_by_layer() {
    for be in common::backends_every_tier() {
        let name = common::tagged(be.as_ref());
        // The layers of a batch run the fast paths at the fast tier (the embedding is exact).
        let layer_tol = if common::is_fast(be.as_ref()) {
            common::FAST_REL_L2
        } else {
            1e-4
        };
        for (file, refname) in [
            ("tiny-dense.F16.gguf", "tiny-dense.reference.safetensors"),
            ("tiny-moe.F16.gguf", "tiny-moe.reference.safetensors"),
        ] {
            let bytes = std::fs::read(fixture(refname)).expect("reference");
            let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
            let r = reference(refname, refname);
            let m = load(Arc::clone(&be), file);
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
            assert!(rel(&last(&tr.embed), &embed) <= 1e-6, "{name} {file}: embedding");
            let per_layer = f32s(&read_tensor(&st, "hidden_a_last_per_layer"));
            assert_eq!(tr.layers.len() * d, per_layer.len());
            for (i, h) in tr.layers.iter().enumerate() {
                let e = rel(&last(h), &per_layer[i * d..(i + 1) * d]);
                assert!(e <= layer_tol, "{name} {file}: layer {i} rel error {e}");
            }
            let fin = f32s(&read_tensor(&st, "hidden_a_last_final_norm"));
            let e = rel(&last(&tr.final_norm), &fin);
            assert!(e <= layer_tol, "{name} {file}: final norm rel error {e}");
        }
    }
}
