//! The fused decode ops (`matmul_group`, `gdn_conv_gates`, `attn_qk_prep`) on every device
//! backend against the CPU reference (which runs the separate ops they replace), at the shapes
//! where backends launch them fused (one token, matrix-vector rows) and where they do not; and a
//! model whose layers take them, decoded on each device against the CPU. scripts/test.sh runs
//! this binary again with the wgpu fallbacks a browser gets (`RILL_WGPU_MAX_STORAGE=8`).

mod common;

use common::device::{pos_on, Both, Pt, Side, GDN_ODD, GDN_REAL};
use common::weights::{check_matmul, dequant, random_weight, upload};
use common::*;
use rill::backend::{AttnPrep, Backend, GdnDims, GdnGates, Pos, StepMode};
use rill::gguf::GgmlType;

/// Token counts: decode (the fused kernels), a small batch, and one and two 64-row tiles.
const TS: [usize; 4] = [1, 3, 64, 65];

/// A weight of format `ty` on both backends, with its dequantized values.
fn weight(p: &Both, ty: GgmlType, n_out: usize, n_in: usize, rng: &mut Rng) -> (Pt, Vec<f32>) {
    let bytes = random_weight(ty, n_out, n_in, 0.5, rng);
    let shape = [n_out, n_in];
    let pt = Pt {
        dev: upload(p.dev.as_ref(), ty, &shape, &bytes),
        cpu: upload(p.cpu.as_ref(), ty, &shape, &bytes),
    };
    (pt, dequant(ty, &bytes, n_out * n_in))
}

/// `matmul_group` of the products `(format, rows)` of one input `n_in` wide, for every token
/// count: each output within `matmul`'s tolerance of the CPU's.
fn group_case(p: &Both, n_in: usize, products: &[(GgmlType, usize)], rng: &mut Rng) {
    let ws: Vec<(Pt, Vec<f32>)> = products
        .iter()
        .map(|&(ty, rows)| weight(p, ty, rows, n_in, rng))
        .collect();
    for t in TS {
        let what = format!("{} matmul_group {products:?} n_in {n_in} T {t}", p.name());
        let x = rng.normals(t * n_in, 1.0);
        let xt = p.up(&x, &[t, n_in]);
        // Outputs start as garbage: every element must be written.
        let outs: Vec<Pt> = products
            .iter()
            .map(|&(_, rows)| p.up(&rng.normals(t * rows, 1e3), &[t, rows]))
            .collect();
        p.run(&what, |be, s| {
            let w: Vec<_> = ws.iter().map(|(w, _)| w.on(s)).collect();
            let o: Vec<_> = outs.iter().map(|o| o.on(s)).collect();
            be.matmul_group(&w, xt.on(s), &o)
        });
        for (i, (out, (_, wf))) in outs.iter().zip(&ws).enumerate() {
            let (got, want) = p.read(out);
            check_matmul(
                p.dev.as_ref(),
                &format!("{what} product {i}"),
                &got,
                &want,
                wf,
                &x,
                n_in,
            );
        }
    }
}

#[test]
fn matmul_group_matches_cpu() {
    use GgmlType::*;
    for p in Both::each() {
        let mut rng = Rng::new(91);
        // A Q4_K_M Gated DeltaNet layer (qkv Q6_K in some layers: one product alone, three in a
        // group), one all Q4_K (four in a group; three and one where a kernel binds at most 8
        // buffers), row counts off every workgroup multiple.
        group_case(&p, 768, &[(Q6K, 300), (Q4K, 129), (Q4K, 7), (Q4K, 7)], &mut rng);
        group_case(&p, 512, &[(Q4K, 515), (Q4K, 33), (Q4K, 1), (Q4K, 8)], &mut rng);
        // Attention projections: Q8_0, the floats, a format without its own decoder (Q4_0),
        // groups of two and three, with the odd one out first.
        group_case(&p, 2304, &[(Q8_0, 130), (Q8_0, 33), (Q8_0, 33)], &mut rng);
        group_case(&p, 512, &[(Q5K, 3), (F16, 65), (Bf16, 9), (F16, 2)], &mut rng);
        group_case(&p, 320, &[(Q4_0, 40), (Q4_0, 17)], &mut rng);
        // The MoE router and the shared expert's one-row gate (F32), and F32 rows that are not
        // a multiple of the matrix-vector unit (the generic kernel; no group).
        group_case(&p, 512, &[(F32, 8), (F32, 1)], &mut rng);
        group_case(&p, 300, &[(F32, 8), (F32, 1), (F32, 5)], &mut rng);
        // Rows short enough for one invocation per row (no group), and a group of one.
        group_case(&p, 64, &[(F32, 24), (Q8_0, 3)], &mut rng);
        group_case(&p, 1024, &[(Q4K, 77)], &mut rng);
    }
}

#[test]
fn matmul_group_contract_errors() {
    for p in Both::each() {
        let mut rng = Rng::new(92);
        let (w, _) = weight(&p, GgmlType::Q4K, 8, 256, &mut rng);
        let x = p.up(&rng.normals(256, 1.0), &[1, 256]);
        let (o1, o2) = (p.zeros(&[1, 8]), p.zeros(&[1, 7]));
        for s in [Side::Dev, Side::Cpu] {
            let be = p.be(s);
            let (w, x, o1, o2) = (w.on(s), x.on(s), o1.on(s), o2.on(s));
            let name = be.name();
            assert!(be.matmul_group(&[], x, &[]).is_err(), "{name}: empty group");
            assert!(be.matmul_group(&[w, w], x, &[o1]).is_err(), "{name}: counts differ");
            assert!(be.matmul_group(&[w; 5], x, &[o1; 5]).is_err(), "{name}: five products");
            assert!(
                be.matmul_group(&[w, w], x, &[o1, o1]).is_err(),
                "{name}: aliased outputs"
            );
            assert!(be.matmul_group(&[w, w], x, &[o1, o2]).is_err(), "{name}: output shape");
        }
    }
}

/// Many value heads: several workgroups of gates.
const GDN_WIDE: GdnDims = GdnDims {
    hk: 2,
    hv: 34,
    dk: 16,
    dv: 8,
};

/// `gdn_conv_gates` over a prefill and decode steps (the conv state carries): the conv output
/// within `conv1d_silu_l2qk`'s error model, the state exact, the gates within `gdn_gates`'.
#[test]
fn gdn_conv_gates_matches_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(93);
        for (dims, k) in [(GDN_REAL, 4usize), (GDN_ODD, 4), (GDN_ODD, 1), (GDN_WIDE, 3)] {
            let (cd, hv) = (dims.conv_dim(), dims.hv);
            let w = p.up(&rng.normals(cd * k, 0.5), &[cd, k]);
            let state = p.up(&rng.normals((k - 1) * cd, 1.0), &[k - 1, cd]);
            let ssm_a: Vec<f32> = (0..hv).map(|_| -rng.uniform() as f32 * 8.0 - 0.01).collect();
            let (ssm_a, dt_bias) = (p.up(&ssm_a, &[hv]), p.up(&rng.normals(hv, 1.0), &[hv]));
            for t in [1usize, 3, 64, 65, 1, 1] {
                let what = format!("gdn_conv_gates t={t} k={k} {dims:?}");
                let x = p.up(&rng.normals(t * cd, 1.0), &[t, cd]);
                // Gate inputs across softplus's branches (e^-|x| tiny, small, and past the x > 20
                // switch).
                let (a, b) = (rng.normals(t * hv, 12.0), rng.normals(t * hv, 4.0));
                let (a, b) = (p.up(&a, &[t, hv]), p.up(&b, &[t, hv]));
                let (out, g, beta) = (
                    p.up(&rng.normals(t * cd, 1e3), &[t, cd]),
                    p.up(&rng.normals(t * hv, 1e3), &[t, hv]),
                    p.up(&rng.normals(t * hv, 1e3), &[t, hv]),
                );
                p.run(&what, |be, s| {
                    let gates = GdnGates {
                        a: a.on(s),
                        b: b.on(s),
                        ssm_a: ssm_a.on(s),
                        dt_bias: dt_bias.on(s),
                        g: g.on(s),
                        beta: beta.on(s),
                    };
                    be.gdn_conv_gates(x.on(s), w.on(s), state.on(s), out.on(s), dims, 1e-6, gates)
                });
                p.check(&format!("{what} state"), &state, 0.0, 0.0);
                p.check(&format!("{what} g"), &g, 1e-30, 1e-5);
                p.check(&format!("{what} beta"), &beta, 1e-7, 1e-5);
                p.check_conv_l2qk(&what, &out, dims, t);
            }
        }
    }
}

/// One attention layer's shapes: (query heads, kv heads, head dim, rotated dims).
type Heads = (usize, usize, usize, usize);

/// The tensors of one `attn_qk_prep` call on both backends.
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
}

impl Prep {
    fn new(p: &Both, (nh, nkv, d, _): Heads, t: usize, rng: &mut Rng) -> Prep {
        let (qw, kw) = (nh * d, nkv * d);
        Prep {
            qg: p.up(&rng.normals(t * 2 * qw, 1.0), &[t, 2 * qw]),
            k: p.up(&rng.normals(t * kw, 1.0), &[t, kw]),
            v: p.up(&rng.normals(t * kw, 1.0), &[t, kw]),
            q_norm: p.up(&rng.normals(d, 1.0), &[d]),
            k_norm: p.up(&rng.normals(d, 1.0), &[d]),
            q: p.zeros(&[t, qw]),
            gate: p.up(&rng.normals(t * qw, 1e3), &[t, qw]),
            q_normed: p.up(&rng.normals(t * qw, 1e3), &[t, qw]),
            k_normed: p.up(&rng.normals(t * kw, 1e3), &[t, kw]),
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
}

/// Normalised and rotated heads `[rows, width]` (row r at position pos0 + r, heads of d values)
/// against the CPU's: the RMSNorm's 1e-6 + 1e-5 relative per value, mixed by the rotation into
/// 2e-5 of the pair's norm |(a, b)|, plus RoPE's f32 angle error (tests/device_ops.rs
/// rope_neox_matches: 2e-6 of the norm and 4 * pos * 2^-24 of it).
fn check_rotated(what: &str, got: &[f32], want: &[f32], width: usize, d: usize, n_rot: usize, pos0: usize) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (row, j) = (i / width, i % width % d);
        let mate = if j >= n_rot {
            i
        } else if j < n_rot / 2 {
            i + n_rot / 2
        } else {
            i - n_rot / 2
        };
        let norm = (w * w + want[mate] * want[mate]).sqrt();
        let pos = (pos0 + row) as f32;
        let tol = 2e-6 + (2.2e-5 + 4.0 * pos / (1u32 << 24) as f32) * norm;
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}] (row {row}, element {j}): {g} vs {w} (tol {tol})"
        );
    }
}

/// One `attn_qk_prep` at `pos` into caches of `ctx` rows holding old values, checked against
/// the CPU: the gate exact, q and k within `check_rotated`, the cache rows pos..pos+T the
/// device's own k_normed and v bit for bit and no other row touched.
fn prep_case(p: &Both, heads: Heads, theta: f32, t: usize, pos: usize, ctx: usize, rng: &mut Rng) {
    let (nh, nkv, d, n_rot) = heads;
    let kw = nkv * d;
    let what = format!(
        "{} attn_qk_prep heads {heads:?} theta {theta} T {t} pos {pos}",
        p.name()
    );
    let a = Prep::new(p, heads, t, rng);
    let (k0, v0) = (rng.normals(ctx * kw, 1.0), rng.normals(ctx * kw, 1.0));
    let (kc, vc) = (p.up(&k0, &[ctx, kw]), p.up(&v0, &[ctx, kw]));
    let pt = p.pos(pos);
    p.run(&what, |be, s| {
        be.attn_qk_prep(a.on(s), d, n_rot, theta, 1e-6, kc.on(s), vc.on(s), pos_on(pos, &pt, s))
    });
    p.check(&format!("{what} gate"), &a.gate, 0.0, 0.0);
    let (gq, wq) = p.read(&a.q_normed);
    check_rotated(&format!("{what} q"), &gq, &wq, nh * d, d, n_rot, pos);
    let (gk, wk) = p.read(&a.k_normed);
    check_rotated(&format!("{what} k"), &gk, &wk, kw, d, n_rot, pos);
    let (v, _) = p.read(&a.v);
    for (name, cache, old, new) in [("k", &kc, &k0, &gk), ("v", &vc, &v0, &v)] {
        let mut want = old.clone();
        want[pos * kw..(pos + t) * kw].copy_from_slice(new);
        let (got, _) = p.read(cache);
        assert!(got == want, "{what}: {name} cache");
    }
}

#[test]
fn attn_qk_prep_matches_cpu() {
    for p in Both::each() {
        let mut rng = Rng::new(94);
        // Qwen3.5's full attention (GQA 4 at head dim 256, 64 rotated dims), full rotation with
        // GQA 3, MHA without rotation, a head dim that is no power of two, a head of one pair.
        let heads: [Heads; 5] = [
            (8, 2, 256, 64),
            (6, 2, 128, 128),
            (3, 3, 64, 0),
            (5, 1, 40, 16),
            (2, 1, 2, 2),
        ];
        for h in heads {
            for theta in [10_000.0f32, 10_000_000.0] {
                for t in TS {
                    for (pos, spare) in [(0usize, 0usize), (7, 3), (1000, 1)] {
                        prep_case(&p, h, theta, t, pos, pos + t + spare, &mut rng);
                    }
                }
            }
        }
        // Past the largest head dim the fused kernels take: the separate ops.
        prep_case(&p, (2, 1, 512, 64), 1e4, 1, 3, 5, &mut rng);
    }
}

/// `attn_qk_prep` in a recorded step replayed at later positions (read from the device tensor):
/// every step equals the CPU at that position.
#[test]
fn attn_qk_prep_replays_at_new_positions() {
    for p in Both::each() {
        let mut rng = Rng::new(95);
        let heads: Heads = (4, 2, 64, 32);
        let (d, kw, ctx) = (heads.2, heads.1 * heads.2, 6usize);
        let a = Prep::new(&p, heads, 1, &mut rng);
        let (kc, vc, pos) = (p.zeros(&[ctx, kw]), p.zeros(&[ctx, kw]), p.zeros_u32(&[1]));
        let key = 0x9f0e;
        for step in 0..ctx {
            p.run("attn_qk_prep step", |be, s| {
                be.write_u32(pos.on(s), &[step as u32])?;
                let mode = be.step_begin(key)?;
                let at = Pos {
                    host: step,
                    dev: pos.on(s),
                };
                let r = if mode == StepMode::Replayed {
                    Ok(())
                } else {
                    be.attn_qk_prep(a.on(s), d, heads.3, 1e6, 1e-6, kc.on(s), vc.on(s), at)
                };
                be.step_end(key, r.is_ok())?;
                r
            });
            let (gq, wq) = p.read(&a.q_normed);
            check_rotated(
                &format!("{} step {step} q", p.name()),
                &gq,
                &wq,
                heads.0 * d,
                d,
                heads.3,
                step,
            );
            let (gk, wk) = p.read(&kc);
            check_rotated(
                &format!("{} step {step} k cache", p.name()),
                &gk,
                &wk,
                kw,
                d,
                heads.3,
                0,
            );
            p.check(&format!("step {step} v cache"), &vc, 0.0, 0.0);
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
