//! Snapshots, the prefix cache and the engine that resumes from it (issue: chat and a server that
//! never re-read the conversation). On every compiled backend: a restored snapshot continues
//! bit-identically; the continuation agrees with one fresh prefill of the whole text within the
//! strict tier (fixtures README: max abs <= 1e-3, rel L2 <= 1e-4); later chat turns run only their
//! new tokens; state files round-trip and refuse other models and damaged files.

mod common;

use std::path::Path;

use rill::backend::{self, Backend};
use rill::cache::{model_fingerprint, read_state, write_state, Engine, Finish, Flow, PrefixCache};
use rill::exec::{Logits, Model, Snapshot};
use rill::gguf::GgufFile;
use rill::sample::{Sampler, SamplerConfig};
use rill::tokenizer::{render_chat_prompt, ChatMessage, ChatOptions, Tokenizer};

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn load(be: &str, file: &str) -> Model {
    Model::open(common::fixture(file), common::shared(be)).expect("model loads")
}

/// The names of the backends to test: cpu and every device backend of the build.
fn backend_names() -> Vec<&'static str> {
    common::backends().iter().map(|b| b.name()).collect()
}

fn tokenizer(file: &str) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(Path::new(FIX).join(file)).expect("gguf")).expect("tokenizer")
}

/// Two prompts from the tiny vocabulary (ids < 8166 are ordinary tokens).
fn prompts() -> (Vec<u32>, Vec<u32>) {
    let a: Vec<u32> = (0..70).map(|i| (i * 37 + 11) % 8000).collect();
    let b: Vec<u32> = (0..23).map(|i| (i * 53 + 5) % 8000).collect();
    (a, b)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Continue after prompt `a` with `b` (all logits) and three greedy decode steps.
fn continue_with(m: &Model, s: &mut rill::exec::Session, b: &[u32]) -> Vec<f32> {
    let mut out = m.prefill(s, b, Logits::All, &mut |_, _| {}).expect("prefill b");
    let mut next = 17u32;
    for _ in 0..3 {
        let l = m.decode(s, next).expect("decode");
        next = (l
            .iter()
            .enumerate()
            .fold(0, |best, (i, &x)| if x > l[best] { i } else { best })) as u32;
        out.extend_from_slice(&l);
    }
    out
}

#[test]
fn restored_snapshot_continues_bit_identically_on_every_backend() {
    for be in backend_names() {
        for file in ["tiny-dense.F16.gguf", "tiny-moe.F16.gguf"] {
            let m = load(be, file);
            let (a, b) = prompts();
            let mut s = m.new_session(128).expect("session");
            m.prefill(&mut s, &a, Logits::None, &mut |_, _| {}).expect("prefill a");
            let snap = s.snapshot_compact(m.backend().as_ref()).expect("snapshot");
            // Compact: only the rows in use, not the whole context.
            let cfg = &m.config;
            let n_attn = cfg.is_linear.iter().filter(|&&l| !l).count();
            let kv = (n_attn * 2 * a.len() * cfg.attn.n_head_kv * cfg.attn.head_dim * 4) as u64;
            let g = cfg.gdn;
            let n_gdn = cfg.is_linear.len() - n_attn;
            let rec = (n_gdn * ((cfg.conv_kernel - 1) * g.conv_dim() + g.hv * g.dv * g.dk) * 4) as u64;
            assert_eq!(snap.bytes(), kv + rec, "{be} {file}: snapshot size");
            assert_eq!(snap.pos, a.len());

            let want = continue_with(&m, &mut s, &b);

            // The same session, moved on, then restored (how the server reuses its one session).
            m.prefill(&mut s, &[1, 2, 3], Logits::None, &mut |_, _| {})
                .expect("more");
            s.restore_from(m.backend().as_ref(), &snap).expect("restore");
            assert_eq!(s.pos, a.len());
            let again = continue_with(&m, &mut s, &b);
            assert_eq!(bits(&again), bits(&want), "{be} {file}: restore into the same session");

            // Another session with unrelated history.
            let mut other = m.new_session(128).expect("session");
            m.prefill(&mut other, &b, Logits::None, &mut |_, _| {})
                .expect("other history");
            other.restore_from(m.backend().as_ref(), &snap).expect("restore");
            let got = continue_with(&m, &mut other, &b);
            assert_eq!(bits(&got), bits(&want), "{be} {file}: restore into another session");

            // One fresh prefill of the whole text agrees within the strict tier.
            let mut fresh = m.new_session(128).expect("session");
            let whole: Vec<u32> = a.iter().chain(&b).copied().collect();
            let all = m
                .prefill(&mut fresh, &whole, Logits::All, &mut |_, _| {})
                .expect("prefill");
            let v = cfg.n_vocab;
            for (i, row) in all[a.len() * v..].chunks(v).enumerate() {
                let got_row = &got[i * v..(i + 1) * v];
                let max_abs = row.iter().zip(got_row).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                let num: f64 = row.iter().zip(got_row).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
                let den: f64 = row.iter().map(|x| (*x as f64).powi(2)).sum();
                let rel = (num / den).sqrt();
                assert!(
                    max_abs <= 1e-3 && rel <= 1e-4,
                    "{be} {file} pos {i}: max abs {max_abs}, rel L2 {rel}"
                );
            }
        }
    }
}

#[test]
fn restore_refuses_snapshots_that_do_not_fit() {
    let m = load("cpu", "tiny-dense.F16.gguf");
    let mut s = m.new_session(64).expect("session");
    m.prefill(&mut s, &[5; 40], Logits::None, &mut |_, _| {})
        .expect("prefill");
    let snap = s.snapshot_compact(m.backend().as_ref()).expect("snapshot");
    let mut small = m.new_session(16).expect("session");
    let err = small.restore_from(m.backend().as_ref(), &snap).unwrap_err();
    assert!(matches!(err, rill::Error::ContextOverflow { .. }), "{err}");
    // A snapshot of another layer layout is refused too.
    let empty = Snapshot::from_parts(Vec::new(), 0);
    let err = small.restore_from(m.backend().as_ref(), &empty).unwrap_err();
    assert!(err.to_string().contains("layer count"), "{err}");
}

/// Small device snapshots of a given size, for cache bookkeeping.
fn dummy_snapshot(be: &dyn Backend, floats: usize, pos: usize) -> Snapshot {
    let t = be.alloc(backend::DType::F32, &[floats]).expect("alloc");
    Snapshot::from_parts(
        vec![rill::exec::SnapshotLayer::Gdn {
            conv: t.clone(),
            delta: be.alloc(backend::DType::F32, &[1]).expect("alloc"),
        }],
        pos,
    )
}

#[test]
fn prefix_cache_finds_the_longest_prefix_and_evicts_least_recently_used() {
    let be = backend::create("cpu").expect("cpu");
    let be = be.as_ref();
    // Each snapshot: 99 + 1 floats = 400 bytes; room for two.
    let mut c = PrefixCache::new(800);
    assert!(c.insert(vec![1, 2], dummy_snapshot(be, 99, 2)));
    assert!(c.insert(vec![1, 2, 3, 4], dummy_snapshot(be, 99, 4)));
    assert_eq!(c.stats().bytes, 800);
    assert_eq!(c.lookup(&[1, 2, 3, 4, 5], 0).map(|h| h.len), Some(4));
    assert_eq!(c.lookup(&[1, 2, 3], 0).map(|h| h.len), Some(2));
    // A proper prefix only: the caller needs at least one token to run.
    assert_eq!(c.lookup(&[1, 2], 0).map(|h| h.len), None);
    // Not longer than what the live session already has.
    assert_eq!(c.lookup(&[1, 2, 3], 2).map(|h| h.len), None);
    assert!(c.lookup(&[9, 1, 2], 0).is_none());
    // [1,2] was used last: inserting a third evicts [1,2,3,4].
    assert!(c.insert(vec![7], dummy_snapshot(be, 99, 1)));
    let st = c.stats();
    assert_eq!((st.entries, st.bytes, st.evicted), (2, 800, 1));
    assert_eq!(c.lookup(&[1, 2, 3, 4, 5], 0).map(|h| h.len), Some(2));
    // Larger than the whole budget: not stored; a duplicate is not stored twice.
    assert!(!c.insert(vec![8], dummy_snapshot(be, 300, 1)));
    assert!(!c.insert(vec![7], dummy_snapshot(be, 99, 1)));
    c.record(0);
    c.record(5);
    let st = c.stats();
    assert_eq!((st.hits, st.misses, st.tokens_reused), (1, 1, 5));
    // A zero budget stores nothing.
    let mut off = PrefixCache::new(0);
    assert!(!off.enabled());
    assert!(!off.insert(vec![1], dummy_snapshot(be, 1, 1)));
}

/// Run one greedy chat turn without thinking; returns (prompt tokens, cached tokens, generated ids).
fn chat_turn(engine: &mut Engine, tok: &Tokenizer, msgs: &[ChatMessage], n: usize) -> (usize, usize, Vec<u32>) {
    let opts = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: false,
    };
    let enc = tok.encode_chat(&render_chat_prompt(msgs, &[], opts).expect("render"));
    let mut sampler = Sampler::new(SamplerConfig::greedy()).expect("sampler");
    let snap_at: Vec<usize> = enc.reply_start.into_iter().collect();
    let out = engine
        .generate(&enc.tokens, &snap_at, n, &mut sampler, &|t| tok.is_eog(t), &mut |_| {
            Ok(Flow::Continue)
        })
        .expect("generate");
    (out.prompt_tokens, out.cached_tokens, out.generated)
}

#[test]
fn later_chat_turns_run_only_their_new_tokens_and_match_a_cold_run() {
    for be in backend_names() {
        let tok = tokenizer("tiny-dense.F16.gguf");
        let mut warm = Engine::new(load(be, "tiny-dense.F16.gguf"), 512, 64 << 20, 0).expect("engine");
        let mut cold = Engine::new(load(be, "tiny-dense.F16.gguf"), 512, 0, 0).expect("engine");
        let mut msgs = vec![
            ChatMessage::new("system", "You are terse."),
            ChatMessage::new("user", "Hello there, how are you?"),
        ];
        for turn in 0..3 {
            let (p, cached, gen) = chat_turn(&mut warm, &tok, &msgs, 12);
            let (p_cold, cached_cold, gen_cold) = chat_turn(&mut cold, &tok, &msgs, 12);
            assert_eq!((p, cached_cold), (p_cold, 0));
            assert_eq!(
                gen, gen_cold,
                "{be} turn {turn}: the cached continuation must equal a cold run"
            );
            let text = tok.decode(&gen, false);
            let reply = rill::tokenizer::parse_reply(&text, false, &[]);
            let next = tok.encode_follow_up(&msgs, &[], &reply).expect("follow-up");
            if turn > 0 {
                // Only the new user message and the generation prompt were run.
                let user = msgs.last().expect("user");
                let new_part = tok.encode_chat(
                    &render_chat_prompt(
                        std::slice::from_ref(user),
                        &[],
                        ChatOptions {
                            add_generation_prompt: true,
                            enable_thinking: false,
                        },
                    )
                    .expect("render"),
                );
                assert_eq!(
                    p - cached,
                    new_part.tokens.len(),
                    "{be} turn {turn}: prompt {p}, cached {cached}"
                );
            }
            warm.cache_sequence(&next).expect("cache follow-up");
            msgs.push(ChatMessage::new("assistant", reply.content));
            msgs.push(ChatMessage::new("user", format!("Tell me more about item {turn}.")));
        }
        let st = warm.stats().cache;
        assert_eq!((st.hits, st.misses), (2, 1), "{be}: {st:?}");
    }
}

#[test]
fn state_files_round_trip_and_refuse_other_models_and_damage() {
    let be = "cpu";
    let path_model = Path::new(FIX).join("tiny-dense.F16.gguf");
    let fp = model_fingerprint(&GgufFile::open(&path_model).expect("gguf"));
    let fp_moe = model_fingerprint(&GgufFile::open(Path::new(FIX).join("tiny-moe.F16.gguf")).expect("gguf"));
    let fp_q8 = model_fingerprint(&GgufFile::open(Path::new(FIX).join("tiny-dense.Q8_0.gguf")).expect("gguf"));
    assert_ne!(fp, fp_moe);
    assert_ne!(fp, fp_q8);
    let m = load(be, "tiny-dense.F16.gguf");
    let (a, b) = prompts();
    let mut s = m.new_session(128).expect("session");
    m.prefill(&mut s, &a, Logits::None, &mut |_, _| {}).expect("prefill");
    let snap = s.snapshot_compact(m.backend().as_ref()).expect("snapshot");
    let want = continue_with(&m, &mut s, &b);

    let dir = std::env::temp_dir().join(format!("rill-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("chat.state");
    let meta = serde_json::json!({"tokens": a});
    write_state(&file, fp, &meta, &snap, m.backend().as_ref()).expect("write");
    let loaded = read_state(&file, fp, &m.config, 128, m.backend().as_ref()).expect("read");
    assert_eq!(loaded.meta, meta);
    let mut t = m.new_session(128).expect("session");
    t.restore_from(m.backend().as_ref(), &loaded.snap).expect("restore");
    assert_eq!(
        bits(&continue_with(&m, &mut t, &b)),
        bits(&want),
        "loaded state continues bit-identically"
    );

    let err = |e: rill::Error| e.to_string();
    let e = err(read_state(&file, fp_moe, &m.config, 128, m.backend().as_ref())
        .err()
        .expect("other model"));
    assert!(e.contains("another model"), "{e}");
    let e = err(read_state(&file, fp, &m.config, 32, m.backend().as_ref())
        .err()
        .expect("small ctx"));
    assert!(e.contains("do not fit the context"), "{e}");
    let bytes = std::fs::read(&file).expect("read");
    let damaged = dir.join("damaged.state");
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    std::fs::write(&damaged, &flipped).expect("write");
    let e = err(read_state(&damaged, fp, &m.config, 128, m.backend().as_ref())
        .err()
        .expect("damaged"));
    assert!(e.contains("checksum"), "{e}");
    std::fs::write(&damaged, &bytes[..bytes.len() - 100]).expect("write");
    let e = err(read_state(&damaged, fp, &m.config, 128, m.backend().as_ref())
        .err()
        .expect("truncated"));
    assert!(e.contains("truncated or corrupt"), "{e}");
    std::fs::write(&damaged, b"not a state file at all, just text").expect("write");
    let e = err(read_state(&damaged, fp, &m.config, 128, m.backend().as_ref())
        .err()
        .expect("garbage"));
    assert!(e.contains("bad magic"), "{e}");
    let e = err(read_state(&dir, fp, &m.config, 128, m.backend().as_ref())
        .err()
        .expect("a directory"));
    assert!(e.contains("not a regular file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Greedy generation runs the host one step ahead (`Model::generate_greedy`): a generation the
/// callback stops has already fed the token it stopped at. The engine must count that token as
/// consumed, so a follow-up prompt that extends the reply resumes the live session and continues
/// exactly as a cold run does.
#[test]
fn a_stopped_generation_leaves_a_session_that_continues_exactly() {
    for be in backend_names() {
        let (a, b) = prompts();
        let mut warm = Engine::new(load(be, "tiny-dense.F16.gguf"), 512, 64 << 20, 0).expect("engine");
        let mut cold = Engine::new(load(be, "tiny-dense.F16.gguf"), 512, 0, 0).expect("engine");
        let greedy = || Sampler::new(SamplerConfig::greedy()).expect("sampler");
        let mut count = 0;
        let out = warm
            .generate(&a, &[], 10, &mut greedy(), &|_| false, &mut |_| {
                count += 1;
                Ok(if count == 3 { Flow::Stop } else { Flow::Continue })
            })
            .expect("generate");
        assert_eq!(out.generated.len(), 3, "{be}");
        assert_eq!(out.finish, Finish::Stopped, "{be}");
        let mut next = a.clone();
        next.extend(&out.generated);
        next.extend(&b[..8]);
        let go = &mut |_| Ok(Flow::Continue);
        let w = warm
            .generate(&next, &[], 6, &mut greedy(), &|_| false, go)
            .expect("warm");
        let c = cold
            .generate(&next, &[], 6, &mut greedy(), &|_| false, go)
            .expect("cold");
        assert_eq!(
            w.cached_tokens,
            a.len() + 3,
            "{be}: the live session holds the prompt and the reply"
        );
        assert_eq!(c.cached_tokens, 0, "{be}");
        assert_eq!(w.generated, c.generated, "{be}: the continuation must equal a cold run");
    }
}
