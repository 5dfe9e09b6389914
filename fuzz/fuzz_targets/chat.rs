//! The chat template renderer on arbitrary conversations: it fails exactly for a bad role or a
//! system message that is not first; otherwise every user and system text appears in the
//! output, which tokenizes (special tokens on) and decodes back to itself.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rill::gguf::GgufFile;
use rill::tokenizer::{render_chat, ChatMessage, Tokenizer};
use rill_fuzz::{fixture, Choices};

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let f = GgufFile::open(fixture("tiny-dense.F16.gguf")).expect("fixture");
        let mut t = Tokenizer::from_gguf(&f).expect("tokenizer");
        t.set_nfc(false);
        t
    })
}

const ROLES: [&str; 5] = ["user", "assistant", "system", "tool", "narrator"];

fuzz_target!(|data: &[u8]| {
    let mut c = Choices::new(data);
    let add_generation_prompt = c.chance(160);
    let enable_thinking = c.chance(128);
    // Messages are separated by 0xFF bytes (never part of UTF-8); each starts with a role byte.
    let msgs: Vec<ChatMessage> = c
        .rest()
        .split(|&b| b == 0xFF)
        .filter(|m| !m.is_empty())
        .map(|m| ChatMessage::new(ROLES[m[0] as usize % ROLES.len()], String::from_utf8_lossy(&m[1..])))
        .collect();
    let valid = msgs
        .iter()
        .enumerate()
        .all(|(i, m)| m.role != "narrator" && (m.role != "system" || i == 0));
    match render_chat(&msgs, add_generation_prompt, enable_thinking) {
        Ok(text) => {
            assert!(valid, "rendered an invalid conversation");
            for m in msgs.iter().filter(|m| m.role == "user" || m.role == "system") {
                assert!(
                    text.contains(m.content.trim()),
                    "content of a {} turn is missing",
                    m.role
                );
            }
            let tok = tokenizer();
            let ids = tok.encode(&text, true);
            assert_eq!(tok.decode(&ids, true), text);
        }
        Err(_) => assert!(!valid, "refused a valid conversation"),
    }
});
