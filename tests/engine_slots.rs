//! The engine side of `rill serve`'s continuous batching, on the CPU (where a batched row is
//! bit-identical to its sequence alone): prompts that run a chunk at a time through the engine's
//! live session, taking turns (each parked into its pool slot while another runs), then decode
//! together with `decode_rows_greedy`, produce the greedy tokens `Engine::generate` produces for
//! each alone, and leave the same snapshots in the prefix cache.

mod common;

use rill::cache::{Engine, Flow, PromptStart};
use rill::exec::Model;
use rill::sample::{Sampler, SamplerConfig};

const CTX: usize = 256;
const UBATCH: usize = 16;
const NEW: usize = 6;

fn engine() -> Engine {
    let mut m = Model::open(common::fixture("tiny-dense.F16.gguf"), common::cpu()).expect("model");
    // Small chunks: every prompt but the shortest takes several turns.
    m.options.ubatch = UBATCH;
    Engine::new(m, CTX, 256 << 20, 0).expect("engine")
}

fn prompt(which: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 37 + which * 101 + 11) % 8000) as u32).collect()
}

/// One prompt's way through the batch.
struct Seq {
    prompt: Vec<u32>,
    snap_at: Vec<usize>,
    slot: usize,
    plan: Option<PromptStart>,
    /// Tokens its state has consumed.
    tokens: Vec<u32>,
    in_live: bool,
    feed: Option<u32>,
    out: Vec<u32>,
}

#[test]
fn interleaved_chunked_prompts_decode_like_generate_alone() {
    let prompts = [prompt(0, 70), prompt(1, 5), prompt(2, 41)];
    let snap_at = |p: &[u32]| vec![p.len() / 2, p.len() - 1];
    let mut want = Vec::new();
    let mut want_cache = Vec::new();
    for p in &prompts {
        let mut e = engine();
        let mut s = Sampler::new(SamplerConfig::greedy()).expect("sampler");
        let out = e
            .generate(p, &snap_at(p), NEW, &mut s, &|_| false, &mut |_| Ok(Flow::Continue))
            .expect("generate");
        want.push(out.generated);
        want_cache.push(e.stats().cache.inserted);
    }

    let mut e = engine();
    let mut pool = e.model().new_pool(3, CTX).expect("pool");
    let mut seqs: Vec<Seq> = prompts
        .iter()
        .enumerate()
        .map(|(slot, p)| Seq {
            prompt: p.clone(),
            snap_at: snap_at(p),
            slot,
            plan: None,
            tokens: Vec::new(),
            in_live: false,
            feed: None,
            out: Vec::new(),
        })
        .collect();
    let mut turn = 0;
    let mut chunks = 0;
    while seqs.iter().any(|s| s.feed.is_none()) {
        // Round robin over the prompts still running, one chunk each.
        let i = (turn..turn + 3)
            .map(|k| k % 3)
            .find(|&k| seqs[k].feed.is_none())
            .expect("one left");
        turn = i + 1;
        chunks += 1;
        if !seqs[i].in_live {
            for o in seqs.iter_mut().filter(|o| o.in_live) {
                e.park(&mut pool, o.slot).expect("park");
                o.in_live = false;
            }
            let s = &seqs[i];
            if s.plan.is_some() {
                e.unpark(&pool, s.slot, &s.tokens).expect("unpark");
            }
            seqs[i].in_live = true;
        }
        let s = &mut seqs[i];
        if s.plan.is_none() {
            s.plan = Some(e.begin_prompt(&s.prompt, &s.snap_at).expect("begin"));
            s.tokens = e.live_tokens().to_vec();
        }
        let points = s.plan.as_ref().map(|p| p.points.clone()).unwrap_or_default();
        let target = s.prompt.len() - 1;
        let done = s.tokens.len();
        let end = (done + UBATCH)
            .min(target)
            .min(points.iter().copied().find(|&p| p > done).unwrap_or(usize::MAX));
        if end > done {
            e.advance(&s.prompt[done..end]).expect("advance");
            s.tokens.extend_from_slice(&s.prompt[done..end]);
            if points.contains(&end) {
                e.store_snapshot().expect("snapshot");
            }
        }
        if end == target {
            e.park(&mut pool, s.slot).expect("park");
            s.in_live = false;
            s.feed = Some(s.prompt[target]);
        }
    }
    assert!(chunks > 8, "the prompts took turns ({chunks} chunks)");
    for _ in 0..NEW {
        let feed: Vec<(usize, u32)> = seqs.iter().map(|s| (s.slot, s.feed.expect("decoding"))).collect();
        let ids = e.model().decode_rows_greedy(&mut pool, &feed).expect("step");
        for (s, id) in seqs.iter_mut().zip(ids) {
            let t = id.expect("finite logits");
            s.out.push(t);
            s.feed = Some(t);
        }
    }
    for (k, s) in seqs.iter().enumerate() {
        assert_eq!(s.out, want[k], "prompt {k}: batched tokens differ from generate alone");
    }
    assert_eq!(e.stats().cache.inserted, want_cache.iter().sum::<u64>());
    // A slot's sequence comes back out whole: it continues in the live session like alone.
    let s = &seqs[0];
    let mut ran = s.prompt.clone();
    ran.extend_from_slice(&s.out[..NEW - 1]);
    e.unpark(&pool, s.slot, &ran).expect("unpark the decoded sequence");
    assert_eq!(e.live_tokens(), &ran[..]);
    assert!(
        e.unpark(&pool, s.slot, &ran[1..]).is_err(),
        "a token count that is not the slot's is refused"
    );
}
