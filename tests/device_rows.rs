//! The ops of steps whose rows belong to different sequences (`backend::rows`) on every device
//! backend against the CPU reference (which runs the one-sequence ops row by row), on random
//! inputs: rows in shuffled slots of a larger pool, positions from 0 to thousands, B from 1 to 256
//! (attention at 256 rows on its small shape only: the others' pools would take gigabytes).
//! Slots no row names must come out untouched. Tolerances are those of the one-sequence ops
//! (tests/device_ops.rs, tests/device_delta.rs): state copies bit-exact, sums of n terms ~1e-4.

mod common;

use common::device::{Both, Pt, Side, GDN_ODD, GDN_REAL};
use common::*;
use rill::backend::{AttnDims, Rows, SeqRow, StepMode};

const BS: [usize; 5] = [1, 3, 17, 64, 256];

/// `b` rows in distinct random slots of `n_slots`, positions below `ctx`, and their device
/// tensors on both sides.
fn random_rows(p: &Both, rng: &mut Rng, b: usize, n_slots: usize, ctx: usize) -> (Vec<SeqRow>, Pt) {
    let rows = host_rows(rng, b, n_slots, ctx);
    let dev = p.up_u32(&pairs(&rows), &[b, 2]);
    (rows, dev)
}

/// The `(slot, pos)` pairs of `rows`, as `Rows::dev` holds them.
fn pairs(rows: &[SeqRow]) -> Vec<u32> {
    rows.iter().flat_map(|r| [r.slot, r.pos]).collect()
}

/// `b` rows in distinct random slots of `n_slots`, positions below `ctx`.
fn host_rows(rng: &mut Rng, b: usize, n_slots: usize, ctx: usize) -> Vec<SeqRow> {
    let mut slots: Vec<u32> = (0..n_slots as u32).collect();
    for i in (1..slots.len()).rev() {
        slots.swap(i, rng.below(i + 1));
    }
    (0..b)
        .map(|i| SeqRow {
            slot: slots[i],
            // Position 0, the last one, and random ones between.
            pos: match i {
                0 => 0,
                1 => ctx as u32 - 1,
                _ => rng.below(ctx) as u32,
            },
        })
        .collect()
}

fn rows_on<'a>(host: &'a [SeqRow], dev: &'a Pt, s: Side) -> Rows<'a> {
    Rows { host, dev: dev.on(s) }
}

#[test]
fn conv1d_rows_match() {
    for p in Both::each() {
        let mut rng = Rng::new(71);
        for (c, k) in [(37usize, 4usize), (1024, 4), (9, 7), (5, 2)] {
            let w = p.up(&rng.normals(c * k, 0.5), &[c, k]);
            for b in BS {
                let n_slots = b + 3;
                let (rows, rd) = random_rows(&p, &mut rng, b, n_slots, 1000);
                let states = p.up(&rng.normals(n_slots * (k - 1) * c, 1.0), &[n_slots * (k - 1), c]);
                let x = p.up(&rng.normals(b * c, 1.0), &[b, c]);
                let out = p.zeros(&[b, c]);
                p.run("conv1d_silu_rows", |be, s| {
                    be.conv1d_silu_rows(x.on(s), w.on(s), states.on(s), rows_on(&rows, &rd, s), out.on(s))
                });
                p.check(&format!("conv rows out c={c} k={k} b={b}"), &out, 1e-6, 1e-5);
                p.check(&format!("conv rows states c={c} k={k} b={b}"), &states, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn delta_rule_rows_match() {
    for p in Both::each() {
        let mut rng = Rng::new(72);
        for dims in [GDN_REAL, GDN_ODD] {
            let (cd, hv, per_slot) = (dims.conv_dim(), dims.hv, dims.hv * dims.dv);
            for b in BS {
                let n_slots = b + 2;
                let (rows, rd) = random_rows(&p, &mut rng, b, n_slots, 1000);
                // q and k L2-normalised as the layer leaves them, v and the state O(1).
                let mut u = rng.normals(b * cd, 1.0);
                for row in u.chunks_exact_mut(cd) {
                    let qk = 2 * dims.hk * dims.dk;
                    for head in row[..qk].chunks_exact_mut(dims.dk) {
                        let n = head.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                        head.iter_mut().for_each(|x| *x /= n);
                    }
                }
                let u = p.up(&u, &[b, cd]);
                let g: Vec<f32> = (0..b * hv).map(|_| -(rng.uniform() as f32) * 2.0).collect();
                let beta: Vec<f32> = (0..b * hv).map(|_| rng.uniform() as f32).collect();
                let (g, beta) = (p.up(&g, &[b, hv]), p.up(&beta, &[b, hv]));
                let states = p.up(
                    &rng.normals(n_slots * per_slot * dims.dk, 0.5),
                    &[n_slots * per_slot, dims.dk],
                );
                let out = p.zeros(&[b, per_slot]);
                p.run("delta_rule_rows", |be, s| {
                    be.delta_rule_rows(
                        u.on(s),
                        g.on(s),
                        beta.on(s),
                        states.on(s),
                        out.on(s),
                        dims,
                        rows_on(&rows, &rd, s),
                    )
                });
                // The recurrence is f32 arithmetic on O(1) values: the one-token op's bound.
                p.check(&format!("delta rows out {dims:?} b={b}"), &out, 1e-5, 1e-4);
                p.check(&format!("delta rows states {dims:?} b={b}"), &states, 1e-5, 1e-4);
            }
        }
    }
}

#[test]
fn rope_rows_match() {
    for p in Both::each() {
        let mut rng = Rng::new(73);
        for (nh, d, n_rot) in [(4usize, 256usize, 64usize), (3, 128, 128), (1, 6, 2)] {
            for b in BS {
                let (rows, rd) = random_rows(&p, &mut rng, b, b + 1, 4096);
                let x = rng.normals(b * nh * d, 1.0);
                let xs = p.up(&x, &[b, nh * d]);
                p.run("rope_neox_rows", |be, s| {
                    be.rope_neox_rows(xs.on(s), d, n_rot, 10_000_000.0, rows_on(&rows, &rd, s))
                });
                // The one-position op's error model (tests/device_ops.rs rope_neox_matches): a
                // few ulp of the angle at the row's position times the pair's norm.
                let (got, want) = p.read(&xs);
                let cols = nh * d;
                for (r, row) in rows.iter().enumerate() {
                    for i in 0..cols {
                        let j = r * cols + i;
                        let norm = x[r * cols..(r + 1) * cols].iter().map(|v| v * v).sum::<f32>().sqrt();
                        let tol = 2e-6 * norm + 4.0 * row.pos as f32 * norm / (1u32 << 24) as f32;
                        assert!(
                            (got[j] - want[j]).abs() <= tol,
                            "{} rope rows nh={nh} d={d} b={b} row {r} at {}: {} vs {}",
                            p.name(),
                            row.pos,
                            got[j],
                            want[j]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn kv_store_rows_match() {
    for p in Both::each() {
        let mut rng = Rng::new(74);
        let (w, ctx) = (24usize, 37usize);
        for b in BS {
            let n_slots = b + 2;
            let (rows, rd) = random_rows(&p, &mut rng, b, n_slots, ctx);
            let kp = p.up(&rng.normals(n_slots * ctx * w, 1.0), &[n_slots * ctx, w]);
            let vp = p.up(&rng.normals(n_slots * ctx * w, 1.0), &[n_slots * ctx, w]);
            let (k, v) = (
                p.up(&rng.normals(b * w, 1.0), &[b, w]),
                p.up(&rng.normals(b * w, 1.0), &[b, w]),
            );
            p.run("kv_store_rows", |be, s| {
                be.kv_store_rows(k.on(s), v.on(s), kp.on(s), vp.on(s), ctx, rows_on(&rows, &rd, s))
            });
            p.check(&format!("k pool b={b}"), &kp, 0.0, 0.0);
            p.check(&format!("v pool b={b}"), &vp, 0.0, 0.0);
        }
    }
}

#[test]
fn attention_rows_match() {
    for p in Both::each() {
        let mut rng = Rng::new(75);
        let dims = |n_head, n_head_kv, head_dim| AttnDims {
            n_head,
            n_head_kv,
            head_dim,
        };
        // Qwen3.5's 9B shape (16 query heads of 256 over 4 KV heads), MHA, and odd ones.
        for (d, ctx) in [
            (dims(16, 4, 256), 700usize),
            (dims(4, 4, 64), 2100),
            (dims(6, 2, 40), 45),
        ] {
            let (nq, nkv) = (d.n_head * d.head_dim, d.n_head_kv * d.head_dim);
            for b in BS.into_iter().filter(|&b| b <= 64 || ctx * nkv <= 4096) {
                let n_slots = b + 1;
                let (rows, rd) = random_rows(&p, &mut rng, b, n_slots, ctx);
                let kp = p.up(&rng.normals(n_slots * ctx * nkv, 1.0), &[n_slots * ctx, nkv]);
                let vp = p.up(&rng.normals(n_slots * ctx * nkv, 1.0), &[n_slots * ctx, nkv]);
                let q = p.up(&rng.normals(b * nq, 1.0), &[b, nq]);
                let out = p.zeros(&[b, nq]);
                let scale = 1.0 / (d.head_dim as f32).sqrt();
                p.run("attention_rows", |be, s| {
                    be.attention_rows(
                        q.on(s),
                        kp.on(s),
                        vp.on(s),
                        ctx,
                        rows_on(&rows, &rd, s),
                        d,
                        scale,
                        out.on(s),
                    )
                });
                // tests/device_ops.rs attention_matches: convex combinations of N(0,1) values.
                p.check_tier(&format!("attention rows {d:?} ctx={ctx} b={b}"), &out, 5e-6, 1e-4);
            }
        }
    }
}

/// A recorded step of the row ops stays right when its rows change: a backend that replays it
/// must read every row's slot and position from `Rows::dev` (written before the step, as the
/// executor does), never from the host values it was recorded with. Eight steps of conv, the
/// delta rule, RoPE, the KV store and attention on the same pools, each with new rows.
#[test]
fn recorded_row_steps_follow_new_rows() {
    const KEY: u64 = 0x00c0_ffee_0000_0001;
    for p in Both::each() {
        let mut rng = Rng::new(76);
        let (b, n_slots, ctx, n_steps) = (5usize, 9usize, 50usize, 8);
        let (gdn, conv_k) = (GDN_ODD, 4usize);
        let (c, hv, per_slot) = (gdn.conv_dim(), gdn.hv, gdn.hv * gdn.dv);
        let ad = AttnDims {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
        };
        let (nq, nkv) = (ad.n_head * ad.head_dim, ad.n_head_kv * ad.head_dim);
        let rd = p.zeros_u32(&[b, 2]);
        let w = p.up(&rng.normals(c * conv_k, 0.5), &[c, conv_k]);
        let conv = p.up(
            &rng.normals(n_slots * (conv_k - 1) * c, 1.0),
            &[n_slots * (conv_k - 1), c],
        );
        let x = p.up(&rng.normals(b * c, 1.0), &[b, c]);
        let u = p.zeros(&[b, c]);
        let g: Vec<f32> = (0..b * hv).map(|_| -(rng.uniform() as f32) * 2.0).collect();
        let beta: Vec<f32> = (0..b * hv).map(|_| rng.uniform() as f32).collect();
        let (g, beta) = (p.up(&g, &[b, hv]), p.up(&beta, &[b, hv]));
        let delta = p.up(
            &rng.normals(n_slots * per_slot * gdn.dk, 0.5),
            &[n_slots * per_slot, gdn.dk],
        );
        let o = p.zeros(&[b, per_slot]);
        let kp = p.up(&rng.normals(n_slots * ctx * nkv, 1.0), &[n_slots * ctx, nkv]);
        let vp = p.up(&rng.normals(n_slots * ctx * nkv, 1.0), &[n_slots * ctx, nkv]);
        let q = p.up(&rng.normals(b * nq, 1.0), &[b, nq]);
        let (k, v) = (
            p.up(&rng.normals(b * nkv, 1.0), &[b, nkv]),
            p.up(&rng.normals(b * nkv, 1.0), &[b, nkv]),
        );
        let out = p.zeros(&[b, nq]);
        let xr_host = rng.normals(b * nq, 1.0);
        let xr = p.up(&xr_host, &[b, nq]);
        let (recorded, replays) = (std::cell::Cell::new(false), std::cell::Cell::new(0usize));
        for step in 0..n_steps {
            let rows = host_rows(&mut rng, b, n_slots, ctx);
            p.run("rows", |be, s| be.write_u32(rd.on(s), &pairs(&rows)));
            p.run("recorded rows step", |be, s| {
                let mode = be.step_begin(KEY)?;
                if s == Side::Dev {
                    recorded.set(recorded.get() || mode == StepMode::Record);
                    replays.set(replays.get() + usize::from(mode == StepMode::Replayed));
                }
                let r = if mode == StepMode::Replayed {
                    Ok(())
                } else {
                    let r = rows_on(&rows, &rd, s);
                    be.conv1d_silu_rows(x.on(s), w.on(s), conv.on(s), r, u.on(s))
                        .and_then(|()| be.delta_rule_rows(u.on(s), g.on(s), beta.on(s), delta.on(s), o.on(s), gdn, r))
                        .and_then(|()| be.rope_neox_rows(xr.on(s), ad.head_dim, 16, 10_000.0, r))
                        .and_then(|()| be.kv_store_rows(k.on(s), v.on(s), kp.on(s), vp.on(s), ctx, r))
                        .and_then(|()| be.attention_rows(q.on(s), kp.on(s), vp.on(s), ctx, r, ad, 0.2, out.on(s)))
                };
                be.step_end(KEY, r.is_ok())?;
                r
            });
            // The ops' own bounds (above); RoPE's (rope_rows_match) once per step so far, as it
            // rotates in place.
            let (got, want) = p.read(&xr);
            for (r, (g, w)) in got.chunks_exact(nq).zip(want.chunks_exact(nq)).enumerate() {
                let x0 = &xr_host[r * nq..(r + 1) * nq];
                let norm = x0.iter().map(|v| v * v).sum::<f32>().sqrt();
                let tol = (step + 1) as f32 * (2e-6 * norm + 4.0 * ctx as f32 * norm / (1u32 << 24) as f32);
                for (a, e) in g.iter().zip(w) {
                    assert!(
                        (a - e).abs() <= tol,
                        "{} replayed rope step {step} row {r}: {a} vs {e}",
                        p.name()
                    );
                }
            }
            p.check(&format!("replayed conv step {step}"), &u, 1e-6, 1e-5);
            p.check(&format!("replayed conv states step {step}"), &conv, 0.0, 0.0);
            p.check(&format!("replayed delta step {step}"), &o, 1e-5, 1e-4);
            p.check(&format!("replayed delta states step {step}"), &delta, 1e-5, 1e-4);
            p.check(&format!("replayed k pool step {step}"), &kp, 0.0, 0.0);
            p.check(&format!("replayed v pool step {step}"), &vp, 0.0, 0.0);
            p.check_tier(&format!("replayed attention step {step}"), &out, 5e-6, 1e-4);
        }
        // Another test replacing a buffer the recording binds drops it (it is made again), but
        // not before every step.
        assert!(
            !recorded.get() || replays.get() >= 1,
            "{}: recorded, but none of {} steps replayed",
            p.name(),
            n_steps - 1
        );
    }
}

/// The rules hold on every backend: a slot twice, a slot outside the pool, a position past a
/// slot's context, and a device rows tensor of the wrong shape are refused.
#[test]
fn bad_rows_are_refused() {
    for be in backends() {
        let t = |shape: &[usize]| be.alloc(rill::backend::DType::F32, shape).expect("alloc");
        let (k, v, kp, vp) = (t(&[2, 8]), t(&[2, 8]), t(&[3 * 4, 8]), t(&[3 * 4, 8]));
        let dev = be.upload_u32(&[0, 0, 1, 0], &[2, 2]).expect("up");
        let store =
            |host: &[SeqRow], dev: &rill::backend::Tensor| be.kv_store_rows(&k, &v, &kp, &vp, 4, Rows { host, dev });
        let row = |slot, pos| SeqRow { slot, pos };
        store(&[row(0, 0), row(1, 3)], &dev).expect("good rows");
        assert!(
            store(&[row(1, 0), row(1, 1)], &dev).is_err(),
            "{}: a slot twice",
            be.name()
        );
        assert!(
            store(&[row(0, 0), row(3, 0)], &dev).is_err(),
            "{}: slot outside",
            be.name()
        );
        assert!(
            store(&[row(0, 0), row(1, 4)], &dev).is_err(),
            "{}: position past ctx",
            be.name()
        );
        let flat = be.upload_u32(&[0, 0, 1, 0], &[4]).expect("up");
        assert!(
            store(&[row(0, 0), row(1, 0)], &flat).is_err(),
            "{}: rows tensor shape",
            be.name()
        );
    }
}
