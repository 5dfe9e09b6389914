//! Reading `tokenizer.ggml.*` metadata from a GGUF file (TOKENIZER.md §1).

use crate::gguf::value::type_id;
use crate::gguf::{Array, GgufFile, Value};
use crate::{Error, Result};

use super::{TokenType, Tokenizer, TokenizerData};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_TEMPLATE: &str = "tokenizer.chat_template";

/// Bounds on what a file can make the tokenizer materialise (each token costs about a hundred
/// bytes in memory): far above any real vocabulary (Qwen3.5: 248,320 tokens, 247,587 merges).
pub const MAX_TOKENS: usize = 1 << 21;
pub const MAX_MERGES: usize = 1 << 21;

impl TokenizerData {
    /// Collect the tokenizer metadata of a GGUF file. Only byte-level BPE (`gpt2`) is accepted.
    pub fn from_gguf(f: &GgufFile) -> Result<TokenizerData> {
        let model = f
            .get(KEY_MODEL)
            .ok_or_else(|| Error::Tokenizer(format!("missing {KEY_MODEL}")))?;
        let model = model.as_str().ok_or_else(|| wrong_type(KEY_MODEL, "string", model))?;
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "{KEY_MODEL} is '{model}'; rill supports only 'gpt2' (byte-level BPE)"
            )));
        }

        let tokens = string_array(f, KEY_TOKENS, MAX_TOKENS)?;
        let types_v = array(f, KEY_TYPES)?;
        if types_v.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "{KEY_TYPES} has {} entries but {KEY_TOKENS} has {}",
                types_v.len(),
                tokens.len()
            )));
        }
        let mut token_types = crate::alloc::vec_with_capacity(types_v.len(), "token types")?;
        for (id, v) in types_v.iter().enumerate() {
            let ty = v
                .as_i64()
                .and_then(TokenType::from_code)
                .ok_or_else(|| Error::Tokenizer(format!("{KEY_TYPES}[{id}]: invalid token type {v:?}")))?;
            token_types.push(ty);
        }
        let merges = string_array(f, KEY_MERGES, MAX_MERGES)?;

        let pre = match f.get(KEY_PRE) {
            Some(v) => v.as_str().ok_or_else(|| wrong_type(KEY_PRE, "string", v))?.to_string(),
            // Empty → PreTokenizer::from_name warns and falls back to qwen35.
            None => String::new(),
        };
        let chat_template = match f.get(KEY_TEMPLATE) {
            Some(v) => Some(
                v.as_str()
                    .ok_or_else(|| wrong_type(KEY_TEMPLATE, "string", v))?
                    .to_string(),
            ),
            None => None,
        };

        Ok(TokenizerData {
            tokens,
            token_types,
            merges,
            pre,
            eos_token_id: optional_id(f, KEY_EOS)?,
            eot_token_id: optional_id(f, KEY_EOT)?,
            bos_token_id: optional_id(f, KEY_BOS)?,
            chat_template,
        })
    }
}

impl Tokenizer {
    /// Build the tokenizer stored in a GGUF file's `tokenizer.ggml.*` keys.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
        Tokenizer::new(TokenizerData::from_gguf(f)?)
    }
}

fn wrong_type(key: &str, want: &str, got: &Value) -> Error {
    Error::Tokenizer(format!("{key} has type {}, expected {want}", got.type_name()))
}

fn array<'a>(f: &'a GgufFile, key: &str) -> Result<&'a Array> {
    let v = f.get(key).ok_or_else(|| Error::Tokenizer(format!("missing {key}")))?;
    v.as_array().ok_or_else(|| wrong_type(key, "array", v))
}

/// The strings of array `key`, at most `max` of them.
fn string_array(f: &GgufFile, key: &str, max: usize) -> Result<Vec<String>> {
    let items = array(f, key)?;
    if items.len() > max {
        return Err(Error::Tokenizer(format!(
            "{key} has {} entries; rill accepts at most {max}",
            items.len()
        )));
    }
    if !items.is_empty() && items.elem_type_id() != type_id::STRING {
        return Err(Error::Tokenizer(format!(
            "{key} is an array of {}, expected strings",
            items.elem_type_name()
        )));
    }
    let mut out = crate::alloc::vec_with_capacity(items.len(), key)?;
    for (i, s) in items.strs().enumerate() {
        let s = s.ok_or_else(|| Error::Tokenizer(format!("{key}[{i}] is not a string")))?;
        out.push(crate::alloc::string(s, key)?);
    }
    Ok(out)
}

fn optional_id(f: &GgufFile, key: &str) -> Result<Option<u32>> {
    let Some(v) = f.get(key) else {
        return Ok(None);
    };
    let id = v.as_u64().ok_or_else(|| wrong_type(key, "unsigned integer", v))?;
    u32::try_from(id)
        .map(Some)
        .map_err(|_| Error::Tokenizer(format!("{key} = {id} does not fit a token id")))
}
