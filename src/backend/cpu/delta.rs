//! The gated delta rule (spec/DELTANET.md): token-by-token recurrence (A.2) and the chunked
//! algorithm (B.4), both on the value-major state `M = Sᵀ` `[Hv, dv, dk]`.
//!
//! In `M`, row `c` (a value index) is contiguous over the key index `i`, and every row evolves
//! independently given the broadcast vectors `k`, `q` and the scalars `g`, `β`, `v[c]`. Both
//! algorithms below are written row by row in exactly that form ("row-owned"); no code here
//! ever reduces over a column of `M` (the column-owned bug of DELTANET.md A.4).
//!
//! Value heads are independent, so both run in parallel over value heads.

use rayon::prelude::*;

use super::{axpy, dot, read_f32s, write_f32s};
use crate::backend::{check, GdnDims, Tensor};
use crate::error::Result;

/// Chunk length of the chunked algorithm.
pub(crate) const CHUNK: usize = 64;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Algo {
    Recurrent,
    Chunked,
}

/// Per-head read-only view of the inputs for value head `j`.
struct HeadInputs<'a> {
    u: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    dims: GdnDims,
    /// Value head.
    j: usize,
    t_len: usize,
}

impl HeadInputs<'_> {
    /// Key head of value head j: the tiled ("j mod Hk") rule of the qwen35 GGUFs.
    fn kh(&self) -> usize {
        self.j % self.dims.hk
    }
    fn row(&self, t: usize) -> &[f32] {
        let cd = self.dims.conv_dim();
        &self.u[t * cd..(t + 1) * cd]
    }
    fn q(&self, t: usize) -> &[f32] {
        let (dk, kh) = (self.dims.dk, self.kh());
        &self.row(t)[kh * dk..(kh + 1) * dk]
    }
    fn k(&self, t: usize) -> &[f32] {
        let (dk, kh, kd) = (self.dims.dk, self.kh(), self.dims.key_dim());
        &self.row(t)[kd + kh * dk..kd + (kh + 1) * dk]
    }
    fn v(&self, t: usize) -> &[f32] {
        let (dv, kd) = (self.dims.dv, self.dims.key_dim());
        &self.row(t)[2 * kd + self.j * dv..2 * kd + (self.j + 1) * dv]
    }
    fn g(&self, t: usize) -> f32 {
        self.g[t * self.dims.hv + self.j]
    }
    fn beta(&self, t: usize) -> f32 {
        self.beta[t * self.dims.hv + self.j]
    }
}

pub(crate) fn delta_rule(
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    algo: Algo,
) -> Result<()> {
    let op = match algo {
        Algo::Recurrent => "delta_rule_recurrent",
        Algo::Chunked => "delta_rule_chunked",
    };
    let t_len = check::delta_rule(op, u, g, beta, state, out, dims)?;
    let GdnDims { hv, dk, dv, .. } = dims;

    let us = read_f32s(u, op)?;
    let gs = read_f32s(g, op)?;
    let bs = read_f32s(beta, op)?;
    let mut st = write_f32s(state, op)?;
    let mut os = write_f32s(out, op)?;

    // Each head writes its outputs to a private [T, dv] buffer; they are interleaved into
    // out [T, Hv*dv] afterwards (out rows are shared by all heads).
    let head_outs: Vec<Vec<f32>> = st
        .par_chunks_mut(dv * dk)
        .enumerate()
        .map(|(j, m)| {
            let inp = HeadInputs {
                u: &us,
                g: &gs,
                beta: &bs,
                dims,
                j,
                t_len,
            };
            let mut o = vec![0f32; t_len * dv];
            match algo {
                Algo::Recurrent => recurrent_head(&inp, m, &mut o),
                Algo::Chunked => chunked_head(&inp, m, &mut o),
            }
            o
        })
        .collect();
    let hvd = hv * dv;
    for (j, o) in head_outs.iter().enumerate() {
        for t in 0..t_len {
            os[t * hvd + j * dv..t * hvd + (j + 1) * dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
    Ok(())
}

/// Spec A.2, one value head, row-owned. `m` is `[dv][dk]`, `o` is `[T][dv]`.
fn recurrent_head(inp: &HeadInputs<'_>, m: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (inp.dims.dk, inp.dims.dv);
    for t in 0..inp.t_len {
        let (q, k, v) = (inp.q(t), inp.k(t), inp.v(t));
        let decay = inp.g(t).exp();
        let b = inp.beta(t);
        let ot = &mut o[t * dv..(t + 1) * dv];
        for (c, row) in m.chunks_exact_mut(dk).enumerate() {
            // What the (decayed) memory predicts for this key, value index c.
            let pred = decay * dot(row, k);
            let delta = b * (v[c] - pred);
            for (mi, ki) in row.iter_mut().zip(k) {
                *mi = decay * *mi + delta * ki;
            }
            ot[c] = dot(row, q);
        }
    }
}

/// Spec B.4 with C = 64, one value head. `m` is the value-major state `[dv][dk]`, `o` `[T][dv]`.
///
/// The last chunk is processed with its true length L < C instead of zero padding: padded tokens
/// (q = k = v = 0, g = 0, β = 0) have A, P and B rows of zero, leave γ at γ_{L-1}, and contribute
/// nothing to the state update, so dropping them gives exactly the padded result.
fn chunked_head(inp: &HeadInputs<'_>, m: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (inp.dims.dk, inp.dims.dv);
    // Per-chunk scratch, reused across chunks.
    let mut gam = vec![0f64; CHUNK];
    let mut eg = vec![0f32; CHUNK]; // e^{γ_r}
    let mut a = vec![0f32; CHUNK * CHUNK]; // A[r][s], strictly lower
    let mut p = vec![0f32; CHUNK * CHUNK]; // P[r][s], lower incl. diagonal
    let mut uu = vec![0f32; CHUNK * dv]; // U rows (then solved in place)
    let mut ww = vec![0f32; CHUNK * dk]; // W rows (then solved in place)
    let mut kd = vec![0f32; CHUNK * dk]; // k_r * e^{γ_last − γ_r}
    let mut vn = vec![0f32; CHUNK]; // V_new column for one value index c

    let mut t0 = 0;
    while t0 < inp.t_len {
        let l = CHUNK.min(inp.t_len - t0);

        // γ: inclusive cumulative sum of g, restarted at each chunk. Kept in f64: with g of
        // order -10..-100, γ reaches -1000s within a chunk and an f32 difference γ_r − γ_s
        // would lose ~1e-4 absolute to cancellation, i.e. 1e-4 relative error in every decay.
        let mut acc = 0f64;
        for r in 0..l {
            acc += inp.g(t0 + r) as f64;
            gam[r] = acc;
            eg[r] = acc.exp() as f32;
        }
        let g_last = gam[l - 1];

        // A and P. exp is only evaluated for s <= r, where γ_r − γ_s <= 0 (g <= 0): never
        // exp of a large positive number, and the decay is never factored into e^{γ_r}·e^{−γ_s}.
        for r in 0..l {
            let (qr, kr, br) = (inp.q(t0 + r), inp.k(t0 + r), inp.beta(t0 + r));
            for s in 0..=r {
                let dec = (gam[r] - gam[s]).exp() as f32;
                let ks = inp.k(t0 + s);
                a[r * CHUNK + s] = if s < r { br * dot(kr, ks) * dec } else { 0.0 };
                p[r * CHUNK + s] = dot(qr, ks) * dec;
            }
        }

        // Right-hand sides: U_r = β_r v_r, W_r = β_r e^{γ_r} k_r.
        for r in 0..l {
            let br = inp.beta(t0 + r);
            let bw = br * eg[r];
            for (x, v) in uu[r * dv..(r + 1) * dv].iter_mut().zip(inp.v(t0 + r)) {
                *x = br * v;
            }
            for (x, k) in ww[r * dk..(r + 1) * dk].iter_mut().zip(inp.k(t0 + r)) {
                *x = bw * k;
            }
        }

        // Forward substitution for (I + A) X = B, row by row: X_r = B_r − Σ_{s<r} A[r][s] X_s.
        for r in 1..l {
            let (done_u, rest_u) = uu.split_at_mut(r * dv);
            let (done_w, rest_w) = ww.split_at_mut(r * dk);
            let (ur, wr) = (&mut rest_u[..dv], &mut rest_w[..dk]);
            for s in 0..r {
                let ars = a[r * CHUNK + s];
                axpy(-ars, &done_u[s * dv..(s + 1) * dv], ur);
                axpy(-ars, &done_w[s * dk..(s + 1) * dk], wr);
            }
        }

        // Keys for the state update, decayed to the end of the chunk: k_r · e^{γ_last − γ_r}.
        for r in 0..l {
            let f = (g_last - gam[r]).exp() as f32;
            for (x, k) in kd[r * dk..(r + 1) * dk].iter_mut().zip(inp.k(t0 + r)) {
                *x = f * k;
            }
        }

        // B.3 in the value-major layout, one state row c at a time (rows are independent):
        //   vn[r]   = U[r][c] − W_r · M_c                       (true δ_r[c] of this chunk)
        //   O[r][c] = e^{γ_r} (q_r · M_c) + Σ_{s<=r} P[r][s] vn[s]   (M_c of the chunk start)
        //   M_c     ← e^{γ_last} M_c + Σ_r vn[r] · kd_r
        let e_last = g_last.exp() as f32;
        for (c, mc) in m.chunks_exact_mut(dk).enumerate() {
            for r in 0..l {
                vn[r] = uu[r * dv + c] - dot(&ww[r * dk..(r + 1) * dk], mc);
            }
            for r in 0..l {
                let inter = eg[r] * dot(inp.q(t0 + r), mc);
                let intra = dot(&p[r * CHUNK..r * CHUNK + r + 1], &vn[..r + 1]);
                o[(t0 + r) * dv + c] = inter + intra;
            }
            mc.iter_mut().for_each(|x| *x *= e_last);
            for r in 0..l {
                axpy(vn[r], &kd[r * dk..(r + 1) * dk], mc);
            }
        }
        t0 += l;
    }
}
