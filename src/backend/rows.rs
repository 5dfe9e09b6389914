//! Steps whose rows belong to different sequences (DESIGN.md "Many sequences in one step").
//!
//! A decode step of B sequences has one row per sequence. Products, norms and MoE are row-wise
//! and take such a step as they take a prefill batch; the ops that read or write a sequence's
//! state (conv1d, the delta rule, RoPE, the KV cache, attention) take the rows' `(slot, pos)`:
//! the row's state lives in slot `slot` of a state pool, and its token is at position `pos`.
//!
//! Pool layouts (`S` slots; every slot's part is contiguous):
//! - conv state `[S * (K-1), C]`: slot `s` is rows `s*(K-1) ..`, oldest first;
//! - delta state `[S * Hv * dv, dk]`: slot `s`, value head `h` starts at row `(s*Hv + h) * dv`;
//! - KV caches `[S * ctx, W]`: slot `s`, position `p` is row `s*ctx + p`.
//!
//! This file holds the rows' type, the ops' rules (checked the same way on every backend) and
//! the ops composed from the one-sequence ops, row by row: that is what a backend without its
//! own kernel runs (the CPU reference among them), and what the kernels are tested against.

use std::collections::HashSet;

use super::check::{self, dtype, f32_in, f32s, no_alias, numel};
use super::{shape_err, AttnDims, Backend, DType, GdnDims, Pos, Tensor};
use crate::error::Result;

/// One row of a step: its sequence's slot in the pool and its token's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRow {
    pub slot: u32,
    pub pos: u32,
}

/// The rows of a step, on the host and on the device: `dev` is a U32 tensor `[B, 2]` holding
/// `(slot, pos)` per row, rewritten before every step, so a recorded step (a CUDA graph) stays
/// valid when the rows change and only their number is fixed.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub host: &'a [SeqRow],
    pub dev: &'a Tensor,
}

impl Rows<'_> {
    pub fn len(&self) -> usize {
        self.host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.host.is_empty()
    }
}

/// Every row's slot below `n_slots` and position below `ctx`, no slot twice (two rows of one
/// sequence in one decode step would race on its state), `dev` shaped `[B, 2]`, `b` rows.
fn rows(op: &str, r: Rows, b: usize, n_slots: usize, ctx: usize) -> Result<()> {
    dtype(op, "rows", r.dev, DType::U32)?;
    if r.dev.shape != [r.len(), 2] || r.len() != b || b == 0 {
        return Err(shape_err(
            op,
            format!("{} rows (device {:?}) for a step of {b}", r.len(), r.dev.shape),
        ));
    }
    let mut seen = HashSet::with_capacity(b);
    for (i, row) in r.host.iter().enumerate() {
        if row.slot as usize >= n_slots || row.pos as usize >= ctx {
            return Err(shape_err(
                op,
                format!("row {i} {row:?} outside {n_slots} slots of {ctx} positions"),
            ));
        }
        if !seen.insert(row.slot) {
            return Err(shape_err(op, format!("slot {} appears in two rows", row.slot)));
        }
    }
    Ok(())
}

/// `conv1d_silu_rows`; returns `(C, K)`.
pub fn check_conv1d(x: &Tensor, w: &Tensor, states: &Tensor, r: Rows, out: &Tensor) -> Result<(usize, usize)> {
    let op = "conv1d_silu_rows";
    f32s(op, &[("x", x), ("states", states), ("out", out)])?;
    f32_in(op, "w", w)?;
    let (b, c, k) = (x.rows(), x.cols(), w.cols());
    if k < 2 || w.rows() != c || states.cols() != c || states.shape.len() != 2 {
        return Err(shape_err(
            op,
            format!("x {:?}, w {:?}, states {:?}", x.shape, w.shape, states.shape),
        ));
    }
    if !states.rows().is_multiple_of(k - 1) {
        return Err(shape_err(
            op,
            format!("states {:?} is not whole slots of {}", states.shape, k - 1),
        ));
    }
    numel(op, "out", out, b * c)?;
    rows(op, r, b, states.rows() / (k - 1), usize::MAX)?;
    no_alias(op, &[states, out], &[x, w, r.dev])?;
    Ok((c, k))
}

/// `delta_rule_rows`.
#[allow(clippy::too_many_arguments)]
pub fn check_delta_rule(
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    states: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    r: Rows,
) -> Result<()> {
    let op = "delta_rule_rows";
    f32s(
        op,
        &[("u", u), ("g", g), ("beta", beta), ("states", states), ("out", out)],
    )?;
    let GdnDims { hk, hv, dk, dv } = dims;
    if hk == 0 || hv == 0 || dk == 0 || dv == 0 || !hv.is_multiple_of(hk) || u.cols() != dims.conv_dim() {
        return Err(shape_err(op, format!("u {:?} with dims {dims:?}", u.shape)));
    }
    let per_slot = hv * dv;
    if states.shape.len() != 2 || states.cols() != dk || !states.rows().is_multiple_of(per_slot) {
        return Err(shape_err(
            op,
            format!("states {:?} is not whole slots of [{per_slot}, {dk}]", states.shape),
        ));
    }
    let b = u.rows();
    numel(op, "g", g, b * hv)?;
    numel(op, "beta", beta, b * hv)?;
    numel(op, "out", out, b * hv * dv)?;
    rows(op, r, b, states.rows() / per_slot, usize::MAX)?;
    no_alias(op, &[states, out], &[u, g, beta, r.dev])
}

/// `rope_neox_rows`.
pub fn check_rope(x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, r: Rows) -> Result<()> {
    let op = "rope_neox_rows";
    check::rope_heads(op, x, head_dim, n_rot, theta)?;
    rows(op, r, x.rows(), usize::MAX, usize::MAX)?;
    no_alias(op, &[x], &[r.dev])
}

/// `kv_store_rows`: k, v `[B, W]` into pools `[S * ctx, W]`.
pub fn check_kv_store(k: &Tensor, v: &Tensor, k_pool: &Tensor, v_pool: &Tensor, ctx: usize, r: Rows) -> Result<()> {
    let op = "kv_store_rows";
    f32s(op, &[("k", k), ("v", v), ("k_pool", k_pool), ("v_pool", v_pool)])?;
    pools(op, k.cols(), k_pool, v_pool, ctx)?;
    if v.shape != k.shape {
        return Err(shape_err(op, format!("k {:?} and v {:?} differ", k.shape, v.shape)));
    }
    rows(op, r, k.rows(), k_pool.rows() / ctx, ctx)?;
    no_alias(op, &[k_pool, v_pool], &[k, v, r.dev])
}

/// Pools `[S * ctx, w]`: whole slots of `ctx` rows.
fn pools(op: &str, w: usize, k_pool: &Tensor, v_pool: &Tensor, ctx: usize) -> Result<()> {
    let ok = |p: &Tensor| p.shape.len() == 2 && p.cols() == w && ctx > 0 && p.rows().is_multiple_of(ctx);
    if !ok(k_pool) || !ok(v_pool) || k_pool.shape != v_pool.shape {
        return Err(shape_err(
            op,
            format!(
                "pools {:?} / {:?} are not slots of {ctx} rows of {w}",
                k_pool.shape, v_pool.shape
            ),
        ));
    }
    Ok(())
}

/// `attention_rows`: q `[B, H*D]`, pools `[S * ctx, Hkv*D]`, out `[B, H*D]`.
#[allow(clippy::too_many_arguments)]
pub fn check_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    ctx: usize,
    r: Rows,
    dims: AttnDims,
    out: &Tensor,
) -> Result<()> {
    let op = "attention_rows";
    f32s(op, &[("q", q), ("k_pool", k_pool), ("v_pool", v_pool), ("out", out)])?;
    let AttnDims {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: d,
    } = dims;
    if nh == 0 || nkv == 0 || d == 0 || !nh.is_multiple_of(nkv) || q.cols() != nh * d {
        return Err(shape_err(op, format!("q {:?} with {dims:?}", q.shape)));
    }
    pools(op, nkv * d, k_pool, v_pool, ctx)?;
    numel(op, "out", out, q.rows() * nh * d)?;
    rows(op, r, q.rows(), k_pool.rows() / ctx, ctx)?;
    no_alias(op, &[out], &[q, k_pool, v_pool, r.dev])
}

// ---- the ops composed row by row from the one-sequence ops ----------------------------------------

/// Row `r` of `t` `[B, C]` into a fresh `[1, C]`.
fn row_of<B: Backend + ?Sized>(be: &B, t: &Tensor, r: usize) -> Result<Tensor> {
    let one = be.alloc(DType::F32, &[1, t.cols()])?;
    be.copy_rows(t, r, &one, 0, 1)?;
    Ok(one)
}

/// `out[r] = conv1d_causal_silu(x[r])` with slot `rows[r].slot`'s state.
pub fn conv1d_silu<B: Backend + ?Sized>(
    be: &B,
    x: &Tensor,
    w: &Tensor,
    states: &Tensor,
    r: Rows,
    out: &Tensor,
) -> Result<()> {
    let (c, k) = check_conv1d(x, w, states, r, out)?;
    let state = be.alloc(DType::F32, &[k - 1, c])?;
    let y = be.alloc(DType::F32, &[1, c])?;
    for (i, row) in r.host.iter().enumerate() {
        let at = row.slot as usize * (k - 1);
        be.copy_rows(states, at, &state, 0, k - 1)?;
        be.conv1d_causal_silu(&row_of(be, x, i)?, w, &state, &y)?;
        be.copy_rows(&state, 0, states, at, k - 1)?;
        be.copy_rows(&y, 0, out, i, 1)?;
    }
    Ok(())
}

/// The recurrent delta rule of each row's one token on its slot's state.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule<B: Backend + ?Sized>(
    be: &B,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    states: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    r: Rows,
) -> Result<()> {
    check_delta_rule(u, g, beta, states, out, dims, r)?;
    let n = dims.hv * dims.dv;
    let flat = be.alloc(DType::F32, &[n, dims.dk])?;
    let state = flat.reshaped(&[dims.hv, dims.dv, dims.dk])?;
    let o = be.alloc(DType::F32, &[1, n])?;
    let (g2, b2) = (g.reshaped(&[u.rows(), dims.hv])?, beta.reshaped(&[u.rows(), dims.hv])?);
    let out2 = out.reshaped(&[u.rows(), n])?;
    for (i, row) in r.host.iter().enumerate() {
        let at = row.slot as usize * n;
        be.copy_rows(states, at, &flat, 0, n)?;
        let (ui, gi, bi) = (row_of(be, u, i)?, row_of(be, &g2, i)?, row_of(be, &b2, i)?);
        be.delta_rule_recurrent(&ui, &gi, &bi, &state, &o, dims)?;
        be.copy_rows(&flat, 0, states, at, n)?;
        be.copy_rows(&o, 0, &out2, i, 1)?;
    }
    Ok(())
}

/// RoPE of each row at its own position.
pub fn rope_neox<B: Backend + ?Sized>(
    be: &B,
    x: &Tensor,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    r: Rows,
) -> Result<()> {
    check_rope(x, head_dim, n_rot, theta, r)?;
    for (i, row) in r.host.iter().enumerate() {
        let xi = row_of(be, x, i)?;
        let dev = be.upload_u32(&[row.pos], &[1])?;
        let pos = Pos {
            host: row.pos as usize,
            dev: &dev,
        };
        be.rope_neox(&xi, head_dim, n_rot, theta, pos)?;
        be.copy_rows(&xi, 0, x, i, 1)?;
    }
    Ok(())
}

/// Row `r`'s k and v at its slot's position.
pub fn kv_store<B: Backend + ?Sized>(
    be: &B,
    k: &Tensor,
    v: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    ctx: usize,
    r: Rows,
) -> Result<()> {
    check_kv_store(k, v, k_pool, v_pool, ctx, r)?;
    for (i, row) in r.host.iter().enumerate() {
        let at = row.slot as usize * ctx + row.pos as usize;
        be.copy_rows(k, i, k_pool, at, 1)?;
        be.copy_rows(v, i, v_pool, at, 1)?;
    }
    Ok(())
}

/// Each row's query against its slot's cache rows `0..=pos`.
#[allow(clippy::too_many_arguments)]
pub fn attention<B: Backend + ?Sized>(
    be: &B,
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    ctx: usize,
    r: Rows,
    dims: AttnDims,
    scale: f32,
    out: &Tensor,
) -> Result<()> {
    check_attention(q, k_pool, v_pool, ctx, r, dims, out)?;
    let w = k_pool.cols();
    let o = be.alloc(DType::F32, &[1, out.cols()])?;
    for (i, row) in r.host.iter().enumerate() {
        let (len, at) = (row.pos as usize + 1, row.slot as usize * ctx);
        let (kc, vc) = (be.alloc(DType::F32, &[len, w])?, be.alloc(DType::F32, &[len, w])?);
        be.copy_rows(k_pool, at, &kc, 0, len)?;
        be.copy_rows(v_pool, at, &vc, 0, len)?;
        let dev = be.upload_u32(&[row.pos], &[1])?;
        let pos = Pos {
            host: row.pos as usize,
            dev: &dev,
        };
        be.attention(&row_of(be, q, i)?, &kc, &vc, pos, dims, scale, &o)?;
        be.copy_rows(&o, 0, out, i, 1)?;
    }
    Ok(())
}
