//! Parsing what the model writes in the Qwen3.5 format: reasoning up to `</think>`, then the
//! answer, with tool calls as `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n
//! </function>\n</tool_call>` blocks. `ReplyStream` does it incrementally for streaming, holding
//! back only text that could still turn out to be the start of a tag (or trailing whitespace,
//! which the template trims), so the concatenated events equal `parse_reply` of the whole text.

use serde_json::Value;

use super::ToolCall;

const THINK_END: &str = "</think>";
const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";

/// One piece of a reply, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyEvent {
    Reasoning(String),
    Content(String),
    ToolCall(ToolCall),
}

/// A whole reply, split.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedReply {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Reasoning,
    Content,
    ToolCall,
}

/// Incremental reply parser.
pub struct ReplyStream {
    mode: Mode,
    buf: String,
    /// Drop leading whitespace of the next reasoning/content text (start, after `</think>`,
    /// between tool calls).
    strip_leading: bool,
    /// Whitespace between content and a `<tool_call>`: dropped when the block is a call, kept
    /// when it turns out to be ordinary text.
    ws_before_call: String,
    /// The request's tool definitions: parameter types decide whether a value is kept raw or
    /// read as JSON.
    tools: Vec<Value>,
}

impl ReplyStream {
    /// `thinking`: the prompt pre-filled `<think>\n`, so the reply starts with reasoning.
    /// `tools`: the request's tool definitions (OpenAI format), for argument types.
    pub fn new(thinking: bool, tools: &[Value]) -> ReplyStream {
        ReplyStream {
            mode: if thinking { Mode::Reasoning } else { Mode::Content },
            buf: String::new(),
            strip_leading: true,
            ws_before_call: String::new(),
            tools: tools.to_vec(),
        }
    }

    /// Feed generated text; returns the events it completes.
    pub fn push(&mut self, text: &str) -> Vec<ReplyEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.strip_leading && self.mode != Mode::ToolCall {
                let trimmed = self.buf.trim_start().len();
                self.buf.drain(..self.buf.len() - trimmed);
                if self.buf.is_empty() {
                    break;
                }
                self.strip_leading = false;
            }
            let (tag, next) = match self.mode {
                Mode::Reasoning => (THINK_END, Mode::Content),
                Mode::Content => (CALL_START, Mode::ToolCall),
                Mode::ToolCall => (CALL_END, Mode::Content),
            };
            match self.buf.find(tag) {
                Some(i) => {
                    let before: String = self.buf[..i].to_string();
                    self.buf.drain(..i + tag.len());
                    self.strip_leading = self.emit_final(&before, &mut out);
                    self.mode = next;
                }
                None => {
                    if self.mode != Mode::ToolCall {
                        let keep = held_back(&self.buf, tag);
                        let ready: String = self.buf[..self.buf.len() - keep].to_string();
                        self.buf.drain(..ready.len());
                        self.emit_text(ready, &mut out);
                    }
                    break;
                }
            }
        }
        out
    }

    /// End of generation: everything still held back.
    pub fn finish(&mut self) -> Vec<ReplyEvent> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        match self.mode {
            Mode::ToolCall => match parse_tool_call(&rest, &self.tools) {
                // Cut off before `</tool_call>` (a length limit): keep what parses.
                Some(call) => out.push(ReplyEvent::ToolCall(call)),
                None => {
                    let text = format!("{}{CALL_START}{rest}", self.ws_before_call);
                    self.emit_text(text.trim_end().to_string(), &mut out)
                }
            },
            _ => self.emit_text(rest.trim_end().to_string(), &mut out),
        }
        out
    }

    /// Text that ends at the current mode's closing tag. Returns whether leading whitespace of
    /// what follows is dropped (the template trims around reasoning and tool calls).
    fn emit_final(&mut self, text: &str, out: &mut Vec<ReplyEvent>) -> bool {
        match self.mode {
            Mode::ToolCall => match parse_tool_call(text, &self.tools) {
                Some(call) => {
                    out.push(ReplyEvent::ToolCall(call));
                    true
                }
                None => {
                    // Not a call after all: the whole block is ordinary text.
                    let ws = std::mem::take(&mut self.ws_before_call);
                    self.emit_text(format!("{ws}{CALL_START}{text}{CALL_END}"), out);
                    false
                }
            },
            Mode::Content => {
                let body = text.trim_end();
                self.ws_before_call = text[body.len()..].to_string();
                self.emit_text(body.to_string(), out);
                true
            }
            Mode::Reasoning => {
                self.emit_text(text.trim_end().to_string(), out);
                true
            }
        }
    }

    fn emit_text(&self, text: String, out: &mut Vec<ReplyEvent>) {
        if text.is_empty() {
            return;
        }
        out.push(match self.mode {
            Mode::Reasoning => ReplyEvent::Reasoning(text),
            _ => ReplyEvent::Content(text),
        });
    }
}

/// How many trailing bytes of `buf` to hold back: trailing whitespace (it may precede a tag, and
/// the template trims it) or a suffix that is a proper prefix of `tag`.
fn held_back(buf: &str, tag: &str) -> usize {
    let partial = (1..tag.len().min(buf.len() + 1))
        .rev()
        .find(|&k| buf.is_char_boundary(buf.len() - k) && tag.starts_with(&buf[buf.len() - k..]))
        .unwrap_or(0);
    let body = &buf[..buf.len() - partial];
    let ws = body.len() - body.trim_end().len();
    partial + ws
}

/// Split a whole reply (see `ReplyStream`).
pub fn parse_reply(text: &str, thinking: bool, tools: &[Value]) -> ParsedReply {
    let mut s = ReplyStream::new(thinking, tools);
    let mut events = s.push(text);
    events.extend(s.finish());
    let mut r = ParsedReply::default();
    for e in events {
        match e {
            ReplyEvent::Reasoning(t) => r.reasoning.push_str(&t),
            ReplyEvent::Content(t) => r.content.push_str(&t),
            ReplyEvent::ToolCall(c) => r.tool_calls.push(c),
        }
    }
    r
}

/// Parse the inside of a `<tool_call>` block. `None` when it is not a function call.
fn parse_tool_call(block: &str, tools: &[Value]) -> Option<ToolCall> {
    let rest = block.trim().strip_prefix("<function=")?;
    let (name, mut body) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() || name.contains('\n') {
        return None;
    }
    if let Some(end) = body.rfind("</function>") {
        body = &body[..end];
    }
    let mut arguments = serde_json::Map::new();
    while let Some(start) = body.find("<parameter=") {
        let after = &body[start + "<parameter=".len()..];
        let (pname, value_and_rest) = after.split_once('>')?;
        let (value, rest) = match value_and_rest.find("</parameter>") {
            Some(end) => (&value_and_rest[..end], &value_and_rest[end + "</parameter>".len()..]),
            None => match value_and_rest.find("<parameter=") {
                Some(next) => (&value_and_rest[..next], &value_and_rest[next..]),
                None => (value_and_rest, ""),
            },
        };
        // The template writes "\n" before and after every value.
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let pname = pname.trim().to_string();
        let v = typed_value(tools, name, &pname, value);
        arguments.insert(pname, v);
        body = rest;
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// A parameter value: raw text for string parameters and unknown ones, JSON when the tool's
/// schema declares another type and the text parses.
fn typed_value(tools: &[Value], function: &str, param: &str, raw: &str) -> Value {
    let schema_type = tools
        .iter()
        .filter_map(|t| t.get("function").or(Some(t)))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(function))
        .and_then(|f| f.pointer("/parameters/properties"))
        .and_then(|p| p.get(param))
        .and_then(|p| p.get("type"));
    let is_string = |t: &Value| t.as_str() == Some("string");
    match schema_type {
        Some(t) if is_string(t) => Value::String(raw.to_string()),
        Some(Value::Array(ts)) if ts.iter().all(is_string) => Value::String(raw.to_string()),
        Some(_) => serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_string())),
        None => Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather_tool() -> Value {
        serde_json::json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
            "opts": {"type": "object"}}}}})
    }

    const CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis 12\n</parameter>\n\
                        <parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n\
                        </function>\n</tool_call>";

    #[test]
    fn whole_reply_with_reasoning_and_tool_call() {
        let text = format!("Let me check.\n</think>\n\nI will look it up.\n\n{CALL}");
        let r = parse_reply(&text, true, &[weather_tool()]);
        assert_eq!(r.reasoning, "Let me check.");
        assert_eq!(r.content, "I will look it up.");
        assert_eq!(r.tool_calls.len(), 1);
        let c = &r.tool_calls[0];
        assert_eq!(c.name, "get_weather");
        assert_eq!(c.arguments["city"], Value::String("Paris 12".into()));
        assert_eq!(c.arguments["days"], serde_json::json!(3));
        assert_eq!(c.arguments["opts"], serde_json::json!({"unit": "C"}));
    }

    #[test]
    fn streaming_in_any_split_equals_whole() {
        let text = format!("think <b>hard</b>\n</think>\n\nAnswer: x < y\n\n{CALL}\n{CALL}");
        let whole = parse_reply(&text, true, &[weather_tool()]);
        assert_eq!(whole.tool_calls.len(), 2);
        assert_eq!(whole.content, "Answer: x < y");
        for step in [1, 2, 3, 5, 7, 11] {
            let mut s = ReplyStream::new(true, &[weather_tool()]);
            let mut got = ParsedReply::default();
            let chars: Vec<char> = text.chars().collect();
            let mut events = Vec::new();
            for chunk in chars.chunks(step) {
                events.extend(s.push(&chunk.iter().collect::<String>()));
            }
            events.extend(s.finish());
            for e in events {
                match e {
                    ReplyEvent::Reasoning(t) => got.reasoning.push_str(&t),
                    ReplyEvent::Content(t) => got.content.push_str(&t),
                    ReplyEvent::ToolCall(c) => got.tool_calls.push(c),
                }
            }
            assert_eq!(got, whole, "step {step}");
        }
    }

    #[test]
    fn plain_answers_and_broken_calls() {
        let r = parse_reply("  Hello there.  \n", false, &[]);
        assert_eq!(
            r,
            ParsedReply {
                content: "Hello there.".into(),
                ..Default::default()
            }
        );
        // Not a function call: kept as text.
        let r = parse_reply("a <tool_call>nonsense</tool_call> b", false, &[]);
        assert_eq!(r.content, "a <tool_call>nonsense</tool_call> b");
        assert!(r.tool_calls.is_empty());
        // Cut off by the length limit inside the block: what parses is kept.
        let r = parse_reply("<tool_call>\n<function=f>\n<parameter=x>\n1", false, &[]);
        assert_eq!(r.tool_calls[0].name, "f");
        assert_eq!(r.tool_calls[0].arguments["x"], Value::String("1".into()));
        // Unknown parameters stay strings even when they look like JSON.
        let r = parse_reply(
            "<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n</function>\n</tool_call>",
            false,
            &[],
        );
        assert_eq!(r.tool_calls[0].arguments["n"], Value::String("42".into()));
    }

    #[test]
    fn reasoning_without_end_stays_reasoning() {
        let r = parse_reply("still thinking </thi", true, &[]);
        assert_eq!(r.reasoning, "still thinking </thi");
        assert_eq!(r.content, "");
    }
}
