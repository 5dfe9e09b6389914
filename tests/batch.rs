//! Steps of many sequences (`Model::decode_rows`): every sequence of a batch produces what it
//! produces alone, with sequences joining and leaving mid-run, slots reused, a sequence leaving
//! the pool to go on alone, and one entering from a snapshot. On the CPU a row meets the same
//! arithmetic as alone and its logits are equal bit for bit; a device's batched products run
//! other kernels than its one-token ones, so there each row is held to its tier's bound with the
//! same greedy tokens.

mod common;

use std::sync::Arc;

use common::{fixture, rel_l2};
use rill::backend::{Backend, Precision};
use rill::exec::{Logits, Model, Session};

/// Relative L2 bound of a batched row's logits against the same step alone: the exact tier's
/// products differ only in summation order; the fast tier rounds activations to f16.
fn bound(be: &dyn Backend) -> f64 {
    match be.precision() {
        Precision::Exact => 1e-4,
        Precision::Fast => common::FAST_REL_L2,
    }
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// A prompt per sequence, of different lengths and tokens.
fn prompt(which: usize) -> Vec<u32> {
    (0..2 + 3 * which % 7)
        .map(|i| ((37 * which + 11 * i) % 400 + 3) as u32)
        .collect()
}

/// Sequence `which` alone: its prompt, then `n` greedy tokens; the logits of each decode step.
fn alone(m: &Model, which: usize, n: usize) -> (u32, Vec<Vec<f32>>) {
    let p = prompt(which);
    let mut s = m.new_session(64).expect("session");
    let last = m.prefill(&mut s, &p, Logits::Last, &mut |_, _| {}).expect("prefill");
    let first = argmax(&last);
    let (mut tok, mut steps) = (first, Vec::new());
    for _ in 0..n {
        let l = m.decode(&mut s, tok).expect("decode");
        tok = argmax(&l);
        steps.push(l);
    }
    (first, steps)
}

/// One sequence in the batched run.
struct Running {
    which: usize,
    slot: usize,
    next: u32,
    step: usize,
}

fn compare(be: &dyn Backend, what: &str, got: &[f32], want: &[f32]) {
    if be.name() == "cpu" {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(got) == bits(want),
            "{what}: not bit-identical to the sequence alone"
        );
    } else {
        let e = rel_l2(got, want);
        assert!(e <= bound(be), "{what}: rel L2 {e:.2e} > {:.0e}", bound(be));
        assert_eq!(argmax(got), argmax(want), "{what}: greedy token differs");
    }
}

/// Five sequences through a pool of three slots: each joins at `JOIN[i]`, decodes `LEN[i]`
/// tokens and leaves, its slot taken by the next that waits.
fn joins_and_leaves(be: Arc<dyn Backend>, model: &str) {
    const JOIN: [usize; 5] = [0, 0, 1, 3, 4];
    const LEN: [usize; 5] = [7, 3, 5, 4, 6];
    let tag = format!("{model} on {}", common::tagged(be.as_ref()));
    let m = Model::open(fixture(model), be.clone()).expect("model");
    let want: Vec<_> = (0..5).map(|i| alone(&m, i, LEN[i])).collect();
    let mut pool = m.new_pool(3, 64).expect("pool");
    let mut free: Vec<usize> = vec![2, 1, 0];
    let mut running: Vec<Running> = Vec::new();
    let (mut waiting, mut done) = ((0..5).collect::<Vec<_>>(), 0);
    let mut step = 0;
    while done < 5 {
        // Sequences whose turn has come take a free slot after their prompt ran alone.
        while let Some(&i) = waiting.first() {
            if JOIN[i] > step || free.is_empty() {
                break;
            }
            waiting.remove(0);
            let slot = free.pop().expect("a free slot");
            let mut s = m.new_session(64).expect("session");
            let last = m
                .prefill(&mut s, &prompt(i), Logits::Last, &mut |_, _| {})
                .expect("prefill");
            assert_eq!(argmax(&last), want[i].0, "{tag}: prompt {i}");
            if i == 3 {
                // This one enters from a snapshot, as a prefix-cache hit does.
                let snap = s.snapshot(m.backend().as_ref()).expect("snapshot");
                m.decode(&mut s, 1).expect("the original moves on");
                m.pool_load(&mut pool, slot, &snap).expect("load a snapshot");
            } else {
                m.pool_load(&mut pool, slot, &s).expect("load");
            }
            running.push(Running {
                which: i,
                slot,
                next: want[i].0,
                step: 0,
            });
        }
        let feed: Vec<(usize, u32)> = running.iter().map(|r| (r.slot, r.next)).collect();
        let logits = m.decode_rows(&mut pool, &feed).expect("batched step");
        let vocab = logits.len() / feed.len();
        for (r, l) in running.iter_mut().zip(logits.chunks_exact(vocab)) {
            let what = format!("{tag}: sequence {} step {} (batch of {})", r.which, r.step, feed.len());
            compare(be.as_ref(), &what, l, &want[r.which].1[r.step]);
            r.next = argmax(l);
            r.step += 1;
        }
        running.retain(|r| {
            let leaving = r.step == LEN[r.which];
            if leaving {
                free.push(r.slot);
                done += 1;
            }
            !leaving
        });
        step += 1;
        assert!(step < 40, "{tag}: the schedule does not finish");
    }
}

#[test]
fn a_batch_row_equals_its_sequence_alone() {
    for be in common::backends_every_tier() {
        for model in ["tiny-dense.Q4_K_M.gguf", "tiny-moe.F16.gguf"] {
            joins_and_leaves(be.clone(), model);
        }
    }
}

/// Greedy rows on the device equal the argmax of the logits rows, and a sequence that leaves
/// the pool into a session goes on alone exactly where it stood.
#[test]
fn greedy_rows_and_leaving_the_pool() {
    for be in common::backends_every_tier() {
        let tag = common::tagged(be.as_ref());
        let m = Model::open(fixture("tiny-dense.Q8_0.gguf"), be.clone()).expect("model");
        let (first, want) = alone(&m, 2, 6);
        let mut pool = m.new_pool(4, 64).expect("pool");
        let mut s = m.new_session(64).expect("session");
        m.prefill(&mut s, &prompt(2), Logits::Last, &mut |_, _| {})
            .expect("prefill");
        // Another sequence shares each step, in the slot below.
        let mut other = m.new_session(64).expect("session");
        m.prefill(&mut other, &prompt(4), Logits::Last, &mut |_, _| {})
            .expect("prefill");
        m.pool_load(&mut pool, 3, &s).expect("load");
        m.pool_load(&mut pool, 1, &other).expect("load");
        let mut tok = first;
        for (k, w) in want.iter().enumerate().take(3) {
            let got = m
                .decode_rows_greedy(&mut pool, &[(1, 7), (3, tok)])
                .expect("greedy rows");
            assert_eq!(got[1], Some(argmax(w)), "{tag}: greedy row, step {k}");
            tok = argmax(w);
        }
        let mut back: Session = m.new_session(64).expect("session");
        m.pool_store(&pool, 3, &mut back).expect("store");
        assert_eq!(back.pos, s.pos + 3, "{tag}: position after leaving the pool");
        for (k, w) in want.iter().enumerate().skip(3) {
            let l = m.decode(&mut back, tok).expect("decode alone");
            compare(be.as_ref(), &format!("{tag}: alone after the pool, step {k}"), &l, w);
            tok = argmax(w);
        }
    }
}

/// Bad rows get typed errors: a slot outside the pool, one slot twice, a full slot.
#[test]
fn bad_rows_are_refused() {
    let be = common::cpu();
    let m = Model::open(fixture("tiny-dense.Q8_0.gguf"), be).expect("model");
    let mut pool = m.new_pool(2, 4).expect("pool");
    assert!(m.decode_rows(&mut pool, &[(2, 1)]).is_err(), "slot beyond the pool");
    assert!(m.decode_rows(&mut pool, &[(0, 1), (0, 2)]).is_err(), "one slot twice");
    assert!(m.decode_rows(&mut pool, &[]).is_err(), "no rows");
    for _ in 0..4 {
        m.decode_rows(&mut pool, &[(1, 1)]).expect("room");
    }
    assert!(
        matches!(
            m.decode_rows(&mut pool, &[(1, 1)]),
            Err(rill::error::Error::ContextOverflow { .. })
        ),
        "a full slot"
    );
    let long = m.new_session(8).expect("session");
    let mut s = long;
    m.prefill(&mut s, &[1, 2, 3, 4, 5], Logits::None, &mut |_, _| {})
        .expect("prefill");
    assert!(m.pool_load(&mut pool, 0, &s).is_err(), "a session longer than a slot");
    assert!(m.new_pool(0, 4).is_err(), "no slots");
}
