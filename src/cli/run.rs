//! `rill run`: stream a generation to stdout, then print prompt and generation speed to stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::common;
use crate::error::{Error, Result};
use crate::exec::Logits;
use crate::sample::Sampler;
use crate::tokenizer::{render_chat_prompt, ChatMessage, ChatOptions};

#[derive(Args)]
pub struct RunArgs {
    /// GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// Prompt text. May start with '-' (`-p "-x"`).
    #[arg(short, long, allow_hyphen_values = true)]
    prompt: String,
    /// Maximum number of tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    n_predict: usize,
    #[command(flatten)]
    sampling: common::SamplingArgs,
    /// Wrap the prompt in the model's chat template (a user turn, then the assistant's turn).
    #[arg(long)]
    chat: bool,
    /// System message for --chat. May start with '-'.
    #[arg(long, allow_hyphen_values = true)]
    system: Option<String>,
    /// With --chat: disable the thinking block (the model answers directly).
    #[arg(long)]
    no_think: bool,
    /// Print special tokens (e.g. <|im_end|>) instead of hiding them.
    #[arg(long)]
    show_special: bool,
    /// Context size in tokens (default: prompt + n, at least the model's context up to 8192).
    #[arg(long)]
    ctx: Option<usize>,
    #[command(flatten)]
    device: common::BackendArgs,
}

pub fn run(a: RunArgs) -> Result<()> {
    let mut sampler = Sampler::new(a.sampling.config()?)?;
    let loaded = common::load(&a.model, &a.device)?;
    let (model, tok) = (&loaded.model, &loaded.tokenizer);

    let prompt = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::new("system", s.as_str()));
        }
        msgs.push(ChatMessage::new("user", a.prompt.as_str()));
        let opts = ChatOptions {
            add_generation_prompt: true,
            enable_thinking: !a.no_think,
        };
        // Only the template's markers are special: `<|im_start|>` typed in the prompt stays text.
        tok.encode_chat(&render_chat_prompt(&msgs, &[], opts)?).tokens
    } else {
        tok.encode(&a.prompt, false)
    };
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt encodes to no tokens".into()));
    }
    // Checked: `-n 18446744073709551614` used to wrap this sum in release builds.
    let needed = prompt.len().checked_add(a.n_predict).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "-n {} plus the prompt's {} tokens is more than any context can hold",
            a.n_predict,
            prompt.len()
        ))
    })?;
    let n_ctx = a.ctx.unwrap_or_else(|| common::default_ctx(model, needed));
    common::check_ctx(n_ctx, || match a.ctx {
        Some(c) => format!("--ctx {c}"),
        None => format!("-n {} with a prompt of {} tokens", a.n_predict, prompt.len()),
    })?;
    if needed > n_ctx {
        return Err(Error::ContextOverflow {
            prompt: prompt.len(),
            generate: a.n_predict,
            ctx: n_ctx,
        });
    }
    let mut session = model.new_session(n_ctx)?;
    for &t in &prompt {
        sampler.accept(t);
    }

    let t0 = Instant::now();
    let bar = common::token_bar(prompt.len() as u64, "prompt");
    let mut next = if sampler.is_greedy() {
        model.prefill_greedy(&mut session, &prompt, &mut |d, _| bar.set_position(d as u64))?
    } else {
        let logits = model.prefill(&mut session, &prompt, Logits::Last, &mut |d, _| {
            bar.set_position(d as u64)
        })?;
        sampler.sample(&logits)?
    };
    bar.finish_and_clear();
    let t_prompt = t0.elapsed().as_secs_f64();

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut dec = tok.stream_decoder(a.show_special);
    let t1 = Instant::now();
    let mut generated = 0usize;
    // Shows one generated token; whether to generate another.
    let mut emit = |t: u32| -> Result<bool> {
        generated += 1;
        if tok.is_eog(t) {
            if a.show_special {
                let piece = dec.push(t);
                write_out(&mut out, &piece)?;
            }
            return Ok(false);
        }
        let piece = dec.push(t);
        // A closed pipe (the reader went away) stops generating.
        Ok(write_out(&mut out, &piece)? && generated < a.n_predict)
    };
    if a.n_predict > 0 && emit(next)? {
        if sampler.is_greedy() {
            // The host one step ahead of the device (`Model::generate_greedy`).
            model.generate_greedy(&mut session, next, a.n_predict - 1, &mut |t| {
                sampler.accept(t);
                emit(t)
            })?;
        } else {
            loop {
                let logits = model.decode(&mut session, next)?;
                next = sampler.sample(&logits)?;
                if !emit(next)? {
                    break;
                }
            }
        }
    }
    let tail = dec.finish();
    write_out(&mut out, &tail)?;
    write_out(&mut out, "\n")?;
    let t_gen = t1.elapsed().as_secs_f64();
    eprintln!(
        "prompt: {} tokens in {:.3} s ({:.1} tokens/s) | generation: {} tokens in {:.3} s ({:.1} tokens/s) | backend {}",
        prompt.len(),
        t_prompt,
        prompt.len() as f64 / t_prompt.max(1e-9),
        generated,
        t_gen,
        generated.saturating_sub(1) as f64 / t_gen.max(1e-9),
        common::backend_label(model.backend().as_ref())
    );
    Ok(())
}

/// Write and flush a piece of generated text. `Ok(false)` when stdout is a closed pipe.
fn write_out(out: &mut impl Write, text: &str) -> Result<bool> {
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Error::IoPlain(e)),
    }
}
