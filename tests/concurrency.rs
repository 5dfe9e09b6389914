//! A loaded `Model` is shared by threads (a server runs many sessions on one model): sessions
//! stepped concurrently must give exactly the logits they give when stepped one after another.
//! Before the executor held its scratch for a whole step, two threads got each other's
//! activations (wrong logits in 430 of 4,000 steps) or a "scratch missing" error.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::run_session;
use rill::backend;
use rill::exec::Model;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

#[test]
fn sessions_on_threads_match_sequential_runs_bit_for_bit() {
    for name in ["tiny-dense.F16.gguf", "tiny-moe.F16.gguf"] {
        let be = backend::create("cpu").expect("cpu backend");
        let m = Arc::new(Model::open(Path::new(FIX).join(name), be).expect("model"));
        let (threads, steps) = (6, 40);
        let want: Vec<_> = (0..threads).map(|w| run_session(&m, w, steps)).collect();
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || run_session(&m, w, steps))
            })
            .collect();
        for (w, h) in handles.into_iter().enumerate() {
            let got = h.join().expect("thread");
            assert_eq!(got.len(), want[w].len());
            for (k, (g, x)) in got.iter().zip(&want[w]).enumerate() {
                assert!(g == x, "{name}: session {w} step {k} differs from its sequential run");
            }
        }
    }
}

/// Greedy generation with the host one step ahead (`Model::generate_greedy`) feeds each step the
/// last one's token on the device, between steps that release the executor: another thread's steps
/// in between must not change what a generation is fed.
/// Session `w`'s prompt, then 24 greedy tokens.
fn generate(m: &Model, w: u32) -> Vec<u32> {
    let prompt: Vec<u32> = (0..5).map(|i| (w * 997 + i * 131 + 7) % 8000).collect();
    let mut s = m.new_session(64).expect("session");
    let first = m.prefill_greedy(&mut s, &prompt, &mut |_, _| {}).expect("prefill");
    m.generate_greedy(&mut s, first, 24, &mut |_| Ok(true))
        .expect("generate")
}

#[test]
fn greedy_generations_on_threads_match_sequential_runs() {
    for name in ["tiny-dense.F16.gguf", "tiny-moe.F16.gguf"] {
        let be = backend::create("cpu").expect("cpu backend");
        let m = Arc::new(Model::open(Path::new(FIX).join(name), be).expect("model"));
        let threads = 6u32;
        let want: Vec<_> = (0..threads).map(|w| generate(&m, w)).collect();
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || generate(&m, w))
            })
            .collect();
        for (w, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().expect("thread"), want[w], "{name}: generation {w}");
        }
    }
}
