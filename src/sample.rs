//! Token sampling: a llama.cpp-style chain over one row of logits.
//!
//! Chain: repetition penalty → (temperature 0: argmax) → top-k → softmax with temperature →
//! top-p → min-p → renormalise → draw with a seeded PRNG.
//!
//! Logits that are NaN or `-inf` are treated as "token not allowed" and never chosen; `+inf`
//! logits share all the probability mass between them. The sampler never panics on user data:
//! an empty row, or a row in which no token is allowed, is an `Error::InvalidArgument`.
//!
//! All buffers live in the `Sampler` and are reused, so sampling a 248k-entry row allocates
//! nothing after the first call.

use std::collections::VecDeque;

use crate::error::{Error, Result};

/// Sampling parameters. Each stage has an "off" value that makes it a no-op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 selects greedy decoding (argmax); otherwise logits are divided by it before softmax.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability sums to at least `top_p`;
    /// 1.0 = off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times that of the most likely token;
    /// 0 = off.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this; 1.0 = off.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the repetition penalty looks at; 0 = off.
    pub repeat_last_n: usize,
    /// Seed of the PRNG; the same seed and inputs give the same tokens.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults, with a fixed seed so that runs are reproducible unless the
    /// caller passes its own.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Deterministic argmax decoding with every other stage off.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }

    /// Reject values that would make the chain meaningless (negative temperature, empty
    /// nucleus, NaN anywhere, non-positive penalty).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(what));
        // `!(x >= 0)` rather than `x < 0` so that NaN is rejected too.
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!("temperature {} must be finite and >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p {} must be in (0, 1]", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return bad(format!("min_p {} must be in [0, 1]", self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad(format!("repeat_penalty {} must be finite and > 0", self.repeat_penalty));
        }
        Ok(())
    }

    fn penalty_active(&self) -> bool {
        self.repeat_penalty != 1.0 && self.repeat_last_n > 0
    }
}

/// xoshiro256** seeded through splitmix64: small, fast and statistically sound, and it keeps
/// the crate free of an RNG dependency. Not cryptographic, which sampling does not need.
#[derive(Debug, Clone)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn new(seed: u64) -> Self {
        // splitmix64 spreads any seed (including 0) over the full state, which must not be all
        // zeros.
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Xoshiro256 {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A (token id, value) pair; the value is a logit until softmax, then an unnormalised
/// probability.
type Cand = (u32, f32);

/// Descending by value, ties broken by ascending id, so that every truncation is deterministic
/// and agrees with greedy's "first maximum" rule.
fn by_value_desc(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Stateful sampler: configuration, PRNG, recent-token history and reusable scratch buffers.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Xoshiro256,
    /// The last `repeat_last_n` tokens (prompt and generated), oldest first.
    history: VecDeque<u32>,
    /// Penalised copy of the logits (only used when the penalty is on).
    work: Vec<f32>,
    /// Candidate set for the stochastic path.
    cands: Vec<Cand>,
    /// Distinct tokens of `history`, so each is penalised once however often it occurred.
    distinct: Vec<u32>,
}

impl Sampler {
    /// Build a sampler; fails if the configuration does not validate.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler> {
        cfg.validate()?;
        Ok(Sampler {
            cfg,
            rng: Xoshiro256::new(cfg.seed),
            history: VecDeque::with_capacity(cfg.repeat_last_n.min(4096)),
            work: Vec::new(),
            cands: Vec::new(),
            distinct: Vec::new(),
        })
    }

    /// The configuration this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// True when sampling reduces to a plain argmax of the raw logits (temperature 0 and no
    /// repetition penalty), so the caller may take the argmax on the device instead of
    /// calling `sample`. It should still call `accept` with the chosen token.
    pub fn is_greedy(&self) -> bool {
        self.cfg.temperature == 0.0 && !self.cfg.penalty_active()
    }

    /// Record a token (a prompt token, or one chosen outside `sample`) for the repetition
    /// penalty.
    pub fn accept(&mut self, token: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        while self.history.len() >= self.cfg.repeat_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Forget the recorded tokens (e.g. between independent prompts); the PRNG state is kept.
    pub fn clear_history(&mut self) {
        self.history.clear();
    }

    /// Choose the next token from one row of logits and record it in the history.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::InvalidArgument(
                "cannot sample from an empty logit vector".into(),
            ));
        }
        if u32::try_from(logits.len()).is_err() {
            return Err(Error::InvalidArgument(format!(
                "vocabulary of {} entries does not fit u32 token ids",
                logits.len()
            )));
        }

        let view: &[f32] = if self.cfg.penalty_active() && !self.history.is_empty() {
            apply_penalty(
                logits,
                &self.history,
                self.cfg.repeat_penalty,
                &mut self.work,
                &mut self.distinct,
            );
            &self.work
        } else {
            logits
        };

        let token = if self.cfg.temperature == 0.0 {
            argmax(view)?
        } else {
            sample_stochastic(view, &self.cfg, &mut self.cands, &mut self.rng)?
        };
        self.accept(token);
        Ok(token)
    }
}

/// Copy `logits` into `work` and penalise each distinct token of `history` once, the way
/// llama.cpp does (CTRL-style): shrink positive logits, push negative ones further down.
fn apply_penalty(logits: &[f32], history: &VecDeque<u32>, penalty: f32, work: &mut Vec<f32>, distinct: &mut Vec<u32>) {
    work.clear();
    work.extend_from_slice(logits);
    distinct.clear();
    distinct.extend(history.iter().copied());
    distinct.sort_unstable();
    distinct.dedup();
    for &t in distinct.iter() {
        // Tokens outside this vocabulary (e.g. a caller mixing models) are simply ignored.
        if let Some(l) = work.get_mut(t as usize) {
            if *l > 0.0 {
                *l /= penalty;
            } else {
                *l *= penalty;
            }
        }
    }
}

/// Index of the first maximum, skipping NaN and `-inf` (disallowed tokens).
fn argmax(logits: &[f32]) -> Result<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        // Strict `>` keeps the first of equal maxima.
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    // The caller checked that the length fits u32.
    best.map(|(i, _)| i as u32).ok_or_else(no_allowed_token)
}

fn no_allowed_token() -> Error {
    Error::InvalidArgument("no token has a finite logit (all NaN or -inf)".into())
}

/// top-k → softmax(temperature) → top-p → min-p → draw.
fn sample_stochastic(logits: &[f32], cfg: &SamplerConfig, cands: &mut Vec<Cand>, rng: &mut Xoshiro256) -> Result<u32> {
    cands.clear();
    let mut max = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        max = max.max(l);
        cands.push((i as u32, l));
    }
    if cands.is_empty() {
        return Err(no_allowed_token());
    }
    if max == f32::INFINITY {
        // `inf - inf` would be NaN in the softmax; the limit of the distribution is uniform
        // over the +inf tokens, so keep just those with equal weight.
        cands.retain(|c| c.1 == f32::INFINITY);
        for c in cands.iter_mut() {
            c.1 = 0.0;
        }
        max = 0.0;
    }

    // top-k: an O(n) selection puts the k best first (in no particular order); no sort needed.
    if cfg.top_k > 0 && cfg.top_k < cands.len() {
        cands.select_nth_unstable_by(cfg.top_k - 1, by_value_desc);
        cands.truncate(cfg.top_k);
    }

    // Softmax with temperature. Subtracting the max before dividing keeps every exponent <= 0
    // so nothing overflows even for tiny temperatures; the max itself maps to exactly 1.
    // Divide rather than multiply by 1/T: for a subnormal T, 1/T is inf and `0 * inf` is NaN.
    let t = cfg.temperature;
    let mut sum = 0.0f64;
    for c in cands.iter_mut() {
        let p = ((c.1 - max) / t).exp();
        // Every operand is finite or -inf with `c.1 <= max`, so this is belt and braces.
        let p = if p.is_nan() { 0.0 } else { p };
        c.1 = p;
        sum += p as f64;
    }
    // The maximum has weight exactly 1 and survives top-k, so `sum >= 1`.

    if cfg.top_p < 1.0 {
        let kept = nucleus_len(cands, sum * cfg.top_p as f64);
        cands.truncate(kept);
    }

    if cfg.min_p > 0.0 {
        // The best surviving candidate is the global max (weight 1); compute it rather than
        // rely on order, since without top-p the candidates are unsorted.
        let p_max = cands.iter().fold(0.0f32, |m, c| m.max(c.1));
        let threshold = cfg.min_p * p_max;
        cands.retain(|c| c.1 >= threshold);
    }

    // Renormalise implicitly: draw uniformly in [0, total).
    let total: f64 = cands.iter().map(|c| c.1 as f64).sum();
    let last = cands.last().map(|c| c.0).ok_or_else(no_allowed_token)?;
    if total <= 0.0 || !total.is_finite() {
        return Err(no_allowed_token());
    }
    let r = rng.next_f64() * total;
    let mut acc = 0.0f64;
    for c in cands.iter() {
        acc += c.1 as f64;
        if r < acc {
            return Ok(c.0);
        }
    }
    // Only reachable through rounding in the running sum: the draw was at the very top.
    Ok(last)
}

/// Sort `cands` descending only as far as needed and return the length of the smallest prefix
/// whose weight reaches `target` (at least 1). Sorting is done in growing chunks: each chunk is
/// selected from the unsorted tail, whose elements are all smaller than the sorted prefix, so a
/// peaked distribution over a 248k vocabulary costs a few O(n) selections and a tiny sort.
fn nucleus_len(cands: &mut [Cand], target: f64) -> usize {
    let n = cands.len();
    let mut sorted = 0usize;
    let mut chunk = 64usize;
    let mut acc = 0.0f64;
    while sorted < n {
        let end = (sorted + chunk).min(n);
        let tail = &mut cands[sorted..];
        if end < n {
            tail.select_nth_unstable_by(end - sorted - 1, by_value_desc);
        }
        cands[sorted..end].sort_unstable_by(by_value_desc);
        for (i, c) in cands[sorted..end].iter().enumerate() {
            acc += c.1 as f64;
            if acc >= target {
                return sorted + i + 1;
            }
        }
        sorted = end;
        chunk = chunk.saturating_mul(4);
    }
    // Rounding kept the sum just under the target: keep everything.
    n.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_is_seeded_and_uniform_in_unit_interval() {
        let mut a = Xoshiro256::new(0);
        let mut b = Xoshiro256::new(0);
        for _ in 0..1000 {
            let x = a.next_f64();
            assert_eq!(x, b.next_f64());
            assert!((0.0..1.0).contains(&x));
        }
        assert_ne!(Xoshiro256::new(1).next_u64(), Xoshiro256::new(2).next_u64());
    }

    #[test]
    fn nucleus_len_over_chunk_boundaries() {
        // 1000 equal weights: reaching half the mass needs 500 of them, across several chunks.
        let mut c: Vec<Cand> = (0..1000).map(|i| (i, 1.0)).collect();
        assert_eq!(nucleus_len(&mut c, 500.0), 500);
        // Ties are ordered by id, so the prefix is ids 0..500.
        assert!(c[..500].iter().enumerate().all(|(i, x)| x.0 == i as u32));
        let mut c: Vec<Cand> = (0..1000).map(|i| (i, if i == 777 { 100.0 } else { 0.01 })).collect();
        assert_eq!(nucleus_len(&mut c, 50.0), 1);
        assert_eq!(c[0].0, 777);
    }
}
