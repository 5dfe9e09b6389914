//! `rill bench-serve`: drives a running OpenAI-compatible server (`rill serve`, or any other)
//! at a sweep of concurrencies, the way vLLM's `benchmark_serving` does: each request a random
//! prompt of fixed length as token ids and a fixed number of streamed output tokens; reported
//! per concurrency: output tokens/s of all requests together, time to first token and the
//! inter-token latency at p50 and p99.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::common;
use crate::error::{Error, Result};

#[derive(Args)]
pub struct BenchServeArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// API key, sent as a bearer token.
    #[arg(long)]
    api_key: Option<String>,
    /// Concurrencies to test (comma-separated): requests in flight at once.
    #[arg(short, long, default_value = "1,16,64")]
    concurrency: String,
    /// Requests per concurrency (0: four times the concurrency, at least 8).
    #[arg(short = 'N', long, default_value_t = 0)]
    requests: usize,
    /// Prompt length in tokens (random ids below --vocab).
    #[arg(short, long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Output tokens per request (sent as max_tokens with ignore_eos).
    #[arg(short = 'n', long, default_value_t = 128)]
    max_tokens: usize,
    /// Prompt token ids are drawn below this.
    #[arg(long, default_value_t = 32_000)]
    vocab: u32,
    /// The model name sent (default: the first the server lists at /v1/models).
    #[arg(long)]
    model: Option<String>,
    /// Give up on a request after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// What one streamed request took.
struct Sample {
    /// Seconds from sending to the first token.
    ttft: f64,
    /// Seconds between consecutive token events.
    gaps: Vec<f64>,
    /// Output tokens (the usage report, else one per streamed event).
    tokens: usize,
}

/// One concurrency's figures.
struct Level {
    concurrency: usize,
    requests: usize,
    seconds: f64,
    output_tokens: usize,
    ttft: Vec<f64>,
    itl: Vec<f64>,
}

impl Level {
    fn throughput(&self) -> f64 {
        self.output_tokens as f64 / self.seconds.max(1e-9)
    }
}

/// The `q`-quantile (0..=1) of `v`, nearest rank; 0 for none.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

fn parse_counts(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(Error::InvalidArgument(format!("'{p}' is not a positive count"))),
        })
        .collect()
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// Send one streaming completion and time its tokens.
/// The first model the server lists.
async fn served_model(client: &HttpClient, a: &BenchServeArgs) -> Result<String> {
    let uri = format!("{}/v1/models", a.url.trim_end_matches('/'));
    let mut req = Request::get(&uri);
    if let Some(k) = &a.api_key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|e| Error::InvalidArgument(format!("{uri}: {e}")))?;
    let net = |e: &dyn std::fmt::Display| Error::IoPlain(std::io::Error::other(format!("{uri}: {e}")));
    let resp = client.request(req).await.map_err(|e| net(&e))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| net(&e))?.to_bytes();
    if !status.is_success() {
        return Err(net(&format!("HTTP {status}: {}", String::from_utf8_lossy(&body))));
    }
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| net(&e))?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| net(&"no model listed"))
}

async fn one_request(client: &HttpClient, a: &BenchServeArgs, model: &str, seed: u64) -> Result<Sample> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let prompt: Vec<u32> = (0..a.prompt_tokens)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % u64::from(a.vocab.max(1))) as u32
        })
        .collect();
    let body = serde_json::json!({
        "model": model, "prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
    });
    let uri = format!("{}/v1/completions", a.url.trim_end_matches('/'));
    let mut req = Request::post(&uri).header("content-type", "application/json");
    if let Some(k) = &a.api_key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| Error::InvalidArgument(format!("{uri}: {e}")))?;
    let net = |e: &dyn std::fmt::Display| Error::IoPlain(std::io::Error::other(format!("{uri}: {e}")));
    let t0 = Instant::now();
    let resp = client.request(req).await.map_err(|e| net(&e))?;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        return Err(net(&format!("HTTP {status}: {}", String::from_utf8_lossy(&text))));
    }
    let (mut buf, mut last, mut sample) = (
        Vec::<u8>::new(),
        None::<Instant>,
        Sample {
            ttft: 0.0,
            gaps: Vec::new(),
            tokens: 0,
        },
    );
    let (mut events, mut usage) = (0usize, None::<usize>);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| net(&e))?;
        let Some(data) = frame.data_ref() else { continue };
        buf.extend_from_slice(data);
        // Server-sent events end with a blank line.
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for line in text.lines() {
                let Some(json) = line.strip_prefix("data:").map(str::trim) else {
                    continue;
                };
                if json == "[DONE]" {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(json).map_err(|e| net(&e))?;
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    usage = Some(n as usize);
                }
                let has_text = v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty());
                if has_text {
                    let now = Instant::now();
                    match last {
                        None => sample.ttft = (now - t0).as_secs_f64(),
                        Some(prev) => sample.gaps.push((now - prev).as_secs_f64()),
                    }
                    last = Some(now);
                    events += 1;
                }
            }
        }
    }
    if last.is_none() {
        return Err(net(&"the stream ended without a token"));
    }
    sample.tokens = usage.unwrap_or(events);
    Ok(sample)
}

/// `requests` requests, at most `concurrency` in flight.
async fn level(
    client: &HttpClient,
    a: &Arc<BenchServeArgs>,
    model: &Arc<str>,
    concurrency: usize,
    requests: usize,
) -> Result<Level> {
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.min(requests) {
        let (client, a, next, model) = (client.clone(), Arc::clone(a), Arc::clone(&next), Arc::clone(model));
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return Ok::<_, Error>(out);
                }
                let limit = Duration::from_secs(a.timeout);
                let s = tokio::time::timeout(
                    limit,
                    one_request(&client, &a, &model, (concurrency * 1_000_003 + i) as u64),
                )
                .await
                .map_err(|_| Error::InvalidArgument(format!("a request took more than {} s", a.timeout)))??;
                out.push(s);
            }
        }));
    }
    let mut samples = Vec::new();
    for w in workers {
        let got = w
            .await
            .map_err(|e| Error::Backend(format!("benchmark worker: {e}")))??;
        samples.extend(got);
    }
    let seconds = t0.elapsed().as_secs_f64();
    Ok(Level {
        concurrency,
        requests,
        seconds,
        output_tokens: samples.iter().map(|s| s.tokens).sum(),
        ttft: samples.iter().map(|s| s.ttft).collect(),
        itl: samples.iter().flat_map(|s| s.gaps.iter().copied()).collect(),
    })
}

pub fn run(a: BenchServeArgs) -> Result<()> {
    let levels = parse_counts(&a.concurrency)?;
    if levels.is_empty() || a.prompt_tokens == 0 || a.max_tokens == 0 {
        return Err(Error::InvalidArgument(
            "need at least one concurrency, one prompt token and one output token".into(),
        ));
    }
    let a = Arc::new(a);
    let rt = tokio::runtime::Runtime::new()?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let model: Arc<str> = match &a.model {
        Some(m) => m.as_str().into(),
        None => rt.block_on(served_model(&client, &a))?.into(),
    };
    let mut results = Vec::new();
    for &c in &levels {
        let n = if a.requests > 0 { a.requests } else { (4 * c).max(8) };
        let l = rt.block_on(level(&client, &a, &model, c, n))?;
        eprintln!(
            "concurrency {c}: {n} requests in {:.1} s, {:.1} output tokens/s",
            l.seconds,
            l.throughput()
        );
        results.push(l);
    }
    let ms = |s: f64| s * 1e3;
    let mut o = String::new();
    if a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|l| {
                serde_json::json!({
                    "concurrency": l.concurrency, "requests": l.requests, "seconds": l.seconds,
                    "output_tokens": l.output_tokens, "output_tokens_per_s": l.throughput(),
                    "ttft_ms_p50": ms(quantile(&l.ttft, 0.5)), "ttft_ms_p99": ms(quantile(&l.ttft, 0.99)),
                    "itl_ms_p50": ms(quantile(&l.itl, 0.5)), "itl_ms_p99": ms(quantile(&l.itl, 0.99)),
                })
            })
            .collect();
        let v = serde_json::json!({
            "url": a.url, "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens, "levels": rows,
        });
        writeln!(o, "{v:#}")?;
        return common::emit(&o);
    }
    writeln!(
        o,
        "server: {} | prompt {} tokens | output {} tokens",
        a.url, a.prompt_tokens, a.max_tokens
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "| concurrency | requests | output t/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |"
    )?;
    writeln!(o, "|---|---|---|---|---|---|---|")?;
    for l in &results {
        writeln!(
            o,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            l.concurrency,
            l.requests,
            l.throughput(),
            ms(quantile(&l.ttft, 0.5)),
            ms(quantile(&l.ttft, 0.99)),
            ms(quantile(&l.itl, 0.5)),
            ms(quantile(&l.itl, 0.99))
        )?;
    }
    common::emit(&o)
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
