//! The Qwen3.5 chat template, hard-coded (TOKENIZER.md §6) so the engine needs no Jinja
//! interpreter: text conversations, reasoning, tools and tool calls, and the parsing of what the
//! model replies in that format.
//!
//! Rendering produces pieces that remember who wrote each part: the template's own text (where
//! `<|im_start|>` and friends are special tokens) or content from the user, a tool or the model
//! (always plain text: a user who types `<|im_start|>` gets those characters, not a turn marker).
//! `Tokenizer::encode_chat` turns the pieces into ids exactly as tokenizing the whole rendered
//! string would, except that no special token is ever recognised inside content.

mod pyjson;
mod reply;

use serde_json::Value;

use super::special::Fragment;
use super::Tokenizer;
use crate::{Error, Result};

pub use reply::{parse_reply, ParsedReply, ReplyEvent, ReplyStream};

/// A tool call inside an assistant message: the function name and its arguments object.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: serde_json::Map<String, Value>,
}

/// One chat turn. `role` is `system`, `user`, `assistant` or `tool`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's reasoning, when given separately from `content`.
    pub reasoning_content: Option<String>,
    /// An assistant's tool calls.
    pub tool_calls: Vec<ToolCall>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// Template switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatOptions {
    /// End with an open assistant turn for the model to complete.
    pub add_generation_prompt: bool,
    /// Let the model reason first (`<think>\n` pre-filled); off pre-fills an empty think block.
    pub enable_thinking: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            add_generation_prompt: true,
            enable_thinking: true,
        }
    }
}

/// Places in the rendered conversation where a token boundary is guaranteed (every piece of
/// template text that follows starts a new pre-token), recorded by `encode_chat` so callers can
/// snapshot there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// Before the `<|im_start|>` of a turn.
    TurnStart,
    /// After `<|im_start|>assistant\n` of the generation prompt: what follows (`<think>`...)
    /// differs from how the same turn is rendered in a later request's history.
    ReplyStart,
}

#[derive(Debug, Clone)]
enum Piece {
    /// Template text: special tokens in it are recognised.
    Template(&'static str),
    /// Text from a message or a tool definition: never special.
    Content(String),
    Mark(Mark),
}

/// A rendered conversation (see the module comment).
#[derive(Debug, Clone, Default)]
pub struct ChatPrompt {
    pieces: Vec<Piece>,
}

impl ChatPrompt {
    fn t(&mut self, s: &'static str) {
        self.pieces.push(Piece::Template(s));
    }
    fn c(&mut self, s: impl Into<String>) {
        self.pieces.push(Piece::Content(s.into()));
    }
    fn mark(&mut self, m: Mark) {
        self.pieces.push(Piece::Mark(m));
    }

    /// The rendered text, as the Jinja template would print it.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for p in &self.pieces {
            match p {
                Piece::Template(t) => s.push_str(t),
                Piece::Content(c) => s.push_str(c),
                Piece::Mark(_) => {}
            }
        }
        s
    }

    /// Bytes of `text()`, without building it (a cheap bound before tokenizing).
    pub fn text_len(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Template(t) => t.len(),
                Piece::Content(c) => c.len(),
                Piece::Mark(_) => 0,
            })
            .sum()
    }
}

/// Token ids of a rendered conversation and its boundaries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedChat {
    pub tokens: Vec<u32>,
    /// Token index of every turn's `<|im_start|>` (including the generation prompt's).
    pub turn_starts: Vec<usize>,
    /// Token index where the assistant's reply body starts in the generation prompt (after
    /// `<|im_start|>assistant\n`), when there is one.
    pub reply_start: Option<usize>,
}

/// The fixed instructions the template puts after the tool list (verbatim from the Qwen3.5
/// template: the model was trained on this text).
const TOOL_INSTRUCTIONS: &str = "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

fn chat_err(msg: impl Into<String>) -> Error {
    Error::Tokenizer(format!("chat: {}", msg.into()))
}

/// Whether a (trimmed) user message is only a relayed tool response.
fn is_tool_response(content: &str) -> bool {
    content.starts_with("<tool_response>") && content.ends_with("</tool_response>")
}

/// Render `messages` (and the `tools` JSON definitions, OpenAI format) with the Qwen3.5 template.
pub fn render_chat_prompt(messages: &[ChatMessage], tools: &[Value], opts: ChatOptions) -> Result<ChatPrompt> {
    if messages.is_empty() {
        return Err(chat_err("no messages"));
    }
    for (i, m) in messages.iter().enumerate() {
        match m.role.as_str() {
            "system" if i != 0 => {
                return Err(chat_err(format!(
                    "system message at position {i}; it must be the first message"
                )))
            }
            "system" | "user" | "assistant" | "tool" => {}
            other => return Err(chat_err(format!("unexpected message role '{other}' at position {i}"))),
        }
    }
    // The template trims every message body before inserting it.
    let contents: Vec<&str> = messages.iter().map(|m| m.content.trim()).collect();
    // The last real user query (not a relayed tool response): assistant turns after it belong to
    // the current agentic turn and keep their reasoning.
    let last_query = messages
        .iter()
        .zip(&contents)
        .enumerate()
        .rev()
        .find(|(_, (m, c))| m.role == "user" && !is_tool_response(c))
        .map(|(i, _)| i)
        .ok_or_else(|| chat_err("no user query found in messages"))?;

    let mut p = ChatPrompt::default();
    let system = (messages[0].role == "system").then(|| contents[0]);
    if !tools.is_empty() {
        p.mark(Mark::TurnStart);
        p.t("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
        for tool in tools {
            p.t("\n");
            p.c(pyjson::tojson(tool));
        }
        p.t("\n</tools>");
        p.t(TOOL_INSTRUCTIONS);
        if let Some(s) = system.filter(|s| !s.is_empty()) {
            p.t("\n\n");
            p.c(s);
        }
        p.t("<|im_end|>\n");
    } else if let Some(s) = system {
        p.mark(Mark::TurnStart);
        p.t("<|im_start|>system\n");
        p.c(s);
        p.t("<|im_end|>\n");
    }

    for (i, (m, &content)) in messages.iter().zip(&contents).enumerate() {
        match m.role.as_str() {
            "user" => {
                p.mark(Mark::TurnStart);
                p.t("<|im_start|>user\n");
                p.c(content);
                p.t("<|im_end|>\n");
            }
            "assistant" => render_assistant(&mut p, m, content, i > last_query),
            "tool" => {
                // Consecutive tool results share one user turn.
                if i > 0 && messages[i - 1].role != "tool" {
                    p.mark(Mark::TurnStart);
                    p.t("<|im_start|>user");
                }
                p.t("\n<tool_response>\n");
                p.c(content);
                p.t("\n</tool_response>");
                if i + 1 == messages.len() || messages[i + 1].role != "tool" {
                    p.t("<|im_end|>\n");
                }
            }
            _ => {} // system: rendered above
        }
    }

    if opts.add_generation_prompt {
        p.mark(Mark::TurnStart);
        p.t("<|im_start|>assistant\n");
        p.mark(Mark::ReplyStart);
        p.t(if opts.enable_thinking {
            "<think>\n"
        } else {
            "<think>\n\n</think>\n\n"
        });
    }
    Ok(p)
}

fn render_assistant(p: &mut ChatPrompt, m: &ChatMessage, content: &str, keep_reasoning: bool) {
    let (reasoning, content) = match &m.reasoning_content {
        Some(r) => (r.as_str(), content),
        None => split_reasoning(content),
    };
    let reasoning = reasoning.trim();
    p.mark(Mark::TurnStart);
    if keep_reasoning && !reasoning.is_empty() {
        p.t("<|im_start|>assistant\n<think>\n");
        p.c(reasoning);
        p.t("\n</think>\n\n");
    } else {
        p.t("<|im_start|>assistant\n");
    }
    p.c(content);
    for (j, call) in m.tool_calls.iter().enumerate() {
        p.t(match (j, content.trim().is_empty()) {
            (0, true) => "<tool_call>\n<function=",
            (0, false) => "\n\n<tool_call>\n<function=",
            _ => "\n<tool_call>\n<function=",
        });
        p.c(call.name.as_str());
        p.t(">\n");
        for (name, value) in &call.arguments {
            p.t("<parameter=");
            p.c(name.as_str());
            p.t(">\n");
            p.c(pyjson::to_py_string(value));
            p.t("\n</parameter>\n");
        }
        p.t("</function>\n</tool_call>");
    }
    p.t("<|im_end|>\n");
}

/// Render `messages` (no tools) to text. Tokenize with `Tokenizer::encode_chat` on
/// `render_chat_prompt` instead when the text comes from users: re-tokenizing this string with
/// `parse_special` would turn control tokens typed by a user into real ones.
pub fn render_chat(messages: &[ChatMessage], add_generation_prompt: bool, enable_thinking: bool) -> Result<String> {
    let opts = ChatOptions {
        add_generation_prompt,
        enable_thinking,
    };
    Ok(render_chat_prompt(messages, &[], opts)?.text())
}

/// Separate `<think>reasoning</think>answer` as the template does: reasoning is the text before
/// the first `</think>` (after the last `<think>` in it), answer the text after the last one;
/// newlines around both are dropped. Content without `</think>` has no reasoning.
fn split_reasoning(content: &str) -> (&str, &str) {
    let Some(first_close) = content.find("</think>") else {
        return ("", content);
    };
    let before = content[..first_close].trim_end_matches('\n');
    let reasoning = match before.rfind("<think>") {
        Some(open) => &before[open + "<think>".len()..],
        None => before,
    };
    let reasoning = reasoning.trim_start_matches('\n');
    let last_close = content.rfind("</think>").unwrap_or(first_close);
    let answer = content[last_close + "</think>".len()..].trim_start_matches('\n');
    (reasoning, answer)
}

impl Tokenizer {
    /// Token ids of a rendered conversation: special tokens are recognised in the template's own
    /// text only; content is always plain text. Text on both sides of a content boundary is
    /// tokenized as one string, so for content without special-token text the ids equal those of
    /// `encode(&prompt.text(), true)`.
    pub fn encode_chat(&self, prompt: &ChatPrompt) -> EncodedChat {
        let mut out = EncodedChat::default();
        let mut run = String::new();
        let mut frags = Vec::new();
        let flush = |run: &mut String, ids: &mut Vec<u32>| {
            if !run.is_empty() {
                self.encode_text(run, ids);
                run.clear();
            }
        };
        for piece in &prompt.pieces {
            match piece {
                Piece::Template(text) => {
                    frags.clear();
                    self.special.split(text, true, &mut frags);
                    for f in &frags {
                        match f {
                            Fragment::Text(t) => run.push_str(t),
                            Fragment::Token(id) => {
                                flush(&mut run, &mut out.tokens);
                                out.tokens.push(*id);
                            }
                        }
                    }
                }
                Piece::Content(text) => run.push_str(text),
                Piece::Mark(m) => {
                    flush(&mut run, &mut out.tokens);
                    match m {
                        Mark::TurnStart => out.turn_starts.push(out.tokens.len()),
                        Mark::ReplyStart => out.reply_start = Some(out.tokens.len()),
                    }
                }
            }
        }
        flush(&mut run, &mut out.tokens);
        out
    }

    /// The tokens a follow-up request will start with after `reply` to `messages`: the
    /// conversation plus the reply rendered the way the template renders history (its reasoning
    /// dropped once a new user turn follows), up to the start of the next turn. A stand-in next
    /// message (a user query, or a tool result after tool calls) decides how the template treats
    /// the reply; its own tokens are cut off. Caching the state after these tokens makes the next
    /// turn cost only its new tokens.
    pub fn encode_follow_up(&self, messages: &[ChatMessage], tools: &[Value], reply: &ParsedReply) -> Result<Vec<u32>> {
        let mut all = messages.to_vec();
        let next_role = if reply.tool_calls.is_empty() { "user" } else { "tool" };
        all.push(ChatMessage {
            role: "assistant".into(),
            content: reply.content.clone(),
            reasoning_content: None,
            tool_calls: reply.tool_calls.clone(),
        });
        all.push(ChatMessage::new(next_role, "."));
        let opts = ChatOptions {
            add_generation_prompt: false,
            enable_thinking: true,
        };
        let mut enc = self.encode_chat(&render_chat_prompt(&all, tools, opts)?);
        let cut = enc.turn_starts.last().copied().unwrap_or(enc.tokens.len());
        enc.tokens.truncate(cut);
        Ok(enc.tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_split() {
        assert_eq!(split_reasoning("plain"), ("", "plain"));
        assert_eq!(split_reasoning("<think>\nhmm\n</think>\n\nYes"), ("hmm", "Yes"));
        assert_eq!(split_reasoning("hmm</think>Yes"), ("hmm", "Yes"));
    }
}
