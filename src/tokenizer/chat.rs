//! Hard-coded rendering of the Qwen3.5 chat template for text-only conversations
//! (TOKENIZER.md §6), so the engine needs no Jinja interpreter. Tokenize the result with
//! `parse_special = true`.

use crate::{Error, Result};

/// One chat turn. `role` is `system`, `user`, `assistant` or `tool`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Render `messages` in the Qwen3.5 chat format. With `add_generation_prompt` the text ends
/// with an open assistant turn: `<think>\n` pre-filled when `enable_thinking`, an empty think
/// block otherwise.
pub fn render_chat(messages: &[ChatMessage], add_generation_prompt: bool, enable_thinking: bool) -> Result<String> {
    for (i, m) in messages.iter().enumerate() {
        match m.role.as_str() {
            "system" if i != 0 => {
                return Err(Error::Tokenizer(format!(
                    "chat: system message at position {i}; it must be the first message"
                )))
            }
            "system" | "user" | "assistant" | "tool" => {}
            other => {
                return Err(Error::Tokenizer(format!(
                    "chat: unexpected message role '{other}' at position {i}"
                )))
            }
        }
    }

    // The template trims every message body before inserting it.
    let contents: Vec<&str> = messages.iter().map(|m| m.content.trim()).collect();

    // Index of the last real user query (not a relayed tool response). Assistant turns after
    // it belong to the current agentic turn and keep their reasoning. Without any user query
    // every assistant turn counts as history.
    let last_query = messages
        .iter()
        .zip(&contents)
        .enumerate()
        .rev()
        .find(|(_, (m, c))| m.role == "user" && !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>")))
        .map(|(i, _)| i)
        .unwrap_or(messages.len().saturating_sub(1));

    let mut out = String::new();
    for (i, (m, &content)) in messages.iter().zip(&contents).enumerate() {
        match m.role.as_str() {
            "system" | "user" => {
                out.push_str("<|im_start|>");
                out.push_str(&m.role);
                out.push('\n');
                out.push_str(content);
                out.push_str("<|im_end|>\n");
            }
            "assistant" => {
                let (reasoning, answer) = split_reasoning(content);
                out.push_str("<|im_start|>assistant\n");
                if i > last_query {
                    out.push_str("<think>\n");
                    out.push_str(reasoning);
                    out.push_str("\n</think>\n\n");
                }
                out.push_str(answer);
                out.push_str("<|im_end|>\n");
            }
            "tool" => {
                // Consecutive tool results are grouped into one user turn.
                let first_of_group = i == 0 || messages[i - 1].role != "tool";
                let last_of_group = i + 1 == messages.len() || messages[i + 1].role != "tool";
                if first_of_group {
                    out.push_str("<|im_start|>user");
                }
                out.push_str("\n<tool_response>\n");
                out.push_str(content);
                out.push_str("\n</tool_response>");
                if last_of_group {
                    out.push_str("<|im_end|>\n");
                }
            }
            _ => {}
        }
    }

    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
        if enable_thinking {
            out.push_str("<think>\n");
        } else {
            out.push_str("<think>\n\n</think>\n\n");
        }
    }
    Ok(out)
}

/// Separate `<think>reasoning</think>answer` as the template does: reasoning is the text
/// before the first `</think>` (after any `<think>`), answer the text after the last one;
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
    let reasoning = reasoning.trim_matches('\n');
    let last_close = content.rfind("</think>").unwrap_or(first_close);
    let answer = content[last_close + "</think>".len()..].trim_start_matches('\n');
    (reasoning, answer)
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
