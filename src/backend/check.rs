//! The op contract's rules, written once: every backend calls the function of an op before its
//! kernel, so dtypes, shapes and aliasing are checked the same way everywhere and a new backend adds
//! kernels, not another copy of the rules. Each function returns the dimensions the kernels need.
//!
//! What is checked here is what the contract (`Backend`'s doc comments) promises. Limits of one
//! backend's kernels (a largest head dim, 32-bit shader indices) stay in that backend, written with
//! the small helpers at the end of this file.

use crate::backend::{shape_err, AttnDims, DType, GdnDims, Pos, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

// ---- operand rules ----------------------------------------------------------------------------

/// `t` must have dtype `want`.
pub fn dtype(op: &str, name: &str, t: &Tensor, want: DType) -> Result<()> {
    if t.dtype != want {
        return Err(shape_err(op, format!("{name} must be {want:?}, got {:?}", t.dtype)));
    }
    Ok(())
}

/// Every named tensor must be F32.
pub fn f32s(op: &str, ts: &[(&str, &Tensor)]) -> Result<()> {
    ts.iter().try_for_each(|(name, t)| dtype(op, name, t, DType::F32))
}

/// A small read-only F32 operand (norm weights, conv taps, `ssm_a`): F32, or a weight uploaded
/// from a GGUF F32 tensor, which has the same bytes. (The model loader converts small tensors
/// of other types to f32 on the host.)
pub fn f32_in(op: &str, name: &str, t: &Tensor) -> Result<()> {
    match t.dtype {
        DType::F32 | DType::Ggml(GgmlType::F32) => Ok(()),
        d => Err(shape_err(op, format!("{name} must be F32, got {d:?}"))),
    }
}

/// A matrix operand of `matmul`/`embed`/`moe_experts`: a weight in a GGUF format, or F32.
pub fn weight(op: &str, name: &str, t: &Tensor) -> Result<()> {
    match t.dtype {
        DType::U32 => Err(shape_err(op, format!("{name} must be a weight or F32, got U32"))),
        _ => Ok(()),
    }
}

/// `t` must hold exactly `want` elements.
pub fn numel(op: &str, name: &str, t: &Tensor, want: usize) -> Result<()> {
    if t.numel() != want {
        return Err(shape_err(
            op,
            format!("{name} {:?} has {} elements, expected {want}", t.shape, t.numel()),
        ));
    }
    Ok(())
}

/// No output may share its buffer with another output or with an input (a GPU cannot bind one
/// buffer read-only and read-write at once; the CPU backend would deadlock on its locks).
pub fn no_alias(op: &str, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<()> {
    for (i, o) in outputs.iter().enumerate() {
        if outputs[i + 1..].iter().chain(inputs).any(|t| o.same_buffer(t)) {
            return Err(shape_err(op, "an output shares its buffer with another operand"));
        }
    }
    Ok(())
}

/// The position tensor of a `Pos`: U32 `[1]`.
fn pos(op: &str, p: Pos) -> Result<()> {
    dtype(op, "pos", p.dev, DType::U32)?;
    numel(op, "pos", p.dev, 1)
}

/// Group size `w.len()` of a norm; `x` must be a whole number of groups.
fn groups(op: &str, x: &Tensor, w: &Tensor) -> Result<usize> {
    let d = w.numel();
    if d == 0 || !x.numel().is_multiple_of(d) {
        return Err(shape_err(
            op,
            format!("x {:?} is not a whole number of groups of w {:?}", x.shape, w.shape),
        ));
    }
    Ok(d)
}

// ---- memory ops -------------------------------------------------------------------------------

/// `copy`: same dtype (F32 or U32) and element count.
pub fn copy(src: &Tensor, dst: &Tensor) -> Result<()> {
    let op = "copy";
    if src.dtype != dst.dtype || src.numel() != dst.numel() || !matches!(src.dtype, DType::F32 | DType::U32) {
        return Err(shape_err(op, format!("{src:?} -> {dst:?}")));
    }
    Ok(())
}

/// `copy_rows`: 2-D F32 tensors of equal row length, both row ranges in bounds. Returns the row
/// length.
pub fn copy_rows(src: &Tensor, src_row: usize, dst: &Tensor, dst_row: usize, n: usize) -> Result<usize> {
    let op = "copy_rows";
    f32s(op, &[("src", src), ("dst", dst)])?;
    let d = src.cols();
    if dst.cols() != d || src.shape.len() != 2 || dst.shape.len() != 2 {
        return Err(shape_err(
            op,
            format!("{src:?} -> {dst:?}: need 2-D tensors with equal rows"),
        ));
    }
    let in_range = |row: usize, t: &Tensor| row.checked_add(n).is_some_and(|e| e <= t.rows());
    if !in_range(src_row, src) || !in_range(dst_row, dst) {
        return Err(shape_err(
            op,
            format!("rows {src_row}+{n} of {src:?} -> rows {dst_row}+{n} of {dst:?} out of range"),
        ));
    }
    Ok(d)
}

// ---- ops --------------------------------------------------------------------------------------

/// Dimensions of `embed`.
#[derive(Debug, Clone, Copy)]
pub struct EmbedDims {
    pub vocab: usize,
    pub d: usize,
    pub tokens: usize,
}

pub fn embed(table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<EmbedDims> {
    let op = "embed";
    weight(op, "table", table)?;
    dtype(op, "ids", ids, DType::U32)?;
    dtype(op, "out", out, DType::F32)?;
    let (vocab, d, tokens) = (table.rows(), table.cols(), ids.numel());
    if out.cols() != d || Some(out.numel()) != tokens.checked_mul(d) {
        return Err(shape_err(
            op,
            format!("table {:?}, ids {:?} -> out {:?}", table.shape, ids.shape, out.shape),
        ));
    }
    no_alias(op, &[out], &[table, ids])?;
    Ok(EmbedDims { vocab, d, tokens })
}

/// Dimensions of `matmul`: `out [t, n_out] = x [t, n_in] · Wᵀ`.
#[derive(Debug, Clone, Copy)]
pub struct MatmulDims {
    pub t: usize,
    pub n_in: usize,
    pub n_out: usize,
}

pub fn matmul(w: &Tensor, x: &Tensor, out: &Tensor) -> Result<MatmulDims> {
    let op = "matmul";
    weight(op, "W", w)?;
    f32s(op, &[("x", x), ("out", out)])?;
    let (n_out, n_in, t) = (w.rows(), w.cols(), x.rows());
    if x.cols() != n_in || out.cols() != n_out || out.rows() != t {
        return Err(shape_err(
            op,
            format!("W {:?} x {:?} -> out {:?}", w.shape, x.shape, out.shape),
        ));
    }
    no_alias(op, &[out], &[w, x])?;
    Ok(MatmulDims { t, n_in, n_out })
}

/// `matmul_group`: one to `MAX_GROUP` pairs, each checked as `matmul`, no output aliasing
/// another. Returns each product's dimensions.
pub fn matmul_group(ws: &[&Tensor], x: &Tensor, outs: &[&Tensor]) -> Result<Vec<MatmulDims>> {
    let op = "matmul_group";
    if ws.is_empty() || ws.len() > super::MAX_GROUP || ws.len() != outs.len() {
        return Err(shape_err(
            op,
            format!(
                "{} weights and {} outputs (1 to {} pairs)",
                ws.len(),
                outs.len(),
                super::MAX_GROUP
            ),
        ));
    }
    no_alias(op, outs, &[])?;
    ws.iter().zip(outs).map(|(w, o)| matmul(w, x, o)).collect()
}

/// `matmul_swiglu`: two weights of one shape, three outputs `[T, n_ff]`.
pub fn matmul_swiglu(
    w_gate: &Tensor,
    w_up: &Tensor,
    x: &Tensor,
    gate_tmp: &Tensor,
    up_tmp: &Tensor,
    out: &Tensor,
) -> Result<MatmulDims> {
    let op = "matmul_swiglu";
    let m = matmul(w_gate, x, gate_tmp)?;
    matmul(w_up, x, up_tmp)?;
    if w_up.shape != w_gate.shape {
        return Err(shape_err(
            op,
            format!("W_gate {:?} and W_up {:?} differ", w_gate.shape, w_up.shape),
        ));
    }
    dtype(op, "out", out, DType::F32)?;
    numel(op, "out", out, m.t * m.n_out)?;
    no_alias(op, &[gate_tmp, up_tmp, out], &[w_gate, w_up, x])?;
    Ok(m)
}

/// `rms_norm`; returns the group size.
pub fn rms_norm(x: &Tensor, w: &Tensor, out: &Tensor) -> Result<usize> {
    let op = "rms_norm";
    f32s(op, &[("x", x), ("out", out)])?;
    f32_in(op, "w", w)?;
    let d = groups(op, x, w)?;
    numel(op, "out", out, x.numel())?;
    no_alias(op, &[out], &[x, w])?;
    Ok(d)
}

/// `add_assign`; returns the element count.
pub fn add_assign(acc: &Tensor, x: &Tensor) -> Result<usize> {
    let op = "add_assign";
    f32s(op, &[("acc", acc), ("x", x)])?;
    numel(op, "x", x, acc.numel())?;
    no_alias(op, &[acc], &[x])?;
    Ok(acc.numel())
}

/// `add_rms_norm`; returns the group size.
pub fn add_rms_norm(acc: &Tensor, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<usize> {
    add_assign(acc, x)?;
    let d = rms_norm(acc, w, out)?;
    no_alias("add_rms_norm", &[acc, out], &[x, w])?;
    Ok(d)
}

/// `swiglu`; returns the element count.
pub fn swiglu(gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<usize> {
    let op = "swiglu";
    f32s(op, &[("gate", gate), ("up", up), ("out", out)])?;
    numel(op, "up", up, gate.numel())?;
    numel(op, "out", out, gate.numel())?;
    no_alias(op, &[out], &[gate, up])?;
    Ok(gate.numel())
}

/// `sigmoid_mul_assign`; returns the element count.
pub fn sigmoid_mul_assign(x: &Tensor, gate: &Tensor) -> Result<usize> {
    let op = "sigmoid_mul_assign";
    f32s(op, &[("x", x), ("gate", gate)])?;
    numel(op, "gate", gate, x.numel())?;
    no_alias(op, &[x], &[gate])?;
    Ok(x.numel())
}

/// `sigmoid_scale_add`; returns `(T, d)`.
pub fn sigmoid_scale_add(acc: &Tensor, x: &Tensor, gate_logit: &Tensor) -> Result<(usize, usize)> {
    let op = "sigmoid_scale_add";
    f32s(op, &[("acc", acc), ("x", x), ("gate_logit", gate_logit)])?;
    let (t, d) = (acc.rows(), acc.cols());
    numel(op, "x", x, t * d)?;
    numel(op, "gate_logit", gate_logit, t)?;
    no_alias(op, &[acc], &[x, gate_logit])?;
    Ok((t, d))
}

/// Dimensions of the causal conv: T tokens, C channels, kernel width K.
#[derive(Debug, Clone, Copy)]
pub struct ConvDims {
    pub t: usize,
    pub c: usize,
    pub k: usize,
}

pub fn conv1d(x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<ConvDims> {
    let op = "conv1d_causal_silu";
    f32s(op, &[("x", x), ("state", state), ("out", out)])?;
    f32_in(op, "w", w)?;
    let (t, c, k) = (x.rows(), x.cols(), w.cols());
    if k == 0 || w.rows() != c {
        return Err(shape_err(op, format!("w {:?} does not match x {:?}", w.shape, x.shape)));
    }
    numel(op, "state", state, (k - 1) * c)?;
    numel(op, "out", out, t * c)?;
    no_alias(op, &[state, out], &[x, w])?;
    Ok(ConvDims { t, c, k })
}

/// `gdn_gates`; returns `(T * Hv, Hv)`.
pub fn gdn_gates(
    a: &Tensor,
    b: &Tensor,
    ssm_a: &Tensor,
    dt_bias: &Tensor,
    g_out: &Tensor,
    beta_out: &Tensor,
) -> Result<(usize, usize)> {
    let op = "gdn_gates";
    f32s(op, &[("a", a), ("b", b), ("g_out", g_out), ("beta_out", beta_out)])?;
    f32_in(op, "ssm_a", ssm_a)?;
    f32_in(op, "dt_bias", dt_bias)?;
    let hv = ssm_a.numel();
    if hv == 0 || a.cols() != hv {
        return Err(shape_err(op, format!("a {:?} vs ssm_a {:?}", a.shape, ssm_a.shape)));
    }
    let n = a.numel();
    numel(op, "b", b, n)?;
    numel(op, "dt_bias", dt_bias, hv)?;
    numel(op, "g_out", g_out, n)?;
    numel(op, "beta_out", beta_out, n)?;
    no_alias(op, &[g_out, beta_out], &[a, b, ssm_a, dt_bias])?;
    Ok((n, hv))
}

/// `l2_norm_qk`: `u` `[T, conv_dim]`; returns T.
pub fn l2_norm_qk(u: &Tensor, dims: GdnDims) -> Result<usize> {
    let op = "l2_norm_qk";
    dtype(op, "u", u, DType::F32)?;
    let cd = dims.conv_dim();
    if dims.dk == 0 || dims.hk == 0 || u.cols() != cd {
        return Err(shape_err(
            op,
            format!("u {:?} does not match conv_dim {cd} of {dims:?}", u.shape),
        ));
    }
    Ok(u.rows())
}

/// Both delta-rule ops (`op` names which); returns T.
pub fn delta_rule(
    op: &str,
    u: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
) -> Result<usize> {
    f32s(
        op,
        &[("u", u), ("g", g), ("beta", beta), ("state", state), ("out", out)],
    )?;
    let GdnDims { hk, hv, dk, dv } = dims;
    if hk == 0 || hv == 0 || dk == 0 || dv == 0 || !hv.is_multiple_of(hk) {
        return Err(shape_err(op, format!("bad dims {dims:?}")));
    }
    let cd = dims.conv_dim();
    if u.cols() != cd {
        return Err(shape_err(
            op,
            format!("u {:?} does not have conv_dim {cd} columns", u.shape),
        ));
    }
    let t = u.rows();
    numel(op, "g", g, t * hv)?;
    numel(op, "beta", beta, t * hv)?;
    numel(op, "state", state, hv * dv * dk)?;
    numel(op, "out", out, t * hv * dv)?;
    no_alias(op, &[state, out], &[u, g, beta])?;
    Ok(t)
}

/// `gated_rms_norm`; returns the group size.
pub fn gated_rms_norm(x: &Tensor, z: &Tensor, w: &Tensor, out: &Tensor) -> Result<usize> {
    let op = "gated_rms_norm";
    f32s(op, &[("x", x), ("z", z), ("out", out)])?;
    f32_in(op, "w", w)?;
    let d = groups(op, x, w)?;
    numel(op, "z", z, x.numel())?;
    numel(op, "out", out, x.numel())?;
    no_alias(op, &[out], &[x, z, w])?;
    Ok(d)
}

/// `split_qgate`; returns the element count of each half.
pub fn split_qgate(qg: &Tensor, head_dim: usize, q: &Tensor, gate: &Tensor) -> Result<usize> {
    let op = "split_qgate";
    f32s(op, &[("qg", qg), ("q", q), ("gate", gate)])?;
    let d = head_dim;
    if d == 0 || !qg.numel().is_multiple_of(2 * d) {
        return Err(shape_err(op, format!("qg {:?} is not whole heads of 2*{d}", qg.shape)));
    }
    numel(op, "q", q, qg.numel() / 2)?;
    numel(op, "gate", gate, qg.numel() / 2)?;
    no_alias(op, &[q, gate], &[qg])?;
    Ok(qg.numel() / 2)
}

/// Dimensions of `rope_neox`: T rows of `n_head` heads.
#[derive(Debug, Clone, Copy)]
pub struct RopeDims {
    pub t: usize,
    pub n_head: usize,
}

pub fn rope_neox(x: &Tensor, head_dim: usize, n_rot: usize, theta: f32, p: Pos) -> Result<RopeDims> {
    let op = "rope_neox";
    pos(op, p)?;
    let dims = rope_heads(op, x, head_dim, n_rot, theta)?;
    if p.host.checked_add(dims.t).is_none() {
        return Err(shape_err(op, format!("position {} overflows", p.host)));
    }
    no_alias(op, &[x], &[p.dev])?;
    Ok(dims)
}

/// The rules of every RoPE op on `x` `[T, n_head * head_dim]` (`op` names which).
pub fn rope_heads(op: &str, x: &Tensor, head_dim: usize, n_rot: usize, theta: f32) -> Result<RopeDims> {
    dtype(op, "x", x, DType::F32)?;
    let (t, cols) = (x.rows(), x.cols());
    if head_dim == 0 || !cols.is_multiple_of(head_dim) || !n_rot.is_multiple_of(2) || n_rot > head_dim {
        return Err(shape_err(
            op,
            format!(
                "x {:?}, head_dim {head_dim}, n_rot {n_rot}: need whole heads and even n_rot <= head_dim",
                x.shape
            ),
        ));
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(shape_err(op, format!("theta {theta} must be finite and positive")));
    }
    Ok(RopeDims {
        t,
        n_head: cols / head_dim,
    })
}

/// `kv_store`: k, v `[T, W]` into rows `pos..pos+T` of caches `[ctx, W]`; returns T.
pub fn kv_store(k: &Tensor, v: &Tensor, k_cache: &Tensor, v_cache: &Tensor, p: Pos) -> Result<usize> {
    let op = "kv_store";
    pos(op, p)?;
    let t = k.rows();
    if v.rows() != t {
        return Err(shape_err(
            op,
            format!("k {:?} and v {:?} differ in rows", k.shape, v.shape),
        ));
    }
    copy_rows(k, 0, k_cache, p.host, t)?;
    copy_rows(v, 0, v_cache, p.host, t)?;
    no_alias(op, &[k_cache, v_cache], &[k, v, p.dev])?;
    Ok(t)
}

/// `attention`; returns T.
pub fn attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    p: Pos,
    dims: AttnDims,
    out: &Tensor,
) -> Result<usize> {
    let op = "attention";
    f32s(
        op,
        &[("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)],
    )?;
    pos(op, p)?;
    let AttnDims {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: d,
    } = dims;
    if nh == 0 || nkv == 0 || d == 0 || !nh.is_multiple_of(nkv) {
        return Err(shape_err(op, format!("bad dims {dims:?}")));
    }
    if q.cols() != nh * d || k_cache.cols() != nkv * d || v_cache.cols() != nkv * d {
        return Err(shape_err(
            op,
            format!(
                "q {:?}, k {:?}, v {:?} vs {dims:?}",
                q.shape, k_cache.shape, v_cache.shape
            ),
        ));
    }
    let t = q.rows();
    let ctx = k_cache.rows();
    if v_cache.rows() != ctx || p.host.checked_add(t).is_none_or(|end| end > ctx) {
        return Err(shape_err(
            op,
            format!(
                "positions {}..+{t} do not fit caches {:?} / {:?}",
                p.host, k_cache.shape, v_cache.shape
            ),
        ));
    }
    numel(op, "out", out, t * nh * d)?;
    no_alias(op, &[out], &[q, k_cache, v_cache, p.dev])?;
    Ok(t)
}

/// `attention_gated`: `attention`'s checks and a gate shaped like out; returns T.
pub fn attention_gated(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    p: Pos,
    dims: AttnDims,
    gate: &Tensor,
    out: &Tensor,
) -> Result<usize> {
    let t = attention(q, k_cache, v_cache, p, dims, out)?;
    sigmoid_mul_assign(out, gate)?;
    Ok(t)
}

/// `moe_route`; returns `(T, E)`.
pub fn moe_route(logits: &Tensor, k: usize, ids: &Tensor, weights: &Tensor) -> Result<(usize, usize)> {
    let op = "moe_route";
    dtype(op, "logits", logits, DType::F32)?;
    dtype(op, "ids", ids, DType::U32)?;
    dtype(op, "weights", weights, DType::F32)?;
    let (t, e) = (logits.rows(), logits.cols());
    if k == 0 || k > e || e > u32::MAX as usize {
        return Err(shape_err(op, format!("top-{k} of {e} experts")));
    }
    numel(op, "ids", ids, t * k)?;
    numel(op, "weights", weights, t * k)?;
    no_alias(op, &[ids, weights], &[logits])?;
    Ok((t, e))
}

/// Dimensions of `moe_experts`.
#[derive(Debug, Clone, Copy)]
pub struct MoeDims {
    pub t: usize,
    pub d: usize,
    pub n_exp: usize,
    pub n_ff: usize,
    /// Experts per token.
    pub k: usize,
}

#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    x: &Tensor,
    gate_exps: &Tensor,
    up_exps: &Tensor,
    down_exps: &Tensor,
    ids: &Tensor,
    weights: &Tensor,
    out: &Tensor,
) -> Result<MoeDims> {
    let op = "moe_experts";
    f32s(op, &[("x", x), ("weights", weights), ("out", out)])?;
    dtype(op, "ids", ids, DType::U32)?;
    for (name, w) in [("gate_exps", gate_exps), ("up_exps", up_exps), ("down_exps", down_exps)] {
        weight(op, name, w)?;
    }
    let (t, d) = (x.rows(), x.cols());
    if gate_exps.shape.len() != 3 || up_exps.shape != gate_exps.shape || down_exps.shape.len() != 3 {
        return Err(shape_err(
            op,
            format!(
                "expert weights gate {:?} up {:?} down {:?}",
                gate_exps.shape, up_exps.shape, down_exps.shape
            ),
        ));
    }
    let (n_exp, n_ff) = (gate_exps.shape[0], gate_exps.shape[1]);
    if gate_exps.shape[2] != d || down_exps.shape != [n_exp, d, n_ff] {
        return Err(shape_err(
            op,
            format!(
                "x {:?} vs gate {:?} / down {:?}",
                x.shape, gate_exps.shape, down_exps.shape
            ),
        ));
    }
    let k = ids.numel().checked_div(t).unwrap_or(0);
    numel(op, "ids", ids, t * k)?;
    numel(op, "weights", weights, t * k)?;
    numel(op, "out", out, t * d)?;
    no_alias(op, &[out], &[x, gate_exps, up_exps, down_exps, ids, weights])?;
    Ok(MoeDims { t, d, n_exp, n_ff, k })
}

/// `moe_experts_shared`: `moe_experts`' rules on the routed experts, `matmul_swiglu`'s on the
/// shared expert's gate and up (input `x`, outputs `sh.gate_tmp`, `sh.up_tmp`, `sh.act`),
/// `matmul`'s on its down (`sh.act` -> `sh.out`), `sigmoid_scale_add`'s on `out += sigmoid(gate
/// logit) * sh.out`, and no output (the scratch included) sharing a buffer with another operand.
/// Returns the routed experts' dimensions and the shared expert's hidden width.
pub fn moe_experts_shared(x: &Tensor, e: super::MoeExperts<'_>, out: &Tensor) -> Result<(MoeDims, usize)> {
    let op = "moe_experts_shared";
    let sh = e.sh;
    let m = moe_experts(x, e.gate_exps, e.up_exps, e.down_exps, e.ids, e.weights, out)?;
    let g = matmul_swiglu(sh.gate, sh.up, x, sh.gate_tmp, sh.up_tmp, sh.act)?;
    matmul(sh.down, sh.act, sh.out)?;
    sigmoid_scale_add(out, sh.out, sh.gate_logit)?;
    let [a, b, c, d] = e.scratch();
    let mut reads = vec![x];
    reads.extend(e.reads());
    no_alias(op, &[out, a, b, c, d], &reads)?;
    Ok((m, g.n_out))
}

/// `moe_route_experts_shared`: `moe_route`'s rules on the routing, `moe_experts_shared`'s on the
/// experts, the logits one row per token of x and one column per expert, and no output of the
/// experts (the scratch included) sharing a buffer with the logits. Returns what
/// `moe_experts_shared` returns.
pub fn moe_route_experts_shared(
    x: &Tensor,
    logits: &Tensor,
    k: usize,
    ex: super::MoeExperts<'_>,
    out: &Tensor,
    next: Option<super::AddNorm<'_>>,
) -> Result<(MoeDims, usize)> {
    let op = "moe_route_experts_shared";
    let (t, e) = moe_route(logits, k, ex.ids, ex.weights)?;
    let r = moe_experts_shared(x, ex, out)?;
    if (t, e, k) != (r.0.t, r.0.n_exp, r.0.k) {
        return Err(shape_err(
            op,
            format!(
                "logits {:?}, top-{k} vs x {:?}, {} experts",
                logits.shape, x.shape, r.0.n_exp
            ),
        ));
    }
    let [a, b, c, d] = ex.scratch();
    no_alias(op, &[out, a, b, c, d], &[logits])?;
    if let Some(n) = next {
        let mut inputs = vec![x, logits];
        inputs.extend(ex.reads());
        add_norm_after(op, out, n, &inputs)?;
    }
    Ok(r)
}

/// `next` of an op whose result is `y`: `add_rms_norm(next.acc, y, next.w, next.out)`'s rules, and
/// `next.acc` not aliasing the op's `inputs` (a backend may add into the residual while the op
/// still reads them). `next.out` may be one of them: it is written after the op has read them (a
/// layer's FFN reads the normed rows that its output's norm then overwrites).
fn add_norm_after(op: &str, y: &Tensor, next: super::AddNorm<'_>, inputs: &[&Tensor]) -> Result<()> {
    add_rms_norm(next.acc, y, next.w, next.out)?;
    no_alias(op, &[next.acc], inputs)?;
    if let Some(g) = next.then {
        // The products of the normed rows: `matmul_group`'s rules, their outputs aliasing nothing
        // the op reads or writes before them (a backend may compute them with the norm).
        matmul_group(g.ws, next.out, g.outs)?;
        let mut others: Vec<&Tensor> = vec![next.acc, next.w, next.out, y];
        others.extend(inputs);
        others.extend(g.ws);
        no_alias(op, g.outs, &others)?;
    }
    Ok(())
}

/// `moe_ffn`: `add_rms_norm(input.acc, y, input.w, input.out)`, `matmul_group([router,
/// shared_gate], input.out, [logits, sh.gate_logit])` and `moe_route_experts_shared(input.out,
/// logits, .., out, next)`; the residual `input.acc` aliasing none of the weights, the routing's
/// outputs or the experts' scratch (a backend may update it while those are read or written).
pub fn moe_ffn(m: super::MoeFfn<'_>, next: Option<super::AddNorm<'_>>) -> Result<(MoeDims, usize)> {
    let op = "moe_ffn";
    let x = m.input.out;
    if m.input.then.is_some() {
        // The FFN's own input norm feeds its router and experts.
        return Err(shape_err(op, "the input norm takes no products of its own (`then`)"));
    }
    add_rms_norm(m.input.acc, m.y, m.input.w, x)?;
    let e = m.experts;
    matmul_group(&[m.router, m.shared_gate], x, &[m.logits, e.sh.gate_logit])?;
    let r = moe_route_experts_shared(x, m.logits, m.k, e, m.out, next)?;
    let mut others = vec![m.router, m.shared_gate, m.logits, m.out];
    others.extend(e.reads());
    others.extend(e.scratch());
    no_alias(op, &[m.input.acc], &others)?;
    Ok(r)
}

/// `matmul_add_rms_norm`: `matmul(w, x, y)` and `add_rms_norm(next.acc, y, next.w, next.out)`,
/// `next.acc` aliasing neither `w` nor `x`. Returns the product's dimensions.
pub fn matmul_add_rms_norm(w: &Tensor, x: &Tensor, y: &Tensor, next: super::AddNorm<'_>) -> Result<MatmulDims> {
    let d = matmul(w, x, y)?;
    add_norm_after("matmul_add_rms_norm", y, next, &[w, x])?;
    Ok(d)
}

/// `argmax`; returns `(T, V)`.
pub fn argmax(logits: &Tensor, out: &Tensor) -> Result<(usize, usize)> {
    let op = "argmax";
    dtype(op, "logits", logits, DType::F32)?;
    dtype(op, "out", out, DType::U32)?;
    let (t, v) = (logits.rows(), logits.cols());
    numel(op, "out", out, t)?;
    // Indices must fit u32 and stay below `NON_FINITE`.
    if v == 0 || v >= u32::MAX as usize {
        return Err(shape_err(op, format!("cannot take argmax over rows of {v}")));
    }
    no_alias(op, &[out], &[logits])?;
    Ok((t, v))
}

// ---- helpers for backends' own limits ---------------------------------------------------------

/// A count or index that a kernel computes in 32 bits.
pub fn u32_index(op: &str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| shape_err(op, format!("{what} ({n}) exceeds the 32-bit index range")))
}

// ---- fused steps ------------------------------------------------------------------------------

/// `gdn_conv_gates`: `gdn_gates`' rules on `gates`, `conv1d`'s and `l2_norm_qk`'s on the rest,
/// no output of one part read or written by the other. Returns the conv geometry and
/// `gdn_gates`' (element count, value heads).
pub fn gdn_conv_gates(
    x: &Tensor,
    w: &Tensor,
    state: &Tensor,
    out: &Tensor,
    dims: GdnDims,
    gates: super::GdnGates<'_>,
) -> Result<(ConvDims, (usize, usize))> {
    let op = "gdn_conv_gates";
    let hv = gdn_gates(gates.a, gates.b, gates.ssm_a, gates.dt_bias, gates.g, gates.beta)?;
    let c = conv1d(x, w, state, out)?;
    l2_norm_qk(out, dims)?;
    no_alias(
        op,
        &[out, state, gates.g, gates.beta],
        &[x, w, gates.a, gates.b, gates.ssm_a, gates.dt_bias],
    )?;
    Ok((c, hv))
}

/// `gdn_recurrent_step`: `gdn_conv_gates`', `delta_rule`'s and `gated_rms_norm`'s rules on the
/// tensors each part reads and writes, and the output apart from every input. Returns the conv
/// geometry and the gated norm's group size.
pub fn gdn_recurrent_step(s: super::GdnStep<'_>, dims: GdnDims) -> Result<(ConvDims, usize)> {
    let op = "gdn_recurrent_step";
    let (c, _) = gdn_conv_gates(s.qkv, s.conv_w, s.conv_state, s.conv_out, dims, s.gates)?;
    delta_rule(op, s.conv_out, s.gates.g, s.gates.beta, s.state, s.o, dims)?;
    let d = gated_rms_norm(s.o, s.z, s.norm_w, s.out)?;
    no_alias(
        op,
        &[s.out, s.o, s.state, s.conv_state],
        &[s.qkv, s.z, s.conv_w, s.norm_w, s.gates.a, s.gates.b],
    )?;
    Ok((c, d))
}

/// `attn_qk_prep`: the rules of `split_qgate`, `rms_norm` (q and k), `rope_neox` and `kv_store`
/// on the tensors they apply to, and no two of its outputs (or an output and an input) sharing
/// a buffer. Returns the RoPE geometry of q and of k and the token count.
#[allow(clippy::too_many_arguments)]
pub fn attn_qk_prep(
    a: super::AttnPrep<'_>,
    head_dim: usize,
    n_rot: usize,
    theta: f32,
    k_cache: &Tensor,
    v_cache: &Tensor,
    p: Pos,
) -> Result<(RopeDims, RopeDims, usize)> {
    let op = "attn_qk_prep";
    split_qgate(a.qg, head_dim, a.q, a.gate)?;
    for (x, w, out) in [(a.q, a.q_norm, a.q_normed), (a.k, a.k_norm, a.k_normed)] {
        if rms_norm(x, w, out)? != head_dim {
            return Err(shape_err(
                op,
                format!("norm weight {:?} is not [head_dim {head_dim}]", w.shape),
            ));
        }
    }
    let rq = rope_neox(a.q_normed, head_dim, n_rot, theta, p)?;
    let rk = rope_neox(a.k_normed, head_dim, n_rot, theta, p)?;
    let t = kv_store(a.k_normed, a.v, k_cache, v_cache, p)?;
    no_alias(
        op,
        &[a.q, a.gate, a.q_normed, a.k_normed, k_cache, v_cache],
        &[a.qg, a.k, a.v, a.q_norm, a.k_norm, p.dev],
    )?;
    Ok((rq, rk, t))
}
