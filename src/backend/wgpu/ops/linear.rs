//! Weight formats (`dequant_<type>.wgsl`), `embed` and `matmul`.
//!
//! Every weight stays in its GGUF block format on the device; the op shaders call the
//! format's `deq(block_byte, i)` per element. A weight of `DType::F32` (e.g. the MoE router) has
//! the same layout as a GGUF F32 weight and uses the `f32` variant.

use crate::backend::wgpu::{buffer, gpu_err, WgpuBackend};
use crate::backend::{check, DType, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

macro_rules! wgsl {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../../../shaders-wgsl/", $name, ".wgsl")),
        )
    };
}

/// Rows up to this length use `matmul_rows.wgsl` (one invocation per output row).
const MATMUL_ROWS_MAX_IN: usize = 256;
/// Invocations per workgroup of `matmul_rows.wgsl`.
const MATMUL_ROWS_WG: u32 = 64;

pub(crate) const SHADERS: &[(&str, &str)] = &[
    wgsl!("embed"),
    wgsl!("matmul"),
    wgsl!("matmul_rows"),
    wgsl!("dequant_f32"),
    wgsl!("dequant_f16"),
    wgsl!("dequant_bf16"),
    wgsl!("dequant_q4_0"),
    wgsl!("dequant_q4_1"),
    wgsl!("dequant_q5_0"),
    wgsl!("dequant_q5_1"),
    wgsl!("dequant_q8_0"),
    wgsl!("dequant_q2_k"),
    wgsl!("dequant_q3_k"),
    wgsl!("dequant_q4_k"),
    wgsl!("dequant_q5_k"),
    wgsl!("dequant_q6_k"),
    wgsl!("dequant_iq4_nl"),
    wgsl!("dequant_iq4_xs"),
    wgsl!("dequant_mxfp4"),
];

/// Tokens per workgroup in `matmul.wgsl` (its `TILE`).
const MATMUL_TILE: usize = 8;
/// Invocations per workgroup in `embed.wgsl`.
const EMBED_WG: usize = 256;

/// The WGSL dequantizer variant (`dequant_<variant>.wgsl`) of a weight's dtype, and its ggml
/// type (for the block geometry). F32 tensors read as the `f32` format.
pub(crate) fn weight_variant(op: &str, dtype: DType) -> Result<(&'static str, GgmlType)> {
    use GgmlType::*;
    let ty = match dtype {
        DType::F32 => F32,
        DType::Ggml(ty) => ty,
        DType::U32 => return Err(gpu_err(format!("{op}: a U32 tensor is not a weight"))),
    };
    let v = match ty {
        F32 => "f32",
        F16 => "f16",
        Bf16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2K => "q2_k",
        Q3K => "q3_k",
        Q4K => "q4_k",
        Q5K => "q5_k",
        Q6K => "q6_k",
        Iq4Nl => "iq4_nl",
        Iq4Xs => "iq4_xs",
        Mxfp4 => "mxfp4",
        other => {
            return Err(gpu_err(format!(
                "{op}: weight type {other} is not supported by the wgpu backend"
            )))
        }
    };
    Ok((v, ty))
}

/// Bytes of one weight row of `cols` elements, checking that the whole weight (`rows` rows) is
/// present in the buffer and addressable with the shaders' u32 byte offsets.
fn row_bytes(op: &str, w: &Tensor, ty: GgmlType, rows: usize, cols: usize) -> Result<u32> {
    let rb = ty
        .row_size(cols as u64)
        .ok_or_else(|| gpu_err(format!("{op}: row of {cols} is not a whole number of {ty} blocks")))?;
    let total = rb
        .checked_mul(rows as u64)
        .ok_or_else(|| gpu_err(format!("{op}: weight {:?} overflows", w.shape)))?;
    if total > buffer::get(w)?.size {
        return Err(gpu_err(format!(
            "{op}: weight {:?} {ty} needs {total} bytes, its buffer is smaller",
            w.shape
        )));
    }
    if total > u32::MAX as u64 {
        return Err(gpu_err(format!(
            "{op}: weight {:?} {ty} ({total} bytes) exceeds the 4 GiB a shader can address",
            w.shape
        )));
    }
    Ok(rb as u32)
}

/// `out[t] = dequant(table[ids[t]])`. Ids >= vocab give a zero row (checked in the shader; the
/// host cannot see device ids without a readback). The CPU backend errors instead.
pub(crate) fn embed(be: &WgpuBackend, table: &Tensor, ids: &Tensor, out: &Tensor) -> Result<()> {
    let op = "embed";
    let check::EmbedDims {
        vocab,
        d,
        tokens: n_tok,
    } = check::embed(table, ids, out)?;
    let (variant, ty) = weight_variant(op, table.dtype)?;
    let rb = row_bytes(op, table, ty, vocab, d)?;
    let n = check::u32_index(op, "output size", n_tok * d)?;
    let params = [
        check::u32_index(op, "d", d)?,
        n_tok as u32,
        check::u32_index(op, "vocab", vocab)?,
        rb,
    ];
    let [gx, gy] = be.grid(n.div_ceil(EMBED_WG as u32));
    be.dispatch("embed", variant, &params, &[table, ids, out], [gx, gy, 1])
}

/// `out[t][o] = dot(W[o], x[t])`; W `[n_out, n_in]` (any supported weight type or F32),
/// x `[T, n_in]`, out `[T, n_out]`.
pub(crate) fn matmul(be: &WgpuBackend, w: &Tensor, x: &Tensor, out: &Tensor) -> Result<()> {
    let op = "matmul";
    let check::MatmulDims { t: n_tok, n_in, n_out } = check::matmul(w, x, out)?;
    let (variant, ty) = weight_variant(op, w.dtype)?;
    let rb = row_bytes(op, w, ty, n_out, n_in)?;
    // Flat indices into x and out are u32 in the shader.
    check::u32_index(op, "x size", x.numel())?;
    check::u32_index(op, "out size", out.numel())?;
    check::u32_index(op, "T", n_tok)?;
    let (n_in32, n_out32) = (
        check::u32_index(op, "n_in", n_in)?,
        check::u32_index(op, "n_out", n_out)?,
    );
    let params = [n_in32, n_out32, n_tok as u32, rb];
    let gz = check::u32_index(op, "token tiles", n_tok.div_ceil(MATMUL_TILE))?;
    // Short rows: one invocation per row (a workgroup per row would mostly wait in barriers).
    // Long rows: a workgroup per row, so the row's loads coalesce. Chosen by shape only, so the
    // tests on lavapipe exercise both kernels.
    if n_in <= MATMUL_ROWS_MAX_IN {
        let [gx, gy] = be.grid(n_out32.div_ceil(MATMUL_ROWS_WG));
        return be.dispatch("matmul_rows", variant, &params, &[w, x, out], [gx, gy, gz]);
    }
    let [gx, gy] = be.grid(n_out32);
    be.dispatch("matmul", variant, &params, &[w, x, out], [gx, gy, gz])
}
