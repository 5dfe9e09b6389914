//! One request's side of generation, whatever else shares its decode steps: its sampler, the
//! streaming text decoder, stop matching and (for chat) the reply parser that route its tokens to
//! its client; it says when the request is over and writes its `Done` and log line.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::job::{Done, Event};
use super::stop::StopMatcher;
use crate::cache::Finish;
use crate::sample::Sampler;
use crate::tokenizer::{ParsedReply, ReplyEvent, ReplyStream, StreamDecoder, Tokenizer};

/// Routes generated text through the reply parser (chat) to the client.
struct Output {
    events: UnboundedSender<Event>,
    parser: Option<ReplyStream>,
    reply: ParsedReply,
}

impl Output {
    fn emit(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match &mut self.parser {
            None => {
                let _ = self.events.send(Event::Text(text.to_string()));
            }
            Some(p) => {
                let evs = p.push(text);
                self.forward(evs);
            }
        }
    }

    fn finish(&mut self) {
        if let Some(p) = &mut self.parser {
            let evs = p.finish();
            self.forward(evs);
        }
    }

    fn forward(&mut self, evs: Vec<ReplyEvent>) {
        for e in evs {
            match &e {
                ReplyEvent::Reasoning(t) => self.reply.reasoning.push_str(t),
                ReplyEvent::Content(t) => self.reply.content.push_str(t),
                ReplyEvent::ToolCall(c) => self.reply.tool_calls.push(c.clone()),
            }
            let _ = self.events.send(Event::Reply(e));
        }
    }
}

/// What a request's tokens turn into, from its first sampled token to its `Done`.
pub struct Generation<'t> {
    pub sampler: Sampler,
    out: Output,
    dec: StreamDecoder<'t>,
    tok: &'t Tokenizer,
    stop: StopMatcher,
    max_tokens: usize,
    /// End-of-generation tokens are text like any other (the request's `ignore_eos`).
    ignore_eos: bool,
    /// Tokens handed to the client (an end-of-generation token is not one).
    generated: usize,
    stop_hit: bool,
    /// The client went away (or the server stops): the request ends as `cancelled`.
    gone: bool,
    /// Tokens counted in `generated` that the client never got (the one that found it gone).
    unsent: usize,
    /// When the model thread took the request, and when its first token came.
    started: Instant,
    first: Option<Instant>,
}

/// A finished request: its `Done` (not sent yet) and what the client got.
pub struct Ended {
    pub done: Done,
    pub reply: ParsedReply,
    /// The client went away: nothing of this request is worth caching.
    pub gone: bool,
}

impl<'t> Generation<'t> {
    /// `chat`: `Some(thinking, tools)` routes text through the reply parser.
    pub fn new(
        tok: &'t Tokenizer,
        sampler: Sampler,
        events: UnboundedSender<Event>,
        chat: Option<(bool, &[serde_json::Value])>,
        stop: Vec<String>,
        max_tokens: usize,
        ignore_eos: bool,
    ) -> Generation<'t> {
        Generation {
            sampler,
            out: Output {
                events,
                parser: chat.map(|(thinking, tools)| ReplyStream::new(thinking, tools)),
                reply: ParsedReply::default(),
            },
            dec: tok.stream_decoder(false),
            tok,
            stop: StopMatcher::new(stop),
            max_tokens,
            ignore_eos,
            generated: 0,
            stop_hit: false,
            gone: false,
            unsent: 0,
            started: Instant::now(),
            first: None,
        }
    }

    /// Whether the client is gone (its receiver dropped).
    pub fn client_gone(&self) -> bool {
        self.out.events.is_closed()
    }

    pub fn send(&self, e: Event) {
        let _ = self.out.events.send(e);
    }

    /// Take sampled token `t`: stream its text. Returns why the request ends, if it does (`t`
    /// then still counts unless it is end-of-generation). `stopping`: the server shuts down.
    pub fn on_token(&mut self, t: u32, stopping: bool) -> Option<Finish> {
        self.first.get_or_insert_with(Instant::now);
        if self.tok.is_eog(t) && !self.ignore_eos {
            return Some(Finish::Eog);
        }
        self.generated += 1;
        if stopping || self.client_gone() {
            self.gone = true;
            self.unsent = 1;
            return Some(Finish::Stopped);
        }
        let (text, hit) = self.stop.push(&self.dec.push(t));
        self.out.emit(&text);
        if hit {
            self.stop_hit = true;
            return Some(Finish::Stopped);
        }
        (self.generated >= self.max_tokens).then_some(Finish::Length)
    }

    /// End the request before its next token: the client went away or the server stops.
    pub fn cancel(&mut self) {
        self.gone = true;
    }

    /// Flush what is held back and build the request's `Done`; logs one line for `client`.
    pub fn end(&mut self, finish: Finish, prompt_tokens: usize, cached_tokens: usize, client: &str) -> Ended {
        if !self.stop_hit && !self.gone {
            let (text, hit) = self.stop.push(&self.dec.finish());
            self.out.emit(&text);
            if !hit {
                self.out.emit(&self.stop.finish());
            }
        }
        self.out.finish();
        let reply = std::mem::take(&mut self.out.reply);
        let finish_reason = match finish {
            _ if self.gone => "cancelled",
            Finish::Length => "length",
            Finish::Eog | Finish::Stopped if !reply.tool_calls.is_empty() => "tool_calls",
            Finish::Eog | Finish::Stopped => "stop",
        };
        let completion_tokens = self.generated - self.unsent;
        let first_token_secs = self.first.map_or(0.0, |f| f.duration_since(self.started).as_secs_f64());
        let decode_secs = self.first.map_or(0.0, |f| f.elapsed().as_secs_f64());
        let client = if client.is_empty() {
            String::new()
        } else {
            format!(" from {client}")
        };
        eprintln!(
            "request{client}: prompt {prompt_tokens} tokens ({cached_tokens} from cache, {} run), first token after {:.1} ms, {completion_tokens} generated in {:.1} ms, {finish_reason}",
            prompt_tokens - cached_tokens.min(prompt_tokens),
            first_token_secs * 1e3,
            decode_secs * 1e3,
        );
        Ended {
            done: Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                first_token_secs,
                decode_secs,
            },
            reply,
            gone: self.gone,
        }
    }
}
