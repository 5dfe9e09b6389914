//! `embed`, `matmul` and `matmul_swiglu` over weights in their GGUF block formats.
//!
//! Kernel choice, by shape only (so lavapipe tests exercise every kernel):
//! * one token (decode): `matvec.wgsl` (each weight byte read once, whole-word decoding), and
//!   `matvec_group.wgsl` for several products of that token sharing a format (`matmul_group`);
//! * several tokens (prefill): `matmul_tiled.wgsl` (64 x 64 tiles, weights dequantized once per
//!   tile), or its cooperative-matrix version at `Precision::Fast` (`matmul_coop2.wgsl`; `caps`);
//! * rows that are not a multiple of the fast kernels' units (small F32/F16 tensors):
//!   `matmul_rows.wgsl` (short rows) or `matmul.wgsl`.

use super::{pieces, row_bytes, u32_of, weight_type, MATMUL_ROWS_MAX_IN};
use crate::backend::wgpu::caps::Coop;
use crate::backend::wgpu::encoder::{Bind, Encoder};
use crate::backend::wgpu::kernels::{self, Kernel, MM_ROWS_WG, MM_TILE, TILE_K, TILE_M, TILE_N};
use crate::backend::wgpu::policy::{self, SwigluOut};
use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, Tensor, MAX_GROUP};
use crate::error::Result;
use crate::gguf::GgmlType;

/// `out[t] = dequant(table[ids[t]])`. Ids >= vocab give a zero row (checked in the shader; the
/// host cannot see device ids without a readback). The CPU backend errors instead.
pub(crate) fn embed(be: &WgpuBackend, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
    let op = "embed";
    let check::EmbedDims { vocab, d, tokens } = check::embed(table, ids, out)?;
    let ty = weight_type(op, table.dtype)?;
    let rb = row_bytes(op, ty, d)?;
    let n = u32_of(op, "output size", tokens * d)?;
    let (d32, t32, v32) = (
        u32_of(op, "d", d)?,
        u32_of(op, "T", tokens)?,
        u32_of(op, "vocab", vocab)?,
    );
    let mut enc = be.encoder()?;
    if d % 8 == 0 {
        // One workgroup per token reads only its row (8 elements per step).
        let [gx, gy] = enc.grid(t32);
        for p in pieces(&be.caps, op, table, vocab, rb)? {
            let params = [d32, t32, v32, rb as u32, p.row0 as u32, p.rows as u32];
            enc.run(
                Kernel::EmbedRows,
                Some(ty),
                &params,
                &[p.bind(table), ids.into(), out.into()],
                [gx, gy, 1],
            )?;
        }
        return Ok(());
    }
    let [gx, gy] = enc.grid(n.div_ceil(kernels::ELT_WG));
    enc.run(
        Kernel::Embed,
        Some(ty),
        &[d32, t32, v32, rb as u32],
        &[table.into(), ids.into(), out.into()],
        [gx, gy, 1],
    )
}

/// The checked shape of a matmul and its weight's format.
#[derive(Clone, Copy)]
struct Mm {
    t: usize,
    n_in: usize,
    n_out: usize,
    ty: GgmlType,
    rb: u64,
}

fn mm_dims(op: &str, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<Mm> {
    let check::MatmulDims { t, n_in, n_out } = check::matmul(w, x, out)?;
    let ty = weight_type(op, w.dtype)?;
    let rb = row_bytes(op, ty, n_in)?;
    // Flat indices into x and out are u32 in the shaders.
    u32_of(op, "x size", x.numel())?;
    u32_of(op, "out size", out.numel())?;
    u32_of(op, "n_out", n_out)?;
    u32_of(op, "n_in", n_in)?;
    Ok(Mm { t, n_in, n_out, ty, rb })
}

/// Whether one token's rows are short enough for one invocation per row (`generic`'s
/// `matmul_rows`): a workgroup per few rows would mostly wait in its reduction's barriers, which
/// CPU adapters (lavapipe, the browser's SwiftShader) pay for dearly. The weight must fit one binding.
fn short_rows(caps: &crate::backend::wgpu::caps::Caps, m: &Mm, w: &Tensor) -> Result<bool> {
    Ok(m.n_in <= MATMUL_ROWS_MAX_IN && pieces(caps, "matmul", w, m.n_out, m.rb)?.count() == 1)
}

/// Whether one token's matrix-vector kernel takes rows of `n_in` of `ty`.
fn matvec_fits(ty: GgmlType, n_in: usize) -> bool {
    n_in.is_multiple_of(kernels::mv_unit(ty))
}

/// `out[t][o] = dot(W[o], x[t])`; W `[n_out, n_in]` (any supported weight type or F32),
/// x `[T, n_in]`, out `[T, n_out]`.
pub(crate) fn matmul(be: &WgpuBackend, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
    let op = "matmul";
    let m = mm_dims(op, w, x, out)?;
    let mut enc = be.encoder()?;
    if m.t == 1 && short_rows(&be.caps, &m, w)? {
        return generic(&mut enc, &m, w, x, out);
    }
    if m.t == 1 && matvec_fits(m.ty, m.n_in) {
        let kernel = if m.n_out >= kernels::MV_TALL_ROWS {
            Kernel::MatvecTall
        } else {
            Kernel::Matvec
        };
        return matvec(&mut enc, kernel, &m, &[w], x, out);
    }
    if m.n_in % TILE_K as usize == 0 {
        return tiled(&mut enc, &m, w, x, out);
    }
    generic(&mut enc, &m, w, x, out)
}

/// `outs[i] = matmul(ws[i], x)`: for one token, the products that take the matrix-vector kernel
/// in one binding each are launched by format, up to `policy::group_size` of a format in one
/// `matvec_group` dispatch (a Q4_K_M Gated DeltaNet layer: qkv, z, beta and alpha in one, or its
/// Q6_K qkv alone and the other three in one); every other product as `matmul`.
pub(crate) fn matmul_group(be: &WgpuBackend, ws: &[&Tensor], x: &Tensor, outs: &[&Tensor]) -> Result<()> {
    let op = "matmul_group";
    check::matmul_group(ws, x, outs)?;
    let caps = &be.caps;
    let n = ws.len();
    // Which products can join a group: one token on the matrix-vector kernel, one binding each.
    let mut ms: [Option<Mm>; MAX_GROUP] = [None; MAX_GROUP];
    if policy::group_size(caps.device()) > 1 {
        for (i, (w, out)) in ws.iter().zip(outs).enumerate() {
            let m = mm_dims(op, w, x, out)?;
            if m.t == 1
                && !short_rows(caps, &m, w)?
                && matvec_fits(m.ty, m.n_in)
                && pieces(caps, op, w, m.n_out, m.rb)?.count() == 1
            {
                ms[i] = Some(m);
            }
        }
    }
    let formats: [Option<GgmlType>; MAX_GROUP] = ms.map(|m| m.map(|m| m.ty));
    let mut done = [false; MAX_GROUP];
    for g in policy::product_groups(caps.device(), &formats[..n]) {
        matvec_group(be, g.members(), &ms, ws, x, outs)?;
        for &j in g.members() {
            done[j] = true;
        }
    }
    for (i, (w, out)) in ws.iter().zip(outs).enumerate() {
        if !done[i] {
            matmul(be, w, x, out)?;
        }
    }
    Ok(())
}

// matvec_group.wgsl's segment table is a vec4 per field.
const _: () = assert!(MAX_GROUP == 4);

/// One `matvec_group` dispatch of the products `seg` (2 to 4 indices into `ws`/`outs`, each with
/// its shape in `ms`, all of one format and row length), each weight in one binding: their
/// workgroups one product after the other.
fn matvec_group(
    be: &WgpuBackend,
    seg: &[usize],
    ms: &[Option<Mm>; MAX_GROUP],
    ws: &[&Tensor],
    x: &Tensor,
    outs: &[&Tensor],
) -> Result<()> {
    let op = "matmul_group";
    let m = seg
        .first()
        .and_then(|&j| ms[j])
        .ok_or_else(|| gpu_err(format!("{op}: an empty group")))?;
    let kernel = Kernel::matvec_group(seg.len())
        .ok_or_else(|| gpu_err(format!("{op}: {} products in one dispatch", seg.len())))?;
    let units = m.n_in / kernels::mv_unit(m.ty);
    let caps = &be.caps;
    let all_rows: usize = seg.iter().filter_map(|&j| ms[j]).map(|mj| mj.n_out).sum();
    let lanes = kernels::mv_lanes_spread(caps, kernel, m.ty, units, all_rows);
    let per_wg = kernels::mv_rows_per_wg(caps, kernel, m.ty, lanes);
    // Rows and first workgroup per product; past the last product the first workgroup is the
    // total, which no workgroup reaches.
    let mut rows = [0u32; MAX_GROUP];
    let mut start = [0u32; MAX_GROUP];
    let mut total = 0u32;
    for (s, &j) in seg.iter().enumerate() {
        let mj = ms[j].ok_or_else(|| gpu_err(format!("{op}: product {j} is not grouped")))?;
        rows[s] = mj.n_out as u32;
        start[s] = total;
        total = total
            .checked_add(rows[s].div_ceil(per_wg))
            .ok_or_else(|| gpu_err(format!("{op}: too many workgroups")))?;
    }
    for s in start.iter_mut().skip(seg.len()) {
        *s = total;
    }
    let params = [
        m.n_in as u32,
        m.rb as u32,
        units as u32,
        lanes,
        rows[0],
        rows[1],
        rows[2],
        rows[3],
        start[0],
        start[1],
        start[2],
        start[3],
    ];
    let mut enc = be.encoder()?;
    let xq = mv_dot_x(&mut enc, kernel, &m, x)?;
    // x, then each product's weight and output (matvec_group.wgsl).
    let mut binds = [Bind::from(xq.as_ref().unwrap_or(x)); 1 + 2 * MAX_GROUP];
    for (s, &j) in seg.iter().enumerate() {
        binds[1 + 2 * s] = ws[j].into();
        binds[2 + 2 * s] = outs[j].into();
    }
    let [gx, gy] = enc.grid(total);
    enc.run(kernel, Some(m.ty), &params, &binds[..1 + 2 * seg.len()], [gx, gy, 1])
}

/// One token through `kernel` (`Matvec`, or `MatvecSwiglu`/`MatvecSwigluXq` with `ws` = [gate,
/// up]), piece by piece. `MatvecSwigluXq` also writes out's packed-dot planes (on a scratch
/// buffer) and records them with out, so a product of out binds them and needs no `mv_dot_prep`.
fn matvec(enc: &mut Encoder<'_>, kernel: Kernel, m: &Mm, ws: &[&Tensor], x: &Tensor, out: &Tensor) -> Result<()> {
    let units = m.n_in / kernels::mv_unit(m.ty);
    let caps = enc.be.caps;
    let lanes = match kernel {
        // The planes' span follows the lanes (`mv_xq_span`): this kernel keeps its geometry.
        Kernel::MatvecSwigluXq => kernels::mv_lanes(&caps, units),
        _ => kernels::mv_lanes_spread(&caps, kernel, m.ty, units, m.n_out),
    };
    let xq = mv_dot_x(enc, kernel, m, x)?;
    let x = xq.as_ref().unwrap_or(x);
    // After x's planes are taken: a new scratch buffer drops any recorded planes.
    let planes = match kernel {
        Kernel::MatvecSwigluXq => Some(enc.scratch(
            "swiglu_xq",
            crate::backend::DType::U32,
            &[m.t * kernels::xq_words(m.n_out)],
        )?),
        _ => None,
    };
    let per_wg = match planes {
        Some(_) => kernels::mv_xq_span(&caps, m.ty, lanes),
        None => kernels::mv_rows_per_wg(&caps, kernel, m.ty, lanes),
    };
    for p in pieces(&caps, "matmul", ws[0], m.n_out, m.rb)? {
        // The planes' blocks are whole 32 rows of out from the piece's first row.
        if planes.is_some() && !(p.row0.is_multiple_of(32) && p.rows.is_multiple_of(32)) {
            return Err(gpu_err(
                "matmul_swiglu: the planes of a piece that is not whole 32-row blocks",
            ));
        }
        let params = [
            m.n_in as u32,
            m.n_out as u32,
            p.rows as u32,
            m.rb as u32,
            p.row0 as u32,
            units as u32,
            lanes,
        ];
        let [gx, gy] = enc.grid((p.rows as u32).div_ceil(per_wg));
        let wg = [gx, gy, 1];
        match (ws, &planes) {
            // matvec_swiglu.wgsl: gate at binding 1, up at binding 4 (after matvec's bindings);
            // matvec_swiglu_xq.wgsl: the planes at 5.
            ([g, u], Some(xq)) => enc.run(
                kernel,
                Some(m.ty),
                &params,
                &[p.bind(g), x.into(), out.into(), p.bind(u), xq.into()],
                wg,
            )?,
            ([g, u], None) => enc.run(
                kernel,
                Some(m.ty),
                &params,
                &[p.bind(g), x.into(), out.into(), p.bind(u)],
                wg,
            )?,
            _ => enc.run(kernel, Some(m.ty), &params, &[p.bind(ws[0]), x.into(), out.into()], wg)?,
        }
    }
    if let Some(xq) = planes {
        enc.set_dot_x(out, xq);
    }
    Ok(())
}

/// Where `kernel` runs `m`'s format on packed integer dot products (`kernels::mv_dot`): one
/// token's x quantized into int8 planes (`mv_dot_prep.wgsl`) on a scratch buffer, which the
/// kernel then binds in x's place; otherwise None (the kernel reads x). Where x is a norm's
/// output whose planes that norm wrote (ops/norm.rs), or `matvec_swiglu_xq`'s (`matvec`), those,
/// with no prep dispatch.
fn mv_dot_x(enc: &mut Encoder<'_>, kernel: Kernel, m: &Mm, x: &Tensor) -> Result<Option<Tensor>> {
    if !kernels::mv_dot(&enc.be.caps, kernel, m.ty) {
        return Ok(None);
    }
    if let Some(xq) = enc.dot_x(x).filter(|_| x.numel() == m.t * m.n_in) {
        return Ok(Some(xq));
    }
    // K-quant rows are whole 256-element blocks, so x is whole 32-element blocks.
    let blocks = u32_of("matmul", "x blocks", m.t * m.n_in / 32)?;
    let xq = enc.scratch("mv_xq", crate::backend::DType::U32, &[m.t * kernels::xq_words(m.n_in)])?;
    let [gx, gy] = enc.grid(blocks.div_ceil(kernels::MVD_WG));
    enc.run(
        Kernel::MvDotPrep,
        None,
        &[blocks],
        &[x.into(), (&xq).into()],
        [gx, gy, 1],
    )?;
    Ok(Some(xq))
}

/// Several tokens through tiles of (rows, tokens): 64 x 64 in f32, or f16 cooperative matrices at
/// Precision::Fast (`matmul_coop2` in its geometry where the k step divides the row; caps.rs
/// chooses).
fn tiled(enc: &mut Encoder<'_>, m: &Mm, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
    let caps = enc.be.caps;
    // F32 weights (the MoE router, the shared expert's gate) stay exact: a rounded router logit
    // can flip an expert choice, which moves the output far more than any f16 product.
    let (kernel, coop2) = match caps.coop2 {
        Some(c) if caps.coop != Coop::Off && m.ty != GgmlType::F32 && m.n_in.is_multiple_of(c.k as usize) => {
            (Kernel::MatmulCoop2, Some(c))
        }
        _ => (Kernel::MatmulTiled, None),
    };
    let (tile_rows, tile_toks) = coop2.map_or((TILE_M, TILE_N), |c| (c.rows, c.toks));
    let t32 = u32_of("matmul", "T", m.t)?;
    let tok_tiles = t32.div_ceil(tile_toks);
    for p in pieces(&caps, "matmul", w, m.n_out, m.rb)? {
        let row_tiles = (p.rows as u32).div_ceil(tile_rows);
        let n = row_tiles
            .checked_mul(tok_tiles)
            .ok_or_else(|| gpu_err("matmul: too many tiles"))?;
        // A cooperative store needs 16-byte aligned rows: whole 4 floats in out's row stride and
        // at the piece's first row.
        let direct = coop2.is_some() && m.n_out.is_multiple_of(4) && p.row0.is_multiple_of(4);
        let params = [
            m.n_in as u32,
            m.n_out as u32,
            p.rows as u32,
            m.rb as u32,
            p.row0 as u32,
            t32,
            row_tiles,
            u32::from(direct),
        ];
        let [gx, gy] = enc.grid(n);
        enc.run(
            kernel,
            Some(m.ty),
            &params,
            &[p.bind(w), x.into(), out.into()],
            [gx, gy, 1],
        )?;
    }
    Ok(())
}

/// Rows the fast kernels do not take (not a multiple of their units): the weight must fit one
/// binding (these are small F32/F16 tensors).
fn generic(enc: &mut Encoder<'_>, m: &Mm, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
    let gz = u32_of("matmul", "token tiles", m.t.div_ceil(MM_TILE as usize))?;
    let params = [m.n_in as u32, m.n_out as u32, m.t as u32, m.rb as u32];
    let binds = [w.into(), x.into(), out.into()];
    // Short rows: one invocation per row (a workgroup per row would mostly wait in barriers).
    if m.n_in <= MATMUL_ROWS_MAX_IN {
        let [gx, gy] = enc.grid((m.n_out as u32).div_ceil(MM_ROWS_WG));
        return enc.run(Kernel::MatmulRows, Some(m.ty), &params, &binds, [gx, gy, gz]);
    }
    let [gx, gy] = enc.grid(m.n_out as u32);
    enc.run(Kernel::Matmul, Some(m.ty), &params, &binds, [gx, gy, gz])
}

/// `out = silu(W_gate x) * (W_up x)`: one dispatch for a token whose two weights share a format
/// and fit one binding each (with the packed-dot units, writing out's planes too); otherwise the
/// two matmuls and `swiglu`.
pub(crate) fn matmul_swiglu(
    be: &WgpuBackend,
    w_gate: &Tensor,
    w_up: &Tensor,
    x: &Tensor,
    gate_tmp: &Tensor,
    up_tmp: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let op = "matmul_swiglu";
    check::matmul_swiglu(w_gate, w_up, x, gate_tmp, up_tmp, out)?;
    let m = mm_dims(op, w_gate, x, out)?;
    let one_piece = |w: &Tensor| -> Result<bool> { Ok(pieces(&be.caps, op, w, m.n_out, m.rb)?.count() == 1) };
    if m.t == 1
        && m.n_in > MATMUL_ROWS_MAX_IN
        && w_gate.dtype == w_up.dtype
        && matvec_fits(m.ty, m.n_in)
        && one_piece(w_gate)?
        && one_piece(w_up)?
    {
        // With the packed-dot units, the variant that also writes out's planes where a K-quant
        // product (the FFN's down) can read them: whole 256-element rows, as the norms (norm.rs).
        // Whatever the gate's format: the down product's decides whether they are read.
        let kernel = match policy::swiglu_out(be.caps.device(), m.n_out) {
            SwigluOut::Planes => Kernel::MatvecSwigluXq,
            SwigluOut::Plain => Kernel::MatvecSwiglu,
        };
        let mut enc = be.encoder()?;
        return matvec(&mut enc, kernel, &m, &[w_gate, w_up], x, out);
    }
    matmul(be, w_gate, x, gate_tmp)?;
    matmul(be, w_up, x, up_tmp)?;
    super::swiglu(be, gate_tmp, up_tmp, out)
}
