//! A loaded `Model` is shared by threads (a server runs many sessions on one model): sessions
//! stepped concurrently must give exactly the logits they give when stepped one after another.
//! Before the executor held its scratch for a whole step, two threads got each other's
//! activations (wrong logits in 430 of 4,000 steps) or a "scratch missing" error.

use std::path::Path;
use std::sync::Arc;

use rill::backend;
use rill::exec::{Logits, Model};

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Prefill a prompt, then decode `steps` tokens (each fed token chosen from the session's
/// index so sessions differ), returning every logit row bit for bit.
fn run_session(m: &Model, which: usize, steps: usize) -> Vec<Vec<u32>> {
    let prompt: Vec<u32> = (0..3 + which % 4)
        .map(|i| (17 * which + 31 * i) as u32 % 1000 + 1)
        .collect();
    let mut s = m.new_session(prompt.len() + steps + 1).expect("session");
    let mut rows = Vec::new();
    let first = m
        .prefill(&mut s, &prompt, Logits::Last, &mut |_, _| {})
        .expect("prefill");
    rows.push(first.iter().map(|x| x.to_bits()).collect());
    for k in 0..steps {
        let tok = ((which * 7 + k * 13) % 900 + 5) as u32;
        let l = m.decode(&mut s, tok).expect("decode");
        rows.push(l.iter().map(|x| x.to_bits()).collect());
    }
    rows
}

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
