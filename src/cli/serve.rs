//! `rill serve`: the OpenAI-compatible server (see `crate::server`), and the engine flags it
//! shares with `rill chat`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::common;
use crate::cache::Engine;
use crate::error::{Error, Result};
use crate::exec::StatePool;
use crate::server::{default_slots, is_exposed, serve, ApiKeys, Limits, Privacy, ServeOptions, DEFAULT_KEY_NAME};

/// Slots without `--parallel`: a small team's concurrent requests at a modest state cost (for a
/// 9B at 8192 tokens about 0.6 GiB a slot), where batching already pays (llama.cpp on an H200:
/// 227 tokens/s for one sequence, 759 for eight).
const DEFAULT_PARALLEL: usize = 8;

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
    /// Require `Authorization: Bearer KEY` (default: $RILL_API_KEY if set). The key is named
    /// `default`; see --api-key-file for one key per user.
    #[arg(long)]
    api_key: Option<String>,
    /// A file of named keys, one `NAME:KEY` per line (`#` comments): each user gets their own key,
    /// request cap and prefix cache. May be combined with --api-key.
    #[arg(long, value_name = "PATH")]
    api_key_file: Option<PathBuf>,
    /// Serve /health and /metrics without a key (e.g. for a load balancer's probes). They show
    /// live context length and cache counters, so by default they need a key like /v1.
    #[arg(long)]
    public_health: bool,
    /// Let every key resume from every other key's cached prompts (faster for a team that shares
    /// long system prompts, but one user can then tell what another has sent).
    #[arg(long)]
    shared_cache: bool,
    /// Leave `usage.prompt_tokens_details.cached_tokens` and `timings` out of responses.
    #[arg(long)]
    hide_cache_stats: bool,
    /// Seconds a client has to send a request's headers; also closes connections that send
    /// nothing (new or between requests).
    #[arg(long, default_value_t = 10.0, value_parser = parse_secs)]
    header_timeout: f64,
    /// Seconds a client has to send a request's body.
    #[arg(long, default_value_t = 30.0, value_parser = parse_secs)]
    body_timeout: f64,
    /// Open connections at most; more are answered 503 and closed (lowered to fit the open-file
    /// limit).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Seconds shutdown (SIGINT/SIGTERM) waits for running requests before it exits; queued ones
    /// are answered 503 at once.
    #[arg(long, default_value_t = 5.0, value_parser = parse_secs)]
    shutdown_timeout: f64,
    /// Requests parsed and tokenized at once (off the network threads).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    prep_threads: u32,
    /// Requests one API key may have queued or running at once; more get 429 (0 = no cap; a
    /// server without keys has no cap).
    #[arg(long, default_value_t = 4)]
    max_requests_per_key: usize,
    /// `max_tokens` of a chat request that names none (0 = the rest of the context).
    #[arg(long, default_value_t = 2048)]
    default_max_tokens: usize,
    /// The model id clients send (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_body: usize,
    /// Requests that may wait while every slot is taken; more get 503.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Requests generated at once, in one batch (slots of the state pool, each holding one
    /// sequence of --ctx tokens, allocated at start). Default: 8, fewer when the device's free
    /// memory (after --cache-mem) holds fewer.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    parallel: Option<u32>,
    /// Memory for the sequences' state (KV rows, conv and delta state), e.g. 20G: without
    /// --parallel, as many slots as it holds at --ctx; with it, a bound the slots must fit.
    #[arg(long, value_parser = parse_mem)]
    kv_mem: Option<u64>,
    /// Answer without a thinking block unless a request asks for one
    /// (`chat_template_kwargs: {"enable_thinking": true}`).
    #[arg(long)]
    no_think: bool,
}

/// Seconds, more than 0 and at most a day.
fn parse_secs(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 86_400.0 => Ok(x),
        _ => Err(format!("'{s}' is not a number of seconds between 0 and 86400")),
    }
}

/// The keys of --api-key, $RILL_API_KEY and --api-key-file. An empty key is an error, not "no key".
fn api_keys(a: &ServeArgs) -> Result<ApiKeys> {
    let mut keys = ApiKeys::default();
    match (&a.api_key, std::env::var("RILL_API_KEY")) {
        (Some(k), _) => keys.add(DEFAULT_KEY_NAME, k, "--api-key")?,
        (None, Ok(k)) => keys.add(DEFAULT_KEY_NAME, &k, "RILL_API_KEY (unset it to run without a key)")?,
        (None, Err(_)) => {}
    }
    if let Some(path) = &a.api_key_file {
        keys.add_file(path)?;
    }
    Ok(keys)
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
    let keys = api_keys(&a)?;
    if keys.is_empty() && is_exposed(&a.host) {
        eprintln!(
            "warning: listening on {} without an API key: anyone who can reach this machine can use the \
             model (set --api-key or --api-key-file)",
            a.host
        );
    }
    let (engine, tok) = a.engine.engine()?;
    let stats = engine.stats();
    let per_slot = StatePool::bytes_needed(&engine.model().config, 1, stats.n_ctx);
    let parallel = slots_for(a.parallel, a.kv_mem, per_slot, stats.n_ctx, || {
        let available = engine.model().backend().memory_available();
        default_slots(DEFAULT_PARALLEL, per_slot, available, stats.cache.budget)
    })?;
    eprintln!(
        "model {} on {} | context {} tokens | prefix cache {} MiB",
        a.engine.model.display(),
        super::common::backend_label(engine.model().backend().as_ref()),
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
            keys,
            body_limit: a.max_body,
            max_queue: a.max_queue,
            parallel,
            think_default: !a.no_think,
            limits: Limits {
                header_timeout: Duration::from_secs_f64(a.header_timeout),
                body_timeout: Duration::from_secs_f64(a.body_timeout),
                max_connections: a.max_connections as usize,
                shutdown_timeout: Duration::from_secs_f64(a.shutdown_timeout),
                prep_threads: a.prep_threads as usize,
                max_per_key: a.max_requests_per_key,
                default_max_tokens: a.default_max_tokens,
            },
            privacy: Privacy {
                shared_cache: a.shared_cache,
                hide_cache_stats: a.hide_cache_stats,
                public_health: a.public_health,
            },
        },
    )
}

/// The pool's slots from `--parallel` and `--kv-mem` (`per_slot` bytes each at `n_ctx` tokens),
/// or `default()` without either.
fn slots_for(
    parallel: Option<u32>,
    kv_mem: Option<u64>,
    per_slot: u64,
    n_ctx: usize,
    default: impl FnOnce() -> usize,
) -> Result<usize> {
    let fit = kv_mem.map(|m| usize::try_from(m / per_slot.max(1)).unwrap_or(usize::MAX));
    match (parallel, fit) {
        (_, Some(0)) => Err(Error::InvalidArgument(format!(
            "--kv-mem holds no sequence of {n_ctx} tokens ({} MiB each): raise it or lower --ctx",
            per_slot.div_ceil(1 << 20)
        ))),
        (Some(n), Some(fit)) if n as usize > fit => Err(Error::InvalidArgument(format!(
            "--parallel {n} needs {} MiB of sequence state ({n_ctx} tokens each); --kv-mem holds {fit} such sequences",
            (per_slot.saturating_mul(u64::from(n))).div_ceil(1 << 20)
        ))),
        (Some(n), _) => Ok(n as usize),
        (None, Some(fit)) => Ok(fit),
        (None, None) => Ok(default()),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_mem, slots_for};

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

    #[test]
    fn kv_mem_sizes_or_bounds_the_slots() {
        let mib = 1u64 << 20;
        let never = || -> usize { panic!("no default when a flag decides") };
        assert_eq!(slots_for(None, Some(100 * mib), 30 * mib, 4096, never).ok(), Some(3));
        assert_eq!(slots_for(Some(2), Some(100 * mib), 30 * mib, 4096, never).ok(), Some(2));
        assert!(slots_for(Some(4), Some(100 * mib), 30 * mib, 4096, never).is_err());
        assert!(slots_for(None, Some(10 * mib), 30 * mib, 4096, never).is_err());
        assert_eq!(slots_for(Some(5), None, 30 * mib, 4096, never).ok(), Some(5));
        assert_eq!(slots_for(None, None, 30 * mib, 4096, || 8).ok(), Some(8));
    }
}
