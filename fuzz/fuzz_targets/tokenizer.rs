//! The tokenizer on arbitrary text, with both fixture vocabularies: encoding gives in-range ids
//! and decodes back to the text (its NFC form when NFC is on); streaming decode equals whole
//! decode, for the encoded ids and for arbitrary ids (out-of-range ones included).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rill::gguf::GgufFile;
use rill::tokenizer::Tokenizer;
use rill_fuzz::{fixture, Choices};
use unicode_normalization::UnicodeNormalization;

/// (tiny models' trimmed qwen35 vocabulary, real qwen3 vocabulary) x (NFC on, off).
fn tokenizers() -> &'static [Tokenizer] {
    static TOKS: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let mut out = Vec::new();
        for name in ["tiny-dense.F16.gguf", "qwen3-vocab.gguf"] {
            let f = GgufFile::open(fixture(name)).expect("fixture");
            for nfc in [true, false] {
                let mut t = Tokenizer::from_gguf(&f).expect("tokenizer");
                t.set_nfc(nfc);
                out.push(t);
            }
        }
        out
    })
}

fn stream(tok: &Tokenizer, ids: &[u32], show_special: bool) -> String {
    let mut dec = tok.stream_decoder(show_special);
    let mut out: String = ids.iter().map(|&id| dec.push(id)).collect();
    out.push_str(&dec.finish());
    out
}

fuzz_target!(|data: &[u8]| {
    let mut c = Choices::new(data);
    let toks = tokenizers();
    let tok = &toks[c.u8() as usize % toks.len()];
    let parse_special = c.chance(128);
    let show_special = c.chance(128);
    let rest = c.rest();
    let text = String::from_utf8_lossy(rest);

    let ids = tok.encode(&text, parse_special);
    assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
    let back = tok.decode(&ids, true);
    if tok.nfc() {
        assert_eq!(back.nfc().collect::<String>(), text.nfc().collect::<String>());
    } else {
        assert_eq!(back, text);
    }
    assert_eq!(stream(tok, &ids, show_special), tok.decode(&ids, show_special));

    // Arbitrary ids, including ones past the vocabulary.
    let raw: Vec<u32> = rest
        .chunks(3)
        .map(|b| b.iter().fold(0u32, |acc, &x| acc << 8 | u32::from(x)) % (tok.vocab_size() as u32 + 16))
        .collect();
    assert_eq!(stream(tok, &raw, show_special), tok.decode(&raw, show_special));
});
