//! `rill chat`: an interactive multi-turn chat in the terminal. Each turn renders the whole
//! conversation with the chat template, but only runs the tokens the cached state has not seen:
//! after every reply the conversation is cached the way the next turn will render it.
//! Reads piped stdin too (one message per line), so it can be scripted.
//!
//! Nothing a turn or a command runs into ends the chat: a turn that fails is taken back whole
//! (the conversation and the model state as before the message), a `/load` that fails leaves the
//! current conversation, and a `/save` that fails leaves the previous file.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use clap::Args;

use super::common;
use super::saved_chat::SavedChat;
use super::serve::EngineArgs;
use crate::cache::{model_fingerprint, read_state, write_state, Engine, Flow, Outcome};
use crate::error::{Error, Result};
use crate::exec::Snapshot;
use crate::gguf::GgufFile;
use crate::sample::{Sampler, SamplerConfig};
use crate::tokenizer::{render_chat_prompt, ChatMessage, ChatOptions, EncodedChat, ReplyEvent, ReplyStream, Tokenizer};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// System message.
    #[arg(long)]
    system: Option<String>,
    /// Answer without thinking (the template's empty think block).
    #[arg(long)]
    no_think: bool,
    /// Do not print the model's thinking (it is still generated unless --no-think).
    #[arg(long)]
    hide_think: bool,
    /// Most tokens per reply (default: until the context is full).
    #[arg(short = 'n', long)]
    n_predict: Option<usize>,
    #[command(flatten)]
    sampling: common::SamplingArgs,
}

const HELP: &str =
    "commands: /reset  /save FILE  /load FILE  /stats  /help  /exit   (end a line with \\ to continue it)";

struct Chat {
    engine: Engine,
    tok: Tokenizer,
    fingerprint: u64,
    messages: Vec<ChatMessage>,
    system: Option<String>,
    thinking: bool,
    show_think: bool,
    color: bool,
    sampler: SamplerConfig,
    n_predict: Option<usize>,
    turns: u64,
    last: Option<Outcome>,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let sampler = a.sampling.config()?;
    let fingerprint = model_fingerprint(&GgufFile::open(&a.engine.model)?);
    let (engine, tok) = a.engine.engine()?;
    let mut chat = Chat {
        engine,
        tok,
        fingerprint,
        messages: Vec::new(),
        system: a.system.clone(),
        thinking: !a.no_think,
        show_think: !a.hide_think,
        color: std::io::stdout().is_terminal(),
        sampler,
        n_predict: a.n_predict,
        turns: 0,
        last: None,
    };
    chat.reset_messages();
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        eprintln!("{HELP}");
    }
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(text) = read_message(&mut lines)? else {
            break;
        };
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        if let Some(cmd) = text.strip_prefix('/') {
            match chat.command(cmd) {
                Ok(true) => continue,
                Ok(false) => break,
                // A failed command (a missing file, a state of another model) is reported and
                // the chat goes on.
                Err(e) => {
                    eprintln!("error: {e}");
                    continue;
                }
            }
        }
        if let Err(e) = chat.turn(text) {
            eprintln!("error: {e}\n[that message was dropped: the conversation is kept as it was before it]");
        }
    }
    Ok(())
}

/// One message: a line, joined with the following ones while it ends with `\`.
fn read_message(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> Result<Option<String>> {
    let mut msg = String::new();
    for line in lines {
        let line = line.map_err(Error::IoPlain)?;
        match line.strip_suffix('\\') {
            Some(part) => {
                msg.push_str(part);
                msg.push('\n');
            }
            None => {
                msg.push_str(&line);
                return Ok(Some(msg));
            }
        }
    }
    Ok((!msg.is_empty()).then_some(msg))
}

impl Chat {
    fn reset_messages(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.system {
            self.messages.push(ChatMessage::new("system", s.as_str()));
        }
    }

    /// Run a `/command`. `Ok(false)` ends the chat.
    fn command(&mut self, cmd: &str) -> Result<bool> {
        let (name, arg) = match cmd.split_once(char::is_whitespace) {
            Some((n, a)) => (n, a.trim()),
            None => (cmd, ""),
        };
        let need_file = || -> Result<&Path> {
            if arg.is_empty() {
                return Err(Error::InvalidArgument(format!("/{name} needs a file name")));
            }
            Ok(Path::new(arg))
        };
        match name {
            "exit" | "quit" => return Ok(false),
            "help" => eprintln!("{HELP}"),
            "reset" => {
                self.engine.reset()?;
                self.reset_messages();
                eprintln!("[conversation cleared]");
            }
            "save" => self.save(need_file()?)?,
            "load" => self.load(need_file()?)?,
            "stats" => self.print_stats(),
            other => eprintln!("unknown command /{other}; {HELP}"),
        }
        Ok(true)
    }

    /// One message and its reply, all or nothing: when anything fails (generation, non-finite
    /// logits, the device, caching the reply) the conversation and the model state go back to
    /// where they were before the message, and the error is returned for the caller to report.
    fn turn(&mut self, text: &str) -> Result<()> {
        let mut messages = self.messages.clone();
        messages.push(ChatMessage::new("user", text));
        let opts = ChatOptions {
            add_generation_prompt: true,
            enable_thinking: self.thinking,
        };
        let enc = self.tok.encode_chat(&render_chat_prompt(&messages, &[], opts)?);
        let n_ctx = self.engine.n_ctx();
        if enc.tokens.len() >= n_ctx {
            eprintln!(
                "error: the conversation ({} tokens) no longer fits the context of {n_ctx} tokens; /reset or use a larger --ctx",
                enc.tokens.len()
            );
            return Ok(());
        }
        let before = self.checkpoint()?;
        self.reply(messages, enc).inspect_err(|_| self.roll_back(before))
    }

    /// The live state, to go back to if a turn fails; `None` when the device has no room for a
    /// copy (the turn still runs; if it fails, the state is rebuilt from the conversation).
    fn checkpoint(&self) -> Result<Option<(Vec<u32>, Snapshot)>> {
        match self.engine.snapshot_live() {
            Ok(live) => Ok(Some(live)),
            Err(Error::OutOfMemory { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Make `checkpoint` the live state again after a failed turn. Without one (or when restoring
    /// fails too) the live state and the cache are cleared: the conversation is still whole, and
    /// the next turn computes its state from the start.
    fn roll_back(&mut self, checkpoint: Option<(Vec<u32>, Snapshot)>) {
        let restored = match checkpoint {
            Some((tokens, snap)) => self.engine.load_live(tokens, snap),
            None => Err(Error::InvalidArgument("no copy of the state to go back to".into())),
        };
        if let Err(e) = restored {
            eprintln!("[the model state could not be restored ({e}); the next turn recomputes it]");
            if let Err(e) = self.engine.reset() {
                eprintln!("error: clearing the model state: {e}");
            }
        }
    }

    /// Generate the reply to `messages` (the conversation and the new message, rendered as
    /// `enc`, which fits the context) and make them the conversation.
    fn reply(&mut self, mut messages: Vec<ChatMessage>, enc: EncodedChat) -> Result<()> {
        let n_ctx = self.engine.n_ctx();
        let room = n_ctx - enc.tokens.len();
        let max_new = self.n_predict.map_or(room, |n| n.min(room));
        let mut cfg = self.sampler;
        cfg.seed = cfg.seed.wrapping_add(self.turns);
        let mut sampler = Sampler::new(cfg)?;
        let mut parser = ReplyStream::new(self.thinking, &[]);
        let mut printer = Printer::new(self.show_think, self.color);
        let mut content = String::new();
        let tok = &self.tok;
        let mut dec = tok.stream_decoder(false);
        let snap_at: Vec<usize> = enc.reply_start.into_iter().collect();
        let handle = |evs: Vec<ReplyEvent>, content: &mut String, printer: &mut Printer| -> Result<bool> {
            for e in evs {
                if let ReplyEvent::Content(t) = &e {
                    content.push_str(t);
                }
                if !printer.print(&e)? {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let outcome = self.engine.generate(
            &enc.tokens,
            &snap_at,
            max_new,
            &mut sampler,
            &|t| tok.is_eog(t),
            &mut |t| {
                let evs = parser.push(&dec.push(t));
                Ok(if handle(evs, &mut content, &mut printer)? {
                    Flow::Continue
                } else {
                    Flow::Stop
                })
            },
        );
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                // End the part of the reply already printed before the error is reported.
                if printer.printed {
                    let _ = printer.end();
                }
                return Err(e);
            }
        };
        let mut evs = parser.push(&dec.finish());
        evs.extend(parser.finish());
        handle(evs, &mut content, &mut printer)?;
        printer.end()?;
        let reply = crate::tokenizer::ParsedReply {
            content,
            ..Default::default()
        };
        let next = self.tok.encode_follow_up(&messages, &[], &reply)?;
        // Prepare the next turn while the user reads: cache the conversation as it will be rendered.
        self.engine.cache_sequence(&next)?;
        messages.push(ChatMessage::new("assistant", reply.content));
        self.messages = messages;
        self.turns += 1;
        self.last = Some(outcome);
        Ok(())
    }

    fn save(&mut self, path: &Path) -> Result<()> {
        let (tokens, snap) = self.engine.snapshot_live()?;
        let saved = SavedChat {
            messages: self.messages.clone(),
            tokens,
            thinking: self.thinking,
        };
        write_state(
            path,
            self.fingerprint,
            &saved.to_meta(),
            &snap,
            self.engine.model().backend().as_ref(),
        )?;
        eprintln!(
            "[saved {} messages, {} tokens of state, to {}]",
            saved.messages.len(),
            saved.tokens.len(),
            path.display()
        );
        Ok(())
    }

    fn load(&mut self, path: &Path) -> Result<()> {
        let model = self.engine.model();
        let saved = read_state(
            path,
            self.fingerprint,
            &model.config,
            self.engine.n_ctx(),
            model.backend().as_ref(),
        )?;
        // Everything is checked before anything changes: a refused file leaves the chat as it was.
        let chat = SavedChat::from_meta(&saved.meta, model.config.n_vocab, saved.snap.pos)
            .map_err(|problem| Error::state_file(path, problem))?;
        self.engine.load_live(chat.tokens, saved.snap)?;
        self.messages = chat.messages;
        eprintln!(
            "[loaded {} messages, {} tokens of state, from {}]",
            self.messages.len(),
            self.engine.live_tokens().len(),
            path.display()
        );
        Ok(())
    }

    fn print_stats(&self) {
        let s = self.engine.stats();
        eprintln!(
            "turns {} | context {}/{} tokens | cache: {} snapshots, {:.1} MiB of {:.0} MiB, {} hits, {} misses, {} tokens reused",
            self.turns,
            s.pos,
            s.n_ctx,
            s.cache.entries,
            s.cache.bytes as f64 / (1 << 20) as f64,
            s.cache.budget as f64 / (1 << 20) as f64,
            s.cache.hits,
            s.cache.misses,
            s.cache.tokens_reused
        );
        if let Some(o) = &self.last {
            let gen = o.generated.len();
            eprintln!(
                "last turn: prompt {} tokens ({} cached, {} run), first token after {:.3} s | {} tokens generated at {:.1} tokens/s | {}",
                o.prompt_tokens,
                o.cached_tokens,
                o.prompt_tokens - o.cached_tokens,
                o.first_token_secs,
                gen,
                gen.saturating_sub(1) as f64 / o.decode_secs.max(1e-9),
                super::common::backend_label(self.engine.model().backend().as_ref())
            );
        }
    }
}

/// Streams reply events to stdout: reasoning dimmed on a terminal (or between `<think>` tags
/// when piped), or hidden.
struct Printer {
    out: std::io::Stdout,
    show_think: bool,
    color: bool,
    in_think: bool,
    printed: bool,
}

impl Printer {
    fn new(show_think: bool, color: bool) -> Printer {
        Printer {
            out: std::io::stdout(),
            show_think,
            color,
            in_think: false,
            printed: false,
        }
    }

    /// `Ok(false)` when stdout is a closed pipe.
    fn print(&mut self, e: &ReplyEvent) -> Result<bool> {
        let mut s = String::new();
        match e {
            ReplyEvent::Reasoning(t) => {
                if !self.show_think {
                    return Ok(true);
                }
                if !self.in_think {
                    s.push_str(if self.color { "\x1b[2m" } else { "<think>\n" });
                    self.in_think = true;
                }
                s.push_str(t);
            }
            ReplyEvent::Content(t) => {
                s.push_str(&self.close_think());
                s.push_str(t);
            }
            ReplyEvent::ToolCall(_) => {}
        }
        self.printed |= !s.is_empty();
        self.write(&s)
    }

    fn close_think(&mut self) -> String {
        if !self.in_think {
            return String::new();
        }
        self.in_think = false;
        if self.color {
            "\x1b[0m\n\n".into()
        } else {
            "\n</think>\n\n".into()
        }
    }

    fn end(&mut self) -> Result<bool> {
        let mut s = self.close_think();
        s.push('\n');
        self.write(&s)
    }

    fn write(&mut self, s: &str) -> Result<bool> {
        let mut out = self.out.lock();
        match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(Error::IoPlain(e)),
        }
    }
}
