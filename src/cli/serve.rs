//! `rill serve`: the OpenAI-compatible server (see `crate::server`), and the engine flags it
//! shares with `rill chat`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::common;
use crate::cache::Engine;
use crate::error::{Error, Result};
use crate::server::{serve, ServeOptions};

/// Model, device and cache flags of `rill chat` and `rill serve`.
#[derive(Args)]
pub struct EngineArgs {
    /// GGUF model file.
    #[arg(short, long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub device: common::BackendArgs,
    /// Context size in tokens (default: the model's context, at most 8192).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Memory for cached conversation states (prefix cache), e.g. 512M, 4G; a plain number is
    /// MiB; 0 turns reuse off (every request runs its whole prompt).
    #[arg(long, default_value = "2G", value_parser = parse_mem)]
    pub cache_mem: u64,
    /// Also snapshot every N prompt tokens (0 = only at the end of prompts and replies).
    #[arg(long, default_value_t = 0)]
    pub cache_every: usize,
}

/// `512M`, `4G`, `100K`, or a plain number of MiB.
pub fn parse_mem(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("'{s}': unknown unit (use K, M, G or T)")),
            };
            (&s[..i], mult)
        }
        _ => (s, 1 << 20),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("'{s}' is not a size"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("'{s}' is not a size"));
    }
    let bytes = n * mult as f64;
    if bytes >= u64::MAX as f64 {
        return Err(format!("'{s}' is too large"));
    }
    Ok(bytes as u64)
}

impl EngineArgs {
    /// Load the model and build the engine. Returns the tokenizer too.
    pub fn engine(&self) -> Result<(Engine, crate::tokenizer::Tokenizer)> {
        let loaded = common::load(&self.model, &self.device)?;
        let n_ctx = self.ctx.unwrap_or_else(|| common::default_ctx(&loaded.model, 1));
        let engine = Engine::new(loaded.model, n_ctx, self.cache_mem, self.cache_every)?;
        Ok((engine, loaded.tokenizer))
    }
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 endpoints (default: $RILL_API_KEY if set).
    #[arg(long)]
    api_key: Option<String>,
    /// The model id clients send (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_body: usize,
    /// Requests that may wait while one runs; more get 503.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Answer without a thinking block unless a request asks for one
    /// (`chat_template_kwargs: {"enable_thinking": true}`).
    #[arg(long)]
    no_think: bool,
}

fn model_id(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| "model".into())
}

pub fn run(a: ServeArgs) -> Result<()> {
    if a.max_queue == 0 {
        return Err(Error::InvalidArgument("--max-queue must be at least 1".into()));
    }
    let api_key = a
        .api_key
        .clone()
        .or_else(|| std::env::var("RILL_API_KEY").ok())
        .filter(|k| !k.is_empty());
    let (engine, tok) = a.engine.engine()?;
    let stats = engine.stats();
    eprintln!(
        "model {} on {} | context {} tokens | prefix cache {} MiB",
        a.engine.model.display(),
        engine.model().backend().name(),
        stats.n_ctx,
        stats.cache.budget >> 20
    );
    serve(
        engine,
        tok,
        ServeOptions {
            host: a.host,
            port: a.port,
            model_id: a.alias.unwrap_or_else(|| model_id(&a.engine.model)),
            api_key,
            body_limit: a.max_body,
            max_queue: a.max_queue,
            think_default: !a.no_think,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::parse_mem;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_mem("0"), Ok(0));
        assert_eq!(parse_mem("512"), Ok(512 << 20));
        assert_eq!(parse_mem("2G"), Ok(2 << 30));
        assert_eq!(parse_mem("1.5k"), Ok(1536));
        assert!(parse_mem("-1").is_err());
        assert!(parse_mem("5X").is_err());
        assert!(parse_mem("lots").is_err());
        assert!(parse_mem("1e30T").is_err());
    }
}
