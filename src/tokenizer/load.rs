//! Reading `tokenizer.ggml.*` metadata from a GGUF file (TOKENIZER.md §1).

use crate::gguf::{GgufFile, Value};
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

        let tokens = string_array(f, KEY_TOKENS)?;
        let types_v = array(f, KEY_TYPES)?;
        if types_v.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "{KEY_TYPES} has {} entries but {KEY_TOKENS} has {}",
                types_v.len(),
                tokens.len()
            )));
        }
        let token_types = types_v
            .iter()
            .enumerate()
            .map(|(id, v)| {
                v.as_i64()
                    .and_then(TokenType::from_code)
                    .ok_or_else(|| Error::Tokenizer(format!("{KEY_TYPES}[{id}]: invalid token type {v:?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let merges = string_array(f, KEY_MERGES)?;

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

fn array<'a>(f: &'a GgufFile, key: &str) -> Result<&'a [Value]> {
    let v = f.get(key).ok_or_else(|| Error::Tokenizer(format!("missing {key}")))?;
    v.as_array().ok_or_else(|| wrong_type(key, "array", v))
}

fn string_array(f: &GgufFile, key: &str) -> Result<Vec<String>> {
    let items = array(f, key)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, v) in items.iter().enumerate() {
        let s = v
            .as_str()
            .ok_or_else(|| Error::Tokenizer(format!("{key}[{i}] has type {}, expected string", v.type_name())))?;
        out.push(s.to_string());
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
