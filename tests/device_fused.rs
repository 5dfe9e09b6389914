//! The executor's fused ops (`gdn_conv_gates`, `gdn_recurrent_step`, `attn_qk_prep`) on every device backend against
//! the CPU reference, whose default implementations compose the unfused ops: random inputs, token
//! counts 1 to 65 (decode and prefill), several positions, partial and no RoPE, GQA ratios, odd
//! head counts and sizes, heads too wide for the fused kernels (their fallbacks), and the ops
//! recorded into a step that is then replayed at new positions (the position is read on the device).
//! Then a model whose layers take every fused decode op (these two and `matmul_group`, whose own
//! tests are tests/device_group.rs), decoded on each device against the CPU. scripts/test.sh runs
//! this binary again with the wgpu fallbacks a browser gets (`RILL_TEST_WGPU=max_storage=8`).
//!
//! Tolerances are those of the unfused ops' tests (tests/device_ops.rs), which these ops compose:
//! copies (the gate half of q, v into its cache, the conv state) are bit-exact.

mod common;

use common::device::{pos_on, Both, Pt, Side, Steps};
use common::weights::{random_weight, upload};
use common::*;
use rill::backend::compose;
use rill::backend::{AddNorm, AttnPrep, Backend, GdnDims, GdnGates, GdnStep, Group, Pos, Tensor};

const TS: [usize; 4] = [1, 3, 64, 65];

/// Qwen3.5 9B's Gated DeltaNet heads; odd counts and sizes (hv a multiple of hk, as the delta rule
/// needs); a key head wider than one CUDA block (its unfused fallback; past wgpu's limit); many
/// value heads per key head (several workgroups of gates).
const GDN_SHAPES: [GdnDims; 4] = [
    GdnDims {
        hk: 16,
        hv: 32,
        dk: 128,
        dv: 128,
    },
    GdnDims {
        hk: 3,
        hv: 6,
        dk: 5,
        dv: 7,
    },
    GdnDims {
        hk: 1,
        hv: 1,
        dk: 1030,
        dv: 3,
    },
    GdnDims {
        hk: 2,
        hv: 34,
        dk: 16,
        dv: 8,
    },
];

/// The gates' inputs and outputs for `t` tokens of `hv` value heads.
struct Gates {
    a: Pt,
    b: Pt,
    ssm_a: Pt,
    dt_bias: Pt,
    g: Pt,
    beta: Pt,
}

impl Gates {
    fn new(p: &Both, rng: &mut Rng, t: usize, hv: usize) -> Gates {
        let mut a = rng.normals(t * hv, 6.0);
        // softplus' branches: e^x underflowing, and both sides of its x > 20 switch.
        for (i, v) in [-100.0f32, 19.99, 20.01].iter().enumerate() {
            if i < a.len() {
                a[i] = *v;
            }
        }
        let ssm_a: Vec<f32> = (0..hv).map(|_| -rng.uniform() as f32 * 8.0 - 0.01).collect();
        Gates {
            a: p.up(&a, &[t, hv]),
            b: p.up(&rng.normals(t * hv, 4.0), &[t, hv]),
            ssm_a: p.up(&ssm_a, &[hv]),
            dt_bias: p.up(&rng.normals(hv, 1.0), &[hv]),
            g: p.zeros(&[t, hv]),
            beta: p.zeros(&[t, hv]),
        }
    }
    fn on(&self, s: Side) -> GdnGates<'_> {
        GdnGates {
            a: self.a.on(s),
            b: self.b.on(s),
            ssm_a: self.ssm_a.on(s),
            dt_bias: self.dt_bias.on(s),
            g: self.g.on(s),
            beta: self.beta.on(s),
        }
    }
    /// The gdn_gates test's tolerances: relative, down to the tiny softplus of very negative a.
    fn check(&self, p: &Both, what: &str) {
        p.check(&format!("{what} g"), &self.g, 1e-30, 1e-5);
        p.check(&format!("{what} beta"), &self.beta, 1e-7, 1e-5);
    }
}

#[test]
fn gdn_conv_gates_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(41);
        for (dims, k) in [
            (GDN_SHAPES[0], 4usize),
            (GDN_SHAPES[1], 4),
            (GDN_SHAPES[1], 1),
            (GDN_SHAPES[2], 4),
            (GDN_SHAPES[3], 3),
        ] {
            let cd = dims.conv_dim();
            let w = p.up(&rng.normals(cd * k, 0.5), &[cd, k]);
            let state = p.up(&rng.normals((k - 1) * cd, 1.0), &[k - 1, cd]);
            // The state carries from call to call: decode steps after prefills.
            for t in [1usize, 3, 64, 65, 1] {
                let what = format!("gdn_conv_gates t={t} k={k} {dims:?}");
                let x = p.up(&rng.normals(t * cd, 1.0), &[t, cd]);
                let out = p.zeros(&[t, cd]);
                let gates = Gates::new(&p, &mut rng, t, dims.hv);
                let op = |be: &dyn Backend, s: Side| {
                    compose::gdn_conv_gates(be, x.on(s), w.on(s), state.on(s), out.on(s), dims, 1e-6, gates.on(s))
                };
                // The wide key head is past some backends' limit (wgpu: 128): refused, or right.
                if dims.dk > 128 {
                    if !p.runs_or_refuses(&what, op) {
                        break;
                    }
                } else {
                    p.run(&what, op);
                }
                p.check(&format!("{what} state"), &state, 0.0, 0.0);
                p.check_conv_l2qk(&what, &out, dims, t);
                gates.check(&p, &what);
            }
        }
    }
}

/// `gdn_recurrent_step` (conv + gates, delta rule, gated norm) over a few decode tokens and a
/// 3-token batch, the conv and delta states carrying from call to call: the shapes the CUDA
/// backend runs as one launch (one token, 4 taps, heads of 32 to 128, whole slices of 256 value
/// outputs: 9B's, the fixtures', narrower heads) and ones it leaves to the three ops (odd sizes,
/// 3 taps, value outputs not a multiple of 256). Tolerances of the composed ops' tests; the conv
/// state only moves values (exact).
#[test]
fn gdn_recurrent_step_matches() {
    let dims = |hk, hv, dk, dv| GdnDims { hk, hv, dk, dv };
    for p in Both::each() {
        let mut rng = Rng::new(43);
        for (d, k) in [
            (GDN_SHAPES[0], 4usize),
            (dims(2, 4, 128, 128), 4),
            (dims(1, 4, 64, 64), 4),
            (dims(4, 8, 32, 32), 4),
            (dims(2, 4, 128, 128), 3),
            (GDN_SHAPES[1], 4),
            (GDN_SHAPES[3], 4),
        ] {
            let (cd, n) = (d.conv_dim(), d.value_dim());
            let conv_w = p.up(&rng.normals(cd * k, 0.5), &[cd, k]);
            let conv_state = p.up(&rng.normals((k - 1) * cd, 1.0), &[k - 1, cd]);
            let state = p.up(&rng.normals(d.hv * d.dv * d.dk, 0.3), &[d.hv, d.dv, d.dk]);
            let norm_w = p.up(&rng.normals(d.dv, 1.0), &[d.dv]);
            for (i, t) in [1usize, 1, 3, 1].into_iter().enumerate() {
                let what = format!("gdn_recurrent_step call {i} t={t} k={k} {d:?}");
                let qkv = p.up(&rng.normals(t * cd, 1.0), &[t, cd]);
                let z = p.up(&rng.normals(t * n, 1.0), &[t, n]);
                let gates = Gates::new(&p, &mut rng, t, d.hv);
                let (conv_out, o, out) = (p.zeros(&[t, cd]), p.zeros(&[t, n]), p.zeros(&[t, n]));
                p.run(&what, |be: &dyn Backend, s: Side| {
                    let step = GdnStep {
                        qkv: qkv.on(s),
                        z: z.on(s),
                        conv_w: conv_w.on(s),
                        conv_state: conv_state.on(s),
                        gates: gates.on(s),
                        state: state.on(s),
                        norm_w: norm_w.on(s),
                        conv_out: conv_out.on(s),
                        o: o.on(s),
                        out: out.on(s),
                    };
                    compose::gdn_recurrent_step(be, step, d, 1e-6, 1e-6)
                });
                p.check(&format!("{what} conv state"), &conv_state, 0.0, 0.0);
                p.check(&format!("{what} delta state"), &state, 1e-5, 1e-4);
                p.check(&format!("{what} out"), &out, 1e-5, 1e-4);
            }
        }
    }
}

/// `gdn_recurrent_step`'s contract on every backend (the CPU's default included): an output that
/// shares a buffer with an input (the result over z, the delta rule's output over the state or
/// over z, which only the op's own rule relates) or a state of the wrong size is refused, and the
/// backend still runs the op afterwards.
#[test]
fn gdn_recurrent_step_refuses_bad_operands() {
    let d = GdnDims {
        hk: 1,
        hv: 1,
        dk: 32,
        dv: 32,
    };
    let (cd, n) = (d.conv_dim(), d.value_dim());
    for be in common::backends() {
        let g = be.as_ref();
        let f = |shape: &[usize]| g.alloc(rill::backend::DType::F32, shape).expect("alloc");
        let (qkv, z, conv_w, conv_state) = (f(&[1, cd]), f(&[1, n]), f(&[cd, 4]), f(&[3, cd]));
        let (a, b, ssm_a, dt_bias, gg, beta) = (f(&[1, 1]), f(&[1, 1]), f(&[1]), f(&[1]), f(&[1, 1]), f(&[1, 1]));
        let (state, norm_w, conv_out, o, out) = (f(&[1, 32, 32]), f(&[32]), f(&[1, cd]), f(&[1, n]), f(&[1, n]));
        let short_state = f(&[1, 32, 31]);
        let gates = GdnGates {
            a: &a,
            b: &b,
            ssm_a: &ssm_a,
            dt_bias: &dt_bias,
            g: &gg,
            beta: &beta,
        };
        let step = GdnStep {
            qkv: &qkv,
            z: &z,
            conv_w: &conv_w,
            conv_state: &conv_state,
            gates,
            state: &state,
            norm_w: &norm_w,
            conv_out: &conv_out,
            o: &o,
            out: &out,
        };
        let name = g.name();
        let refused = |s: GdnStep<'_>, what: &str| {
            assert!(
                compose::gdn_recurrent_step(&*g, s, d, 1e-6, 1e-6).is_err(),
                "{name}: {what} must be refused"
            )
        };
        refused(GdnStep { out: &z, ..step }, "out aliasing z");
        // Only the op's own rule sees this one: the delta rule's output is the gated norm's gate.
        refused(GdnStep { o: &z, ..step }, "o aliasing z");
        refused(GdnStep { o: &state, ..step }, "o aliasing the state");
        refused(
            GdnStep {
                state: &short_state,
                ..step
            },
            "a short state",
        );
        compose::gdn_recurrent_step(g, step, d, 1e-6, 1e-6)
            .unwrap_or_else(|e| panic!("{name}: a valid call after the refusals: {e}"));
    }
}

/// `matmul_add_rms_norm` refuses what `matmul` and `add_rms_norm` refuse, and a residual aliasing
/// the product's input or weight (which only the op's own rule sees); the normed output may be the
/// product's input (written after the product has read it), and then holds the norm.
#[test]
fn matmul_add_rms_norm_refuses_bad_operands() {
    for be in common::backends() {
        let g = be.as_ref();
        let f = |shape: &[usize]| g.alloc(rill::backend::DType::F32, shape).expect("alloc");
        let (w, x, y, acc, nw, out) = (
            f(&[256, 256]),
            f(&[1, 256]),
            f(&[1, 256]),
            f(&[1, 256]),
            f(&[256]),
            f(&[1, 256]),
        );
        let next = AddNorm {
            acc: &acc,
            w: &nw,
            eps: 1e-6,
            out: &out,
            then: None,
        };
        let name = g.name();
        let refused = |w: &Tensor, x: &Tensor, y: &Tensor, n: AddNorm<'_>, what: &str| {
            assert!(
                compose::matmul_add_rms_norm(&*g, w, x, y, n).is_err(),
                "{name}: {what} must be refused"
            )
        };
        refused(&w, &x, &y, AddNorm { acc: &x, ..next }, "the residual aliasing x");
        refused(
            &w,
            &x,
            &y,
            AddNorm { acc: &w, ..next },
            "the residual aliasing the weight",
        );
        refused(
            &w,
            &x,
            &y,
            AddNorm { acc: &y, ..next },
            "the residual aliasing the product",
        );
        refused(
            &w,
            &x,
            &y,
            AddNorm { out: &y, ..next },
            "the normed output aliasing the product",
        );
        refused(
            &w,
            &x,
            &y,
            AddNorm {
                acc: &f(&[1, 255]),
                ..next
            },
            "a short residual",
        );
        refused(&w, &x, &f(&[1, 255]), next, "a short product");
        refused(&w, &x, &y, AddNorm { w: &f(&[255]), ..next }, "a short norm weight");
        // The next block's products of the normed rows (`then`): matmul_group's rules, outputs
        // aliasing nothing the op reads or writes.
        let (gw, gy, short) = (f(&[64, 256]), f(&[1, 64]), f(&[1, 63]));
        let gws = [&gw];
        for (over, o) in [("residual", &acc), ("normed rows", &out), ("x", &x), ("weight", &gw)] {
            let outs = [o];
            let n = AddNorm {
                then: Some(Group { ws: &gws, outs: &outs }),
                ..next
            };
            refused(&w, &x, &y, n, &format!("a product of the normed rows over the {over}"));
        }
        for (what, outs) in [
            ("a short product of the normed rows", vec![&short]),
            ("an empty group", vec![]),
        ] {
            let ws = if outs.is_empty() { vec![] } else { vec![&gw] };
            let n = AddNorm {
                then: Some(Group { ws: &ws, outs: &outs }),
                ..next
            };
            refused(&w, &x, &y, n, what);
        }
        let gys = [&gy];
        let n = AddNorm {
            then: Some(Group { ws: &gws, outs: &gys }),
            ..next
        };
        compose::matmul_add_rms_norm(g, &w, &x, &y, n)
            .unwrap_or_else(|e| panic!("{name}: a valid call with products of the normed rows: {e}"));
        compose::matmul_add_rms_norm(g, &w, &x, &y, next)
            .unwrap_or_else(|e| panic!("{name}: a valid call after the refusals: {e}"));
        // The normed output over the product's input: x = W = the norm weight = ones, so the
        // residual gains 256 per element and x becomes its norm, all ones (to within rounding).
        let ones = |shape: &[usize]| g.upload_f32(&vec![1.0; shape.iter().product()], shape).expect("upload");
        let (w1, x1, nw1) = (ones(&[256, 256]), ones(&[1, 256]), ones(&[256]));
        let h0 = g.read_f32(&acc).expect("read");
        let n1 = AddNorm {
            w: &nw1,
            out: &x1,
            ..next
        };
        compose::matmul_add_rms_norm(g, &w1, &x1, &y, n1)
            .unwrap_or_else(|e| panic!("{name}: the normed output over x: {e}"));
        let (h, nx) = (g.read_f32(&acc).expect("read"), g.read_f32(&x1).expect("read"));
        assert!(
            h.iter().zip(&h0).all(|(v, v0)| *v == v0 + 256.0),
            "{name}: the residual did not gain 256"
        );
        let ms = h.iter().map(|v| v * v).sum::<f32>() / 256.0;
        let want: Vec<f32> = h.iter().map(|v| v / (ms + 1e-6).sqrt()).collect();
        assert_close(&format!("{name} x as the norm"), &nx, &want, 1e-6, 1e-5);
    }
}

/// The tensors of one `attn_qk_prep` call for `t` tokens into caches of `ctx` rows (filled with
/// old rows that must survive).
struct Prep {
    qg: Pt,
    k: Pt,
    v: Pt,
    q_norm: Pt,
    k_norm: Pt,
    q: Pt,
    gate: Pt,
    q_normed: Pt,
    k_normed: Pt,
    k_cache: Pt,
    v_cache: Pt,
    /// The caches' contents before the call.
    old: (Vec<f32>, Vec<f32>),
}

/// Heads, kv heads, head dim, rotated dims.
type AttnShape = (usize, usize, usize, usize);

impl Prep {
    fn new(p: &Both, rng: &mut Rng, (nh, nkv, d, _): AttnShape, t: usize, ctx: usize) -> Prep {
        let (qw, kw) = (nh * d, nkv * d);
        let old = (rng.normals(ctx * kw, 1.0), rng.normals(ctx * kw, 1.0));
        Prep {
            qg: p.up(&rng.normals(t * 2 * qw, 2.0), &[t, 2 * qw]),
            k: p.up(&rng.normals(t * kw, 2.0), &[t, kw]),
            v: p.up(&rng.normals(t * kw, 1.0), &[t, kw]),
            q_norm: p.up(&rng.normals(d, 1.0), &[d]),
            k_norm: p.up(&rng.normals(d, 1.0), &[d]),
            q: p.zeros(&[t, qw]),
            // Outputs start as garbage: every element must be written.
            gate: p.up(&rng.normals(t * qw, 1e3), &[t, qw]),
            q_normed: p.up(&rng.normals(t * qw, 1e3), &[t, qw]),
            k_normed: p.up(&rng.normals(t * kw, 1e3), &[t, kw]),
            k_cache: p.up(&old.0, &[ctx, kw]),
            v_cache: p.up(&old.1, &[ctx, kw]),
            old,
        }
    }
    fn on(&self, s: Side) -> AttnPrep<'_> {
        AttnPrep {
            qg: self.qg.on(s),
            k: self.k.on(s),
            v: self.v.on(s),
            q_norm: self.q_norm.on(s),
            k_norm: self.k_norm.on(s),
            q: self.q.on(s),
            gate: self.gate.on(s),
            q_normed: self.q_normed.on(s),
            k_normed: self.k_normed.on(s),
        }
    }
    fn run(&self, p: &Both, (_, _, d, n_rot): AttnShape, theta: f32, pos: usize, pos_t: &Pt) {
        p.run("attn_qk_prep", |be, s| {
            let at = pos_on(pos, pos_t, s);
            compose::attn_qk_prep(
                be,
                self.on(s),
                d,
                n_rot,
                theta,
                1e-6,
                self.k_cache.on(s),
                self.v_cache.on(s),
                at,
            )
        });
    }

    /// Every output against the CPU's, and on each backend its own T new k rows and the v rows at
    /// rows `pos..pos+T` of the caches, the other rows untouched.
    fn check(&self, p: &Both, what: &str, (_, nkv, d, n_rot): AttnShape, pos: usize) {
        p.check(&format!("{what} gate"), &self.gate, 0.0, 0.0);
        check_normed_rotated(p, &format!("{what} q"), &self.q_normed, d, n_rot, pos);
        check_normed_rotated(p, &format!("{what} k"), &self.k_normed, d, n_rot, pos);
        let (k, v) = (p.read(&self.k_normed), p.read(&self.v));
        let rows = pos * nkv * d..pos * nkv * d + k.0.len();
        for (name, cache, old, new) in [
            ("k", &self.k_cache, &self.old.0, &k),
            ("v", &self.v_cache, &self.old.1, &v),
        ] {
            let (got, cpu) = p.read(cache);
            for (side, have, rows_new) in [(p.name(), got, &new.0), ("cpu".to_string(), cpu, &new.1)] {
                let mut want = old.clone();
                want[rows.clone()].copy_from_slice(rows_new);
                assert_eq!(have, want, "{side} {what} {name} cache");
            }
        }
    }
}

/// A per-head RMSNorm followed by NeoX RoPE, device against CPU; returns the device's values.
/// Error model: the norm's 1e-6 + 1e-5 relative (rms_norm test) is carried unchanged in size by
/// the rotation, which adds rope's own (rope test): 2e-6 of the pair's norm, and the f32 angle's
/// error of a few ulp of the position (4 pos 2^-24 rad) times the pair's norm, for a backend that
/// computes its angle in f32. Pair norms are taken from the CPU's output (rotation keeps them).
fn check_normed_rotated(p: &Both, what: &str, x: &Pt, d: usize, n_rot: usize, pos0: usize) -> Vec<f32> {
    let (got, want) = p.read(x);
    let cols = x.cpu.cols();
    let half = n_rot / 2;
    for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let (r, i) = (j / cols, j % d);
        let mate = if i < half {
            j + half
        } else if i < n_rot {
            j - half
        } else {
            j
        };
        let norm = (w * w + want[mate] * want[mate]).sqrt();
        let pos = (pos0 + r) as f32;
        let tol = 1e-6 + 1e-5 * w.abs() + 2e-6 * norm + 1e-5 * norm + 4.0 * pos * norm / (1u32 << 24) as f32;
        assert!(
            (g - w).abs() <= tol,
            "{} {what} [{j}] (row {r}, dim {i}, n_rot {n_rot}): {g} vs {w} (tol {tol})",
            p.name()
        );
    }
    got
}

/// (heads, kv heads, head dim, rotated dims): Qwen3.5 9B's full attention (16/4, 256, partial
/// rotary 64), GQA 3:1 at an odd head dim, full rotation without GQA and at 3:1, no rotation at
/// 2:1, one pair of 130 dims at 5:1, a head of one pair, head dims past one block of 256 threads
/// and past the widest fused wgpu kernel (512).
const ATTN_SHAPES: [AttnShape; 9] = [
    (16, 4, 256, 64),
    (6, 2, 37, 10),
    (3, 3, 8, 8),
    (6, 2, 128, 128),
    (2, 1, 6, 0),
    (5, 1, 130, 2),
    (2, 1, 2, 2),
    (2, 2, 300, 64),
    (2, 1, 512, 64),
];

#[test]
fn attn_qk_prep_matches() {
    for p in Both::each() {
        let mut rng = Rng::new(42);
        for shape in ATTN_SHAPES {
            for t in TS {
                for (pos, spare, theta) in [(0usize, 0usize, 1e7f32), (7, 2, 1e4), (1000, 1, 1e7)] {
                    let ctx = pos + t + spare;
                    let prep = Prep::new(&p, &mut rng, shape, t, ctx);
                    let pt = p.pos(pos);
                    prep.run(&p, shape, theta, pos, &pt);
                    let what = format!("attn_qk_prep {shape:?} t={t} pos={pos} ctx={ctx} theta={theta}");
                    prep.check(&p, &what, shape, pos);
                }
            }
        }
    }
}

/// Both fused ops recorded into one step (a CUDA graph on that backend) and replayed token after
/// token: each step's inputs come through `embed` of device-side ids and the position from the
/// device tensor, so a replay that kept the recorded position, or skipped an op, shows.
#[test]
fn recorded_fused_step_replays_at_new_positions() {
    for p in Both::each() {
        let mut rng = Rng::new(43);
        let (vocab, steps) = (7usize, 6usize);
        let shape @ (nh, nkv, d, n_rot) = (4usize, 2usize, 64usize, 16usize);
        let dims = GdnDims {
            hk: 2,
            hv: 4,
            dk: 32,
            dv: 16,
        };
        let (cd, k) = (dims.conv_dim(), 4usize);
        let table = |rng: &mut Rng, width: usize| p.up(&rng.normals(vocab * width, 1.5), &[vocab, width]);
        let (t_qg, t_k, t_v) = (
            table(&mut rng, 2 * nh * d),
            table(&mut rng, nkv * d),
            table(&mut rng, nkv * d),
        );
        let (t_x, t_a, t_b) = (table(&mut rng, cd), table(&mut rng, dims.hv), table(&mut rng, dims.hv));
        let prep = Prep::new(&p, &mut rng, shape, 1, steps);
        let (kc, vc) = (&prep.k_cache, &prep.v_cache);
        let gates = Gates::new(&p, &mut rng, 1, dims.hv);
        let w = p.up(&rng.normals(cd * k, 0.5), &[cd, k]);
        let state = p.up(&rng.normals((k - 1) * cd, 1.0), &[k - 1, cd]);
        let (x, out) = (p.zeros(&[1, cd]), p.zeros(&[1, cd]));
        let (ids, pos) = (p.zeros_u32(&[1]), p.zeros_u32(&[1]));
        let ops = |be: &dyn Backend, s: Side, at: Pos| -> rill::Result<()> {
            for (tab, dst) in [
                (&t_qg, &prep.qg),
                (&t_k, &prep.k),
                (&t_v, &prep.v),
                (&t_x, &x),
                (&t_a, &gates.a),
                (&t_b, &gates.b),
            ] {
                be.embed(tab.on(s), ids.on(s), dst.on(s))?;
            }
            compose::gdn_conv_gates(be, x.on(s), w.on(s), state.on(s), out.on(s), dims, 1e-6, gates.on(s))?;
            compose::attn_qk_prep(be, prep.on(s), d, n_rot, 1e7, 1e-6, kc.on(s), vc.on(s), at)
        };
        let (key, record) = (0xf05e, Steps::default());
        for step in 0..steps {
            let token = (step * 5 + 2) as u32 % vocab as u32;
            p.step(&record, key, &ids, &[token], &pos, step, ops);
            let what = format!("step {step}");
            p.check(&format!("{what} conv state"), &state, 0.0, 0.0);
            p.check_conv_l2qk(&what, &out, dims, 1);
            gates.check(&p, &what);
            p.check(&format!("{what} gate"), &prep.gate, 0.0, 0.0);
            check_normed_rotated(&p, &format!("{what} q"), &prep.q_normed, d, n_rot, step);
            check_normed_rotated(&p, &format!("{what} k"), &prep.k_normed, d, n_rot, step);
            // The cache rows written so far: the CPU's are the reference (rows past `step` keep
            // their old contents on both).
            check_normed_rotated(&p, &format!("{what} k cache"), kc, d, n_rot, 0);
            p.check(&format!("{what} v cache"), vc, 0.0, 0.0);
        }
        p.assert_replayed(&record, steps);
    }
}

/// A random weight of format `ty`, `[rows, cols]`, on both backends.
fn both_weight(p: &Both, rng: &mut Rng, ty: rill::gguf::GgmlType, rows: usize, cols: usize) -> Pt {
    let b = random_weight(ty, rows, cols, 0.5, rng);
    Pt {
        dev: upload(p.dev.as_ref(), ty, &[rows, cols], &b),
        cpu: upload(p.cpu.as_ref(), ty, &[rows, cols], &b),
    }
}

/// The inputs of a recorded step that ends a block: an embedding table of `vocab` rows of `n_in`
/// (the last product's input), the norm's weights `[d]`, the residual's first values `[t, d]`, and
/// the token ids and position tensors.
struct BlockEnd {
    vocab: usize,
    table: Pt,
    norm_w: Pt,
    h0: Vec<f32>,
    ids: Pt,
    pos: Pt,
    dims: [usize; 3],
}

impl BlockEnd {
    fn new(p: &Both, rng: &mut Rng, n_in: usize, d: usize, t: usize) -> BlockEnd {
        let vocab = 5;
        BlockEnd {
            vocab,
            table: p.up(&rng.normals(vocab * n_in, 1.0), &[vocab, n_in]),
            norm_w: p.up(&rng.normals(d, 1.0), &[d]),
            h0: rng.normals(t * d, 4.0),
            ids: p.zeros_u32(&[t]),
            pos: p.zeros_u32(&[1]),
            dims: [n_in, d, t],
        }
    }
    /// A set of the step's buffers: the residual (its first values), x, the product, the normed rows.
    fn buffers(&self, p: &Both) -> [Pt; 4] {
        let [n_in, d, t] = self.dims;
        [
            p.up(&self.h0, &[t, d]),
            p.zeros(&[t, n_in]),
            p.zeros(&[t, d]),
            p.zeros(&[t, d]),
        ]
    }
}

/// A decode step's product, its residual add and RMSNorm (`add_rms_norm` of the product's output,
/// or the one op `matmul_add_rms_norm`), and a product of the normed rows, recorded into a step and
/// replayed (a CUDA graph, in which the norm prepares its output for the second product), for the
/// tensor-core formats, F32 and F16 (products that do not add into the residual themselves), rows
/// of 320 to 2048 (320: not whole slices of 256) and 1 or 3 token rows: every step against the CPU
/// (the residual accumulates over the steps), and on the device bit for bit what the same ops give
/// run one by one, unrecorded (a backend that fuses recorded ops must keep their bits: session 17
/// measured the norm as the product's tail this way).
#[test]
fn recorded_product_then_norm_matches_cpu() {
    use rill::gguf::GgmlType::{F16, F32, Q4K, Q6K, Q8_0};
    for p in Both::each() {
        let mut rng = Rng::new(47);
        for (case, (ty, d, n_in, t, fused)) in [
            (Q4K, 512, 512, 1, false),
            (Q6K, 1024, 2048, 1, false),
            (Q8_0, 512, 1024, 3, false),
            (Q4K, 2048, 256, 3, false),
            (Q4K, 512, 512, 1, true),
            (Q6K, 1024, 2048, 1, true),
            (Q8_0, 512, 1024, 3, true),
            (Q4K, 2048, 256, 3, true),
            (Q8_0, 320, 256, 1, true),
            (F32, 256, 64, 1, true),
            (F16, 512, 96, 3, true),
        ]
        .into_iter()
        .enumerate()
        {
            let (w, w2) = (
                both_weight(&p, &mut rng, ty, d, n_in),
                both_weight(&p, &mut rng, ty, 256, d),
            );
            let be = BlockEnd::new(&p, &mut rng, n_in, d, t);
            let (vocab, table, norm_w, ids, pos) = (be.vocab, &be.table, &be.norm_w, &be.ids, &be.pos);
            // Two sets of buffers: the recorded steps', and (device only) the plain runs'.
            let bufs = || {
                let [h, x, mix, xn] = be.buffers(&p);
                (h, x, mix, xn, p.zeros(&[t, 256]))
            };
            let (h, x, mix, xn, y) = bufs();
            let (ph, px, pmix, pxn, py) = bufs();
            let run = |be: &dyn Backend, s: Side, bs: [&Pt; 5]| -> rill::Result<()> {
                let [h, x, mix, xn, y] = bs;
                be.embed(table.on(s), ids.on(s), x.on(s))?;
                if fused {
                    let next = AddNorm {
                        acc: h.on(s),
                        w: norm_w.on(s),
                        eps: 1e-6,
                        out: xn.on(s),
                        then: None,
                    };
                    compose::matmul_add_rms_norm(be, w.on(s), x.on(s), mix.on(s), next)?;
                } else {
                    be.matmul(w.on(s), x.on(s), mix.on(s))?;
                    compose::add_rms_norm(be, h.on(s), mix.on(s), norm_w.on(s), 1e-6, xn.on(s))?;
                }
                be.matmul(w2.on(s), xn.on(s), y.on(s))
            };
            let ops = |be: &dyn Backend, s: Side, _: Pos| run(be, s, [&h, &x, &mix, &xn, &y]);
            let key = 0x4e0a_0000 + case as u64;
            let record = Steps::default();
            let steps = 4usize;
            for step in 0..steps {
                let toks: Vec<u32> = (0..t).map(|i| ((step * 3 + i * 2) % vocab) as u32).collect();
                p.step(&record, key, ids, &toks, pos, step, ops);
                let what = format!("{ty} d={d} n_in={n_in} T={t} fused={fused} step {step}");
                if !fused {
                    // (matmul_add_rms_norm's product is scratch.)
                    p.check_tier(&format!("{what} product"), &mix, 2e-3, 1e-4);
                }
                p.check_tier(&format!("{what} residual"), &h, 2e-3, 1e-4);
                p.check_tier(&format!("{what} normed"), &xn, 1e-4, 1e-4);
                p.check_tier(&format!("{what} product of the normed rows"), &y, 2e-3, 1e-4);
                run(p.dev.as_ref(), Side::Dev, [&ph, &px, &pmix, &pxn, &py]).expect("plain device ops");
                for (name, a, b) in [("residual", &h, &ph), ("normed", &xn, &pxn), ("product", &y, &py)] {
                    let (ra, rb) = (
                        p.dev.read_f32(&a.dev).expect("read"),
                        p.dev.read_f32(&b.dev).expect("read"),
                    );
                    assert!(
                        ra.iter().zip(&rb).all(|(u, v)| u.to_bits() == v.to_bits()),
                        "{} {what}: the {name} differs between the recorded step and the plain ops",
                        p.name()
                    );
                }
            }
            p.assert_replayed(&record, steps);
        }
    }
}

/// A block's last product, its residual add and norm, and the next block's first products of the
/// normed rows (`AddNorm::then`, which a backend may compute with the norm in one launch: CUDA's
/// NORM kernel, every block norming the residual row itself), recorded into a step and replayed:
/// tall Q4_K groups whose rows take the NORM kernel (256 to 2048 wide: one or two super-blocks per
/// warp) and groups that take the composition (tall at 4096, four per warp; short Q4_K groups at
/// 512 and 4096; 4352, past the widest; Q4_K_M's Q6_K product beside Q4_K ones; Q8_0 and F32), 1
/// to 3 token rows, the last product on the tensor cores (which adds into the residual itself) or
/// F32. Every step against the CPU, the recorded step bit for bit the same ops run one by one, and
/// the products bit for bit a plain `matmul_group` of the device's own normed rows (the NORM kernel
/// prepares the rows it writes).
#[test]
fn recorded_norm_then_group_matches_cpu() {
    use rill::gguf::GgmlType::{F32, Q4K, Q6K, Q8_0};
    for p in Both::each() {
        let mut rng = Rng::new(59);
        for (case, (last_ty, group, d, t)) in [
            (Q4K, vec![(Q4K, 1024), (Q4K, 32), (Q4K, 64)], 512, 1),
            (Q4K, vec![(Q4K, 8192), (Q4K, 256), (Q4K, 32), (Q4K, 32)], 1024, 3),
            (Q4K, vec![(Q4K, 8192), (Q4K, 4096), (Q4K, 32), (Q4K, 32)], 2048, 1),
            (Q6K, vec![(Q4K, 8192)], 256, 2),
            (Q4K, vec![(Q4K, 8192), (Q4K, 64)], 4096, 1),
            (Q4K, vec![(Q6K, 768), (Q4K, 512), (Q4K, 32), (Q4K, 32)], 1024, 1),
            (Q6K, vec![(Q6K, 512), (Q4K, 256), (Q4K, 256)], 2048, 3),
            (Q4K, vec![(Q4K, 512), (Q4K, 64)], 4096, 1),
            (Q4K, vec![(Q4K, 512), (Q4K, 64)], 4352, 1),
            (Q8_0, vec![(Q8_0, 512), (Q8_0, 32)], 512, 3),
            (F32, vec![(Q4K, 512), (Q4K, 64)], 512, 1),
            (Q4K, vec![(F32, 96), (Q4K, 256)], 512, 1),
        ]
        .into_iter()
        .enumerate()
        {
            let n_in = 256;
            let w = both_weight(&p, &mut rng, last_ty, d, n_in);
            let gw: Vec<Pt> = group
                .iter()
                .map(|&(ty, rows)| both_weight(&p, &mut rng, ty, rows, d))
                .collect();
            let be = BlockEnd::new(&p, &mut rng, n_in, d, t);
            let (vocab, table, norm_w, ids, pos) = (be.vocab, &be.table, &be.norm_w, &be.ids, &be.pos);
            // Two sets of buffers: the recorded steps', and (device only) the plain runs'.
            let bufs = || {
                let [h, x, mix, xn] = be.buffers(&p);
                let ys: Vec<Pt> = group.iter().map(|&(_, rows)| p.zeros(&[t, rows])).collect();
                (h, x, mix, xn, ys)
            };
            let (h, x, mix, xn, ys) = bufs();
            let (ph, px, pmix, pxn, pys) = bufs();
            let run = |be: &dyn Backend, s: Side, bs: (&Pt, &Pt, &Pt, &Pt, &[Pt])| -> rill::Result<()> {
                let (h, x, mix, xn, ys) = bs;
                be.embed(table.on(s), ids.on(s), x.on(s))?;
                let ws: Vec<&Tensor> = gw.iter().map(|w| w.on(s)).collect();
                let outs: Vec<&Tensor> = ys.iter().map(|y| y.on(s)).collect();
                let next = AddNorm {
                    acc: h.on(s),
                    w: norm_w.on(s),
                    eps: 1e-6,
                    out: xn.on(s),
                    then: Some(Group { ws: &ws, outs: &outs }),
                };
                compose::matmul_add_rms_norm(be, w.on(s), x.on(s), mix.on(s), next)
            };
            let ops = |be: &dyn Backend, s: Side, _: Pos| run(be, s, (&h, &x, &mix, &xn, &ys));
            let key = 0x4e0b_0000 + case as u64;
            let record = Steps::default();
            let steps = 3usize;
            for step in 0..steps {
                let toks: Vec<u32> = (0..t).map(|i| ((step * 3 + i * 2) % vocab) as u32).collect();
                p.step(&record, key, ids, &toks, pos, step, ops);
                let what = format!("{last_ty} then {group:?} d={d} T={t} step {step}");
                p.check_tier(&format!("{what} residual"), &h, 2e-3, 1e-4);
                p.check_tier(&format!("{what} normed"), &xn, 1e-4, 1e-4);
                for (i, y) in ys.iter().enumerate() {
                    p.check_tier(&format!("{what} product {i} of the normed rows"), y, 2e-3, 1e-4);
                }
                run(p.dev.as_ref(), Side::Dev, (&ph, &px, &pmix, &pxn, &pys)).expect("plain device ops");
                let bits = |a: &Tensor| p.dev.read_f32(a).expect("read");
                let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(u, v)| u.to_bits() == v.to_bits());
                let pairs = [("residual", &h, &ph), ("normed", &xn, &pxn)];
                for (name, a, b) in pairs
                    .into_iter()
                    .chain(ys.iter().zip(&pys).map(|(a, b)| ("product", a, b)))
                {
                    assert!(
                        same(&bits(&a.dev), &bits(&b.dev)),
                        "{} {what}: the {name} differs between the recorded step and the plain ops",
                        p.name()
                    );
                }
                // The products are those of the normed rows the device wrote: a plain group of them.
                let dev = p.dev.as_ref();
                let ws: Vec<&Tensor> = gw.iter().map(|w| &w.dev).collect();
                let refs: Vec<Tensor> = group
                    .iter()
                    .map(|&(_, rows)| dev.alloc(rill::backend::DType::F32, &[t, rows]).expect("alloc"))
                    .collect();
                let outs: Vec<&Tensor> = refs.iter().collect();
                compose::matmul_group(dev, &ws, &pxn.dev, &outs).expect("plain group");
                for (i, (y, r)) in pys.iter().zip(&refs).enumerate() {
                    assert!(
                        same(&bits(&y.dev), &bits(r)),
                        "{} {what}: product {i} is not the plain group's of the normed rows",
                        p.name()
                    );
                }
            }
            p.assert_replayed(&record, steps);
        }
    }
}

/// A model whose layers take every fused op on the decode path: 512-wide rows (matrix-vector
/// kernels), Q4_K_M's mix (a layer with a Q6_K qkv and one with a Q6_K attn_v beside Q4_K
/// products), and the MoE router with the shared expert's gate. Prefill then decode on each
/// device and on the CPU: every logit row within rel L2 1e-4 of the CPU's.
#[test]
fn decode_with_fused_ops_matches_cpu() {
    use rill::exec::{Logits, Model};
    use rill::synth::{self, SynthOptions};
    for (base, quant) in [("tiny-dense", "q4_k_m"), ("tiny-moe", "q8_0")] {
        let shape = synth::ShapeParams {
            n_embd: 512,
            n_layer: 4,
            n_ff: if base == "tiny-dense" { 512 } else { 0 },
            source: "test",
            ..synth::shape(base).expect("shape")
        };
        let o = SynthOptions {
            shape: base.into(),
            quant: quant.into(),
            layers: None,
            seed: 11,
            tokenizer_from: fixture("tiny-dense.F16.gguf"),
            output: temp_path(&format!("fused-{base}-{quant}.gguf")),
            progress: false,
        };
        synth::synthesize_params(&shape, &o).unwrap_or_else(|e| panic!("{base} {quant}: {e}"));
        let prompt = [17u32, 900, 4711, 3];
        let steps = [55u32, 8000, 1, 77, 1234, 6];
        let run = |be: std::sync::Arc<dyn Backend>| -> Vec<Vec<f32>> {
            let m = Model::open(&o.output, be).expect("model");
            let mut s = m.new_session(16).expect("session");
            let mut rows = vec![m
                .prefill(&mut s, &prompt, Logits::Last, &mut |_, _| {})
                .expect("prefill")];
            for &tok in &steps {
                rows.push(m.decode(&mut s, tok).expect("decode"));
            }
            rows
        };
        let want = run(cpu());
        for dev in device_backends() {
            let name = dev.name();
            let got = run(dev);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = rel_l2(g, w);
                assert!(e <= 1e-4, "{name} {base} {quant} row {i}: rel L2 {e:.2e}");
            }
        }
        let _ = std::fs::remove_file(&o.output);
    }
}
