//! OpenAI request bodies, read leniently (unknown fields are ignored, as OpenAI clients send many)
//! but strictly typed: a known field of the wrong type or out of range is a 400 that names it.

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::sample::SamplerConfig;
use crate::tokenizer::{ChatMessage, ToolCall};

/// Parse a request body: JSON, and an object.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}"), None))?;
    if !value.is_object() {
        return Err(ApiError::invalid("request body must be a JSON object", None));
    }
    Ok(value)
}

/// Read the fields `T` knows from a body, naming the offending field on failure.
pub fn fields<'a, T: Deserialize<'a>>(body: &'a Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path.as_str());
        ApiError::invalid(format!("{}: {}", path, e.inner()), param)
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// Sampling and length fields shared by both endpoints.
#[derive(Deserialize, Default)]
pub struct Sampling {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Option<OneOrMany>,
    /// vLLM's extension: go on past end-of-generation tokens until `max_tokens` (benchmarks
    /// that need a fixed output length).
    pub ignore_eos: Option<bool>,
    pub n: Option<u64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<Value>,
    pub model: Option<String>,
}

#[derive(Deserialize, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<InMessage>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub chat_template_kwargs: Option<TemplateKwargs>,
    pub response_format: Option<Value>,
}

#[derive(Deserialize)]
pub struct TemplateKwargs {
    pub enable_thinking: Option<bool>,
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
}

#[derive(Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: Option<InContent>,
    pub reasoning_content: Option<String>,
    pub tool_calls: Option<Vec<InToolCall>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum InContent {
    Text(String),
    Parts(Vec<InPart>),
}

#[derive(Deserialize)]
pub struct InPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub struct InToolCall {
    pub function: InFunction,
}

#[derive(Deserialize)]
pub struct InFunction {
    pub name: String,
    /// OpenAI sends a JSON string; an object is accepted too.
    pub arguments: Value,
}

/// Validated sampling settings of a request.
pub struct Settings {
    pub sampler: SamplerConfig,
    /// `None`: until the context is full (chat) or the endpoint's default.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Generate past end-of-generation tokens, up to `max_tokens`.
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
}

fn range(v: Option<f64>, name: &str, lo: f64, hi: f64, default: f32) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(
            format!("{name} must be between {lo} and {hi}, got {x}"),
            Some(name),
        )),
    }
}

impl Sampling {
    pub fn settings(&self, default_seed: u64) -> Result<Settings, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid("only n = 1 is supported", Some("n")));
            }
        }
        if matches!(&self.logprobs, Some(v) if !v.is_null() && v != &Value::Bool(false)) {
            return Err(ApiError::invalid("logprobs are not supported", Some("logprobs")));
        }
        let d = SamplerConfig::default();
        range(self.presence_penalty, "presence_penalty", -2.0, 2.0, 0.0)?;
        range(self.frequency_penalty, "frequency_penalty", -2.0, 2.0, 0.0)?;
        let sampler = SamplerConfig {
            temperature: range(self.temperature, "temperature", 0.0, 2.0, d.temperature)?,
            top_p: range(self.top_p, "top_p", 0.0, 1.0, d.top_p)?,
            min_p: range(self.min_p, "min_p", 0.0, 1.0, d.min_p)?,
            repeat_penalty: range(self.repeat_penalty, "repeat_penalty", 0.01, 10.0, d.repeat_penalty)?,
            top_k: match self.top_k {
                None => d.top_k,
                Some(k) => usize::try_from(k).map_err(|_| ApiError::invalid("top_k is too large", Some("top_k")))?,
            },
            repeat_last_n: d.repeat_last_n,
            seed: self.seed.unwrap_or(default_seed),
        };
        if sampler.top_p == 0.0 {
            return Err(ApiError::invalid("top_p must be greater than 0", Some("top_p")));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid("at most 4 stop sequences are allowed", Some("stop")));
        }
        if stop.iter().any(|s| s.is_empty() || s.len() > 256) {
            return Err(ApiError::invalid(
                "stop sequences must be 1 to 256 bytes long",
                Some("stop"),
            ));
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => None,
            Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1", Some("max_tokens"))),
            Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
        };
        Ok(Settings {
            sampler,
            max_tokens,
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        })
    }
}

/// The conversation and tools of a chat request, checked.
pub fn chat_messages(req: &ChatRequest) -> Result<(Vec<ChatMessage>, Vec<Value>), ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty", Some("messages")));
    }
    let mut out = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(ApiError::invalid(
                format!("{param}.role '{}' is not one of system, user, assistant, tool", m.role),
                Some(&format!("{param}.role")),
            ));
        }
        let content = match &m.content {
            None => String::new(),
            Some(InContent::Text(s)) => s.clone(),
            Some(InContent::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                format!("{param}.content: only text parts are supported (got '{}')", p.kind),
                                Some(&format!("{param}.content")),
                            ))
                        }
                    }
                }
                s
            }
        };
        let mut tool_calls = Vec::new();
        for (j, c) in m.tool_calls.iter().flatten().enumerate() {
            let bad = || {
                ApiError::invalid(
                    format!(
                        "{param}.tool_calls[{j}].function.arguments must be a JSON object (or a string holding one)"
                    ),
                    Some(&format!("{param}.tool_calls[{j}].function.arguments")),
                )
            };
            let arguments = match &c.function.arguments {
                Value::String(s) if s.trim().is_empty() => serde_json::Map::new(),
                Value::String(s) => match serde_json::from_str::<Value>(s) {
                    Ok(Value::Object(o)) => o,
                    _ => return Err(bad()),
                },
                Value::Object(o) => o.clone(),
                _ => return Err(bad()),
            };
            tool_calls.push(ToolCall {
                name: c.function.name.clone(),
                arguments,
            });
        }
        // OpenAI's newer "developer" role is a system message.
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        out.push(ChatMessage {
            role: role.to_string(),
            content,
            reasoning_content: m.reasoning_content.clone(),
            tool_calls,
        });
    }
    let mut tools = Vec::new();
    if req.tool_choice.as_ref().and_then(Value::as_str) != Some("none") {
        for (i, t) in req.tools.iter().flatten().enumerate() {
            let name = t.pointer("/function/name").and_then(Value::as_str);
            if t.get("type").and_then(Value::as_str) != Some("function") || name.is_none_or(str::is_empty) {
                return Err(ApiError::invalid(
                    format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                    Some(&format!("tools[{i}]")),
                ));
            }
            tools.push(t.clone());
        }
    }
    if let Some(f) = &req.response_format {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::invalid(
                "response_format: only {\"type\": \"text\"} is supported",
                Some("response_format"),
            ));
        }
    }
    Ok((out, tools))
}

/// The optional `cache_salt` field (as vLLM has it): requests share prefix-cache entries only
/// when their salts (and API keys) are the same.
#[derive(Deserialize, Default)]
pub struct CacheScope {
    pub cache_salt: Option<String>,
}

impl CacheScope {
    /// The salt, checked: 1 to 256 bytes.
    pub fn salt(&self) -> Result<Option<&str>, ApiError> {
        match self.cache_salt.as_deref() {
            Some(s) if s.is_empty() || s.len() > 256 => Err(ApiError::invalid(
                "cache_salt must be 1 to 256 bytes long",
                Some("cache_salt"),
            )),
            s => Ok(s),
        }
    }
}
