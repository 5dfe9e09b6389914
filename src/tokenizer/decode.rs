//! Ids → bytes → text (TOKENIZER.md §5), whole and streaming.

use super::bytes_map::char_to_byte;
use super::{TokenType, Tokenizer};

/// Append the bytes of one token. NORMAL text goes through the inverse byte map; USER_DEFINED
/// is literal; CONTROL / UNKNOWN are literal only when `show_special`; UNUSED is empty.
pub fn token_bytes(text: &str, ty: TokenType, show_special: bool, out: &mut Vec<u8>) {
    match ty {
        TokenType::Normal => {
            for c in text.chars() {
                match char_to_byte(c) {
                    Some(b) => out.push(b),
                    // Not a byte-level symbol (malformed vocab entry): keep the text as is
                    // rather than dropping it silently.
                    None => {
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
        TokenType::UserDefined => out.extend_from_slice(text.as_bytes()),
        TokenType::Control | TokenType::Unknown => {
            if show_special {
                out.extend_from_slice(text.as_bytes());
            }
        }
        TokenType::Byte => {
            // `<0xAB>` form used by SentencePiece-style vocabs; not present in Qwen's.
            let hex = text.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'));
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            }
        }
        TokenType::Unused => {}
    }
}

/// Incremental detokenizer: returns text as soon as it is complete UTF-8, holding back a
/// trailing partial character until the next token completes it. Invalid sequences become
/// U+FFFD exactly where a whole-text lossy decode would put them, so the concatenation of all
/// `push` results plus `finish` equals `Tokenizer::decode` of all ids.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    show_special: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub(super) fn new(tok: &'a Tokenizer, show_special: bool) -> Self {
        StreamDecoder {
            tok,
            show_special,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.tok.append_token_bytes(id, self.show_special, &mut self.pending);
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid_up_to` is valid UTF-8 by definition.
                    out.push_str(&String::from_utf8_lossy(&rest[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += valid + bad;
                        }
                        None => {
                            // Incomplete sequence at the end: wait for more bytes.
                            consumed += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }

    /// Flush whatever is held back (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
