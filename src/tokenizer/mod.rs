//! Qwen3.5 byte-level BPE tokenizer read from GGUF metadata (spec/TOKENIZER.md), plus the
//! hard-coded chat format.
//!
//! Pipeline: special-token split → NFC → Qwen pre-tokenizer → byte map → BPE merges.

mod bpe;
mod bytes_map;
mod chat;
mod decode;
mod load;
mod pretokenize;
mod special;

use std::collections::HashMap;

use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use crate::{Error, Result};
use bpe::Bpe;
use special::{Fragment, SpecialMatcher};

pub use chat::{
    parse_reply, render_chat, render_chat_prompt, ChatMessage, ChatOptions, ChatPrompt, EncodedChat, ParsedReply,
    ReplyEvent, ReplyStream, ToolCall,
};
pub use decode::StreamDecoder;

/// GGUF `tokenizer.ggml.token_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    /// Map a GGUF token type code. 0 ("undefined" in llama.cpp) is read as NORMAL.
    pub fn from_code(code: i64) -> Option<TokenType> {
        Some(match code {
            0 | 1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// Which split regex to emulate (TOKENIZER.md §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// Qwen2/2.5/3: combining marks are not word characters.
    Qwen2,
    /// Qwen3.5: combining marks join words.
    Qwen35,
}

impl PreTokenizer {
    /// Parse `tokenizer.ggml.pre`; unknown or empty names fall back to qwen35 with a warning.
    pub fn from_name(name: &str) -> PreTokenizer {
        match name {
            "qwen2" => PreTokenizer::Qwen2,
            "qwen35" => PreTokenizer::Qwen35,
            other => {
                let shown = if other.is_empty() { "<missing>" } else { other };
                eprintln!("warning: tokenizer pre-tokenizer '{shown}' is not known; using qwen35");
                PreTokenizer::Qwen35
            }
        }
    }
}

/// Pre-tokens of `text` under `variant` (TOKENIZER.md §3.2), exactly as the reference split regex
/// would isolate them. No normalisation is applied: `encode` runs this after NFC.
pub fn pretokenize(text: &str, variant: PreTokenizer) -> Vec<&str> {
    let mut out = Vec::new();
    pretokenize::split(text, variant, &mut out);
    out
}

/// Raw vocabulary as stored in GGUF (`tokenizer.ggml.*`), the input of `Tokenizer::new`.
#[derive(Debug, Clone, Default)]
pub struct TokenizerData {
    pub tokens: Vec<String>,
    pub token_types: Vec<TokenType>,
    pub merges: Vec<String>,
    pub pre: String,
    pub eos_token_id: Option<u32>,
    pub eot_token_id: Option<u32>,
    pub bos_token_id: Option<u32>,
    pub chat_template: Option<String>,
}

/// A ready-to-use tokenizer. `Sync`: the BPE cache sits behind a mutex.
pub struct Tokenizer {
    tokens: Vec<String>,
    types: Vec<TokenType>,
    lookup: HashMap<String, u32>,
    bpe: Bpe,
    special: SpecialMatcher,
    pre: PreTokenizer,
    nfc: bool,
    eos: Option<u32>,
    eot: Option<u32>,
    bos: Option<u32>,
    eog: Vec<u32>,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Build a tokenizer, validating lengths and special ids.
    pub fn new(data: TokenizerData) -> Result<Tokenizer> {
        let TokenizerData {
            tokens,
            token_types,
            merges,
            pre,
            eos_token_id,
            eot_token_id,
            bos_token_id,
            chat_template,
        } = data;
        if tokens.is_empty() {
            return Err(Error::Tokenizer("vocabulary is empty".into()));
        }
        if tokens.len() != token_types.len() {
            return Err(Error::Tokenizer(format!(
                "{} tokens but {} token types",
                tokens.len(),
                token_types.len()
            )));
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(Error::Tokenizer(format!(
                "vocabulary of {} tokens does not fit u32 ids",
                tokens.len()
            )));
        }
        let n = tokens.len() as u32;
        for (name, id) in [("eos", eos_token_id), ("eot", eot_token_id), ("bos", bos_token_id)] {
            if let Some(id) = id {
                if id >= n {
                    return Err(Error::Tokenizer(format!(
                        "{name} token id {id} is out of range (vocabulary has {n} tokens)"
                    )));
                }
            }
        }

        let mut lookup = crate::alloc::map_with_capacity(tokens.len(), "the token lookup table")?;
        for (id, t) in tokens.iter().enumerate() {
            // First id wins on (unexpected) duplicate texts.
            lookup.entry(t.clone()).or_insert(id as u32);
        }

        let (bpe, skipped) = Bpe::new(&merges, &lookup)?;
        if skipped > 0 {
            eprintln!(
                "warning: tokenizer: {skipped} of {} merges reference tokens missing from the vocabulary; ignored",
                merges.len()
            );
        }

        let special = SpecialMatcher::new(tokens.iter().zip(token_types.iter()).enumerate().filter_map(
            |(id, (t, ty))| match ty {
                TokenType::Control | TokenType::Unknown => Some((t.clone(), id as u32, true)),
                TokenType::UserDefined => Some((t.clone(), id as u32, false)),
                _ => None,
            },
        ));

        let mut eog: Vec<u32> = [eos_token_id, eot_token_id].into_iter().flatten().collect();
        for name in ["<|im_end|>", "<|endoftext|>"] {
            eog.extend(
                tokens
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.as_str() == name)
                    .map(|(i, _)| i as u32),
            );
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Tokenizer {
            pre: PreTokenizer::from_name(&pre),
            tokens,
            types: token_types,
            lookup,
            bpe,
            special,
            nfc: true,
            eos: eos_token_id,
            eot: eot_token_id,
            bos: bos_token_id,
            eog,
            chat_template,
        })
    }

    /// Apply NFC before pre-tokenizing (default on, as HF does; off reproduces llama.cpp).
    pub fn set_nfc(&mut self, on: bool) {
        self.nfc = on;
    }

    pub fn nfc(&self) -> bool {
        self.nfc
    }

    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// Token ids of `text`. Never adds BOS/EOS. With `parse_special`, CONTROL tokens such as
    /// `<|im_start|>` in the text become single ids; USER_DEFINED ones (`<think>`…) always do.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut frags = Vec::new();
        self.special.split(text, parse_special, &mut frags);
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        for frag in frags {
            match frag {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(raw) => self.encode_text(raw, &mut ids),
            }
        }
        ids
    }

    /// BPE ids of text that holds no special tokens (NFC, pre-tokenizer, merges).
    fn encode_text(&self, raw: &str, ids: &mut Vec<u32>) {
        let normalized;
        let s = if self.nfc && is_nfc_quick(raw.chars()) != IsNormalized::Yes {
            normalized = raw.nfc().collect::<String>();
            normalized.as_str()
        } else {
            raw
        };
        let mut pieces = Vec::new();
        pretokenize::split(s, self.pre, &mut pieces);
        for piece in &pieces {
            self.bpe.encode_piece(piece, ids);
        }
    }

    /// Text of `ids`; invalid UTF-8 (e.g. a character cut in half) becomes U+FFFD, applied only
    /// to the concatenated bytes. Out-of-range ids are skipped.
    pub fn decode(&self, ids: &[u32], show_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, show_special)).into_owned()
    }

    /// Raw bytes of `ids` (see `decode`).
    pub fn decode_bytes(&self, ids: &[u32], show_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            self.append_token_bytes(id, show_special, &mut out);
        }
        out
    }

    fn append_token_bytes(&self, id: u32, show_special: bool, out: &mut Vec<u8>) {
        if let (Some(text), Some(&ty)) = (self.tokens.get(id as usize), self.types.get(id as usize)) {
            decode::token_bytes(text, ty, show_special, out);
        }
    }

    /// Id of the token whose stored text is exactly `text` (byte-mapped form for NORMAL tokens).
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.lookup.get(text).copied()
    }

    /// Stored text of token `id`.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// True for end-of-generation ids: eos, eot and every `<|im_end|>` / `<|endoftext|>`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn eot_token_id(&self) -> Option<u32> {
        self.eot
    }

    /// BOS id as stored; Qwen never prepends it.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Incremental decoder for generation output.
    pub fn stream_decoder(&self, show_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, show_special)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tokenizer_is_send_sync() {
        // Shared across threads (server, parallel requests) behind an Arc.
        assert_send_sync::<Tokenizer>();
    }

    #[test]
    fn new_rejects_bad_data() {
        let tokens: Vec<String> = (0..=255u8).map(|b| bytes_map::byte_to_char(b).to_string()).collect();
        let base = TokenizerData {
            token_types: vec![TokenType::Normal; tokens.len()],
            tokens,
            pre: "qwen2".into(),
            ..Default::default()
        };
        assert!(Tokenizer::new(base.clone()).is_ok());
        let mut d = base.clone();
        d.token_types.pop();
        assert!(matches!(Tokenizer::new(d), Err(Error::Tokenizer(_))));
        let mut d = base.clone();
        d.bos_token_id = Some(256);
        assert!(matches!(Tokenizer::new(d), Err(Error::Tokenizer(_))));
        // A byte-level vocabulary missing a byte symbol cannot encode every text.
        let mut d = base.clone();
        d.tokens[b'x' as usize] = "not x".into();
        assert!(matches!(Tokenizer::new(d), Err(Error::Tokenizer(m)) if m.contains("0x78")));
        assert!(matches!(
            Tokenizer::new(TokenizerData::default()),
            Err(Error::Tokenizer(_))
        ));
    }
}
