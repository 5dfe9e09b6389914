//! The op implementations, one module per family, and the piecewise binding of large weights.
//!
//! A weight larger than one storage binding (lavapipe and browsers: 128 MiB; a 0.8B model's
//! embedding is 143 MB at Q4_K) is bound in pieces of whole rows, each starting on the device's
//! binding-offset alignment, and the op runs once per piece: a piece of a matrix writes its rows
//! of the output, a piece of the embedding serves the ids in its range, a piece of the MoE
//! experts serves the slots routed to its experts.

mod attention;
mod conv;
mod delta;
mod eltwise;
mod linear;
mod moe;
mod norm;
mod rows;

pub(crate) use attention::{attention, attention_gated, attn_qk_prep, kv_store, rope_neox};
pub(crate) use conv::{conv1d_causal_silu, conv1d_silu_l2qk, gdn_conv_gates};
pub(crate) use delta::{delta_rule_chunked, delta_rule_recurrent};
pub(crate) use eltwise::{add_assign, argmax, gdn_gates, sigmoid_mul_assign, sigmoid_scale_add, split_qgate, swiglu};
pub(crate) use linear::{embed, matmul, matmul_group, matmul_swiglu};
pub(crate) use moe::{moe_experts, moe_experts_shared, moe_route};
pub(crate) use norm::{add_rms_norm, gated_rms_norm, l2_norm_qk, rms_norm};
pub(crate) use rows::{attention_rows, conv1d_silu_rows, delta_rule_rows, kv_store_rows, rope_neox_rows};

use super::buffer;
use super::caps::Caps;
use super::encoder::Bind;
use super::gpu_err;
use crate::backend::{DType, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

/// Rows up to this length take one invocation per row (`matmul_rows.wgsl` in the generic matmul
/// path and for one token, `moe_rows.wgsl` for the experts) rather than a workgroup per few rows.
const MATMUL_ROWS_MAX_IN: usize = 256;

/// Shaders address a bound piece with u32 byte offsets; pieces stay below this.
const MAX_PIECE: u64 = 1 << 31;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Rows per piece for rows of `row_bytes`: the most whole rows that fit one binding, a multiple
/// of the rows whose bytes are a multiple of the binding alignment (so every piece starts
/// aligned). `None` when not even one such group of rows fits.
pub(crate) fn piece_rows(caps: &Caps, row_bytes: u64) -> Option<u64> {
    if row_bytes == 0 {
        return None;
    }
    let align = caps.binding_align.max(16);
    let group = align / gcd(row_bytes, align);
    let limit = caps.max_binding.min(MAX_PIECE);
    let rows = limit / row_bytes / group * group;
    (rows > 0).then_some(rows)
}

/// A range of a weight's rows bound as one storage binding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub row0: usize,
    pub rows: usize,
    range: Option<(u64, u64)>,
}

impl Piece {
    pub fn bind<'a>(&self, w: &'a Tensor) -> Bind<'a> {
        match self.range {
            None => Bind::from(w),
            Some((off, size)) => Bind::range(w, off, size),
        }
    }
}

/// The pieces of a weight of `rows` rows of `row_bytes` (one piece binding the whole buffer
/// when it fits). An iterator, so the token loop allocates nothing.
pub(crate) struct Pieces {
    next: usize,
    rows: usize,
    per: usize,
    row_bytes: u64,
    buf_size: u64,
    whole: bool,
}

pub(crate) fn pieces(caps: &Caps, op: &str, w: &Tensor, rows: usize, row_bytes: u64) -> Result<Pieces> {
    let buf_size = buffer::get(w)?.size;
    let need = (rows as u64)
        .checked_mul(row_bytes)
        .ok_or_else(|| gpu_err(format!("{op}: weight {:?} overflows", w.shape)))?;
    if need > buf_size {
        return Err(gpu_err(format!(
            "{op}: weight {:?} needs {need} bytes, its buffer has {buf_size}",
            w.shape
        )));
    }
    if buf_size <= caps.max_binding.min(MAX_PIECE) {
        return Ok(Pieces {
            next: 0,
            rows,
            per: rows.max(1),
            row_bytes,
            buf_size,
            whole: true,
        });
    }
    let per = piece_rows(caps, row_bytes).ok_or_else(|| {
        gpu_err(format!(
            "{op}: weight {:?} ({need} bytes) exceeds the storage binding limit of {} bytes and its rows of \
             {row_bytes} bytes cannot be bound in pieces (try --backend cpu)",
            w.shape, caps.max_binding
        ))
    })?;
    Ok(Pieces {
        next: 0,
        rows,
        per: per as usize,
        row_bytes,
        buf_size,
        whole: false,
    })
}

impl Iterator for Pieces {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        if self.next >= self.rows || (self.whole && self.next > 0) {
            return None;
        }
        let row0 = self.next;
        let rows = self.per.min(self.rows - row0);
        self.next += rows;
        let range = (!self.whole).then(|| {
            let off = row0 as u64 * self.row_bytes;
            let size = if self.next >= self.rows {
                self.buf_size - off
            } else {
                rows as u64 * self.row_bytes
            };
            (off, size)
        });
        Some(Piece { row0, rows, range })
    }
}

/// The ggml type a weight tensor is read as (F32 tensors as the `f32` format).
pub(crate) fn weight_type(op: &str, dtype: DType) -> Result<GgmlType> {
    let ty = match dtype {
        DType::F32 => GgmlType::F32,
        DType::Ggml(ty) => ty,
        DType::U32 => return Err(gpu_err(format!("{op}: a U32 tensor is not a weight"))),
    };
    if !super::kernels::supports(ty) {
        return Err(gpu_err(format!(
            "{op}: weight type {ty} is not supported by the wgpu backend"
        )));
    }
    Ok(ty)
}

/// Bytes of one row of `cols` elements of `ty`.
pub(crate) fn row_bytes(op: &str, ty: GgmlType, cols: usize) -> Result<u64> {
    ty.row_size(cols as u64)
        .ok_or_else(|| gpu_err(format!("{op}: a row of {cols} is not a whole number of {ty} blocks")))
}

/// `n` as a u32 shader value.
pub(crate) fn u32_of(op: &str, what: &str, n: usize) -> Result<u32> {
    crate::backend::check::u32_index(op, what, n)
}
