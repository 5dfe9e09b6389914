//! Model binding on the CPU backend: a tiny model built from the input (or the input itself
//! when it is a GGUF file) goes through config validation, weight binding, a short prefill and
//! decode steps. Whatever loads must run on in-range tokens and give one logit per vocab entry.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rill::backend::Backend;
use rill::exec::{Logits, Model};
use rill::gguf::GgufFile;
use rill_fuzz::{tiny_model, Choices};

fn cpu() -> Arc<dyn Backend> {
    static CPU: OnceLock<Arc<dyn Backend>> = OnceLock::new();
    CPU.get_or_init(|| {
        // One thread: the fuzzer runs one input at a time and shares the machine.
        std::env::set_var("RAYON_NUM_THREADS", "1");
        rill::backend::create("cpu").expect("cpu backend")
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    let mut c = Choices::new(data);
    let bytes = if data.starts_with(b"GGUF") {
        data.to_vec()
    } else {
        tiny_model(&mut c)
    };
    let Ok(file) = GgufFile::from_bytes(bytes) else {
        return;
    };
    let Ok(model) = Model::load(&file, cpu(), &mut |_| {}) else {
        return;
    };
    let vocab = model.config.n_vocab;
    let n = 1 + c.u8() as usize % 6;
    let tokens: Vec<u32> = (0..n).map(|_| c.u32() % vocab as u32).collect();
    let mut s = model.new_session(n + 2).expect("a small session");
    let logits = model
        .prefill(&mut s, &tokens, Logits::Last, &mut |_, _| {})
        .expect("a loaded model runs in-range tokens");
    assert_eq!(logits.len(), vocab);
    let next = model.decode(&mut s, tokens[0]).expect("decode");
    assert_eq!(next.len(), vocab);
    // Greedy may refuse non-finite logits, but never names a token outside the vocabulary.
    if let Ok(t) = model.decode_greedy(&mut s, tokens[n - 1]) {
        assert!((t as usize) < vocab, "greedy token {t} of {vocab}");
    }
    // Out-of-range ids are refused, not read out of bounds.
    let mut s2 = model.new_session(2).expect("a small session");
    assert!(model
        .prefill(&mut s2, &[vocab as u32], Logits::Last, &mut |_, _| {})
        .is_err());
});
