//! A matrix-vector launch as the host describes it: the weight operands (`Weight`), the products
//! of one launch (`Parts`), and everything a launch family shares (`Mv`), with the slots every
//! matvec kernel reads (kernels-cuda/matvec.cuh, matvec_tc.cuh). Below the kernels' choosers
//! (`linear.rs`, `matvec_tc.rs`), which both read it.

use super::{grid_u32, GRID_YZ_MAX};
use crate::backend::cuda::buffer::{self, get, ptr};
use crate::backend::cuda::driver::{cuda_err, DevPtr};
use crate::backend::cuda::op::{Args, MvSeg, MV_SEGS};
use crate::backend::cuda::profile::Phase;
use crate::backend::{check, DType, Tensor};
use crate::error::Result;
use crate::gguf::GgmlType;

/// The format of a weight (an F32 tensor reads as F32): kernels are named after it
/// (`matvec_Q4_K`), one for every type the CPU backend reads.
pub(crate) fn format(op: &str, dtype: DType) -> Result<GgmlType> {
    let ty = match dtype {
        DType::F32 => GgmlType::F32,
        DType::Ggml(t) => t,
        DType::U32 => return Err(cuda_err(format!("{op}: a U32 tensor is not a weight"))),
    };
    if !crate::quant::can_dequantize(ty) {
        return Err(cuda_err(format!(
            "{op}: weight type {ty} is not supported by the cuda backend"
        )));
    }
    Ok(ty)
}

/// A weight operand: device address, bytes per row, format suffix and the phase for the profile.
pub(crate) struct Weight {
    pub(crate) ptr: DevPtr,
    pub(crate) row_bytes: usize,
    pub(crate) suffix: &'static str,
    pub(crate) ty: GgmlType,
    pub(crate) phase: Phase,
}

/// Check that `w` holds `rows` rows of `cols` elements of its format (`rows` counts every expert).
pub(crate) fn weight(op: &str, w: &Tensor, rows: usize, cols: usize) -> Result<Weight> {
    let ty = format(op, w.dtype)?;
    let row_bytes = ty
        .row_size(cols as u64)
        .ok_or_else(|| cuda_err(format!("{op}: a row of {cols} is not a whole number of {ty} blocks")))?
        as usize;
    let need = row_bytes
        .checked_mul(rows)
        .ok_or_else(|| cuda_err(format!("{op}: weight {:?} overflows", w.shape)))?;
    let b = get(w, op, need)?;
    // Block decoders read whole 16-byte chunks around the data: only padded weight buffers, or
    // F32 tensors (read as whole f32 values, never past their end), qualify.
    if w.dtype != DType::F32 && b.bytes < need + buffer::WEIGHT_PAD {
        return Err(cuda_err(format!("{op}: weight buffer lacks its padding")));
    }
    Ok(Weight {
        ptr: b.ptr,
        row_bytes,
        suffix: ty.name(),
        ty,
        phase: Phase::of_weight(b.name.as_deref()),
    })
}

/// One product of a matvec launch: its weight rows (in the launch's format), output and row count.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Part {
    pub(crate) w: DevPtr,
    pub(crate) out: DevPtr,
    pub(crate) n_out: usize,
}

/// The products of one matvec launch (the kernels' segment table, kernels-cuda/common.cuh): one,
/// or up to `MV_SEGS` plain products of one x (`matmul_group`).
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Parts {
    p: [Part; MV_SEGS],
    n: usize,
}

impl Parts {
    pub(crate) fn one(w: DevPtr, out: DevPtr, n_out: usize) -> Parts {
        let mut p = Parts::default();
        p.p[0] = Part { w, out, n_out };
        p.n = 1;
        p
    }

    /// The products `parts` (at most `MV_SEGS`).
    pub(crate) fn of(parts: impl IntoIterator<Item = Part>) -> Result<Parts> {
        let mut p = Parts::default();
        for part in parts {
            let slot = p.p.get_mut(p.n);
            *slot.ok_or_else(|| cuda_err(format!("matvec: more than {MV_SEGS} products in one launch")))? = part;
            p.n += 1;
        }
        Ok(p)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Part> {
        self.p[..self.n].iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Output rows of all the products.
    pub(crate) fn rows(&self) -> usize {
        self.iter().map(|p| p.n_out).sum()
    }

    /// Output rows of the tallest product: what picks a kernel's shape (`matmul_group` groups
    /// only products that pick the same one alone).
    pub(crate) fn widest(&self) -> usize {
        self.iter().map(|p| p.n_out).max().unwrap_or(0)
    }
}

/// One matvec launch family: everything but the output-vector range.
pub(crate) struct Mv<'a> {
    /// The weights' format, row size and phase (every product's; the first product's weight).
    pub(crate) w: &'a Weight,
    pub(crate) w2: Option<&'a Weight>,
    pub(crate) x: DevPtr,
    /// The tensor at `x`, when it is one (its prepared copy for the tensor-core kernels is then
    /// kept for the other products that read it).
    pub(crate) x_t: Option<&'a Tensor>,
    /// The products: weight rows, output, row count each. Several only for plain products (no
    /// `w2`, no experts).
    pub(crate) parts: Parts,
    pub(crate) ids: DevPtr,
    pub(crate) scales: DevPtr,
    pub(crate) n_in: usize,
    pub(crate) expert_bytes: usize,
    pub(crate) n_experts: usize,
    /// Output vectors sharing one activation vector (MoE gate/up: k).
    pub(crate) x_group: usize,
    /// Entries summed into one output vector (MoE down: k).
    pub(crate) nsum: usize,
    /// Output vectors.
    pub(crate) vectors: usize,
    /// A shared expert as the last of every token's `x_group * nsum` entries.
    pub(crate) shared: Option<MvShared>,
    /// The kernel adds its rows into `out` (`out += W x`: the residual add of
    /// `matmul_add_rms_norm`); the tensor-core kernels only (matvec_tc.cuh, n11 bit 5).
    pub(crate) accumulate: bool,
}

/// A shared expert run as one more expert per token (kernels-cuda/common.cuh `MvShared`): its
/// weight `w` (the product's format and row size), and `w2` its up weight for a fused SwiGLU or
/// `gate_logits` (`[T]`, its scale `sigmoid(logit)`) for a sum, 0 where they do not apply.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MvShared {
    pub(crate) w: DevPtr,
    pub(crate) w2: DevPtr,
    pub(crate) gate_logits: DevPtr,
}

impl<'a> Mv<'a> {
    /// A dense product (no experts) of `d.t` token vectors of `x`; `w2` makes it the fused SwiGLU.
    pub(crate) fn dense(
        w: &'a Weight,
        w2: Option<&'a Weight>,
        x: &'a Tensor,
        out: DevPtr,
        d: check::MatmulDims,
    ) -> Result<Mv<'a>> {
        Ok(Mv {
            w,
            w2,
            x: ptr(x, "matmul")?,
            x_t: Some(x),
            parts: Parts::one(w.ptr, out, d.n_out),
            ids: 0,
            scales: 0,
            n_in: d.n_in,
            expert_bytes: 0,
            n_experts: 1,
            x_group: 1,
            nsum: 1,
            vectors: d.t,
            shared: None,
            accumulate: false,
        })
    }

    /// The grid's x blocks at `rows_per_block` rows per block: each product's rows rounded up to
    /// whole blocks (a block never mixes products). Checks that the counts fit the kernels' ints
    /// (`chunks` relies on it).
    pub(crate) fn grid_x(&self, op: &str, rows_per_block: usize) -> Result<u32> {
        let blocks: usize = self.parts.iter().map(|p| p.n_out.div_ceil(rows_per_block)).sum();
        if i32::try_from(blocks).is_err() || self.parts.iter().any(|p| i32::try_from(p.n_out).is_err()) {
            return Err(cuda_err(format!(
                "{op}: {} rows in {blocks} blocks exceed the matvec kernels' limits",
                self.parts.rows()
            )));
        }
        grid_u32(op, "row blocks", blocks)
    }

    /// The launches of this product: output vectors in chunks of the grid's y limit, each a whole
    /// number of x groups (so a kernel's `entry / x_group` stays right), with the slots every
    /// matvec kernel shares filled for the chunk (matvec.cuh, matvec_tc.cuh): the segment table
    /// (each product's W, out at the chunk's first vector, n_out, first block at `rows_per_block`
    /// rows per block, as `grid_x` counts them), p1 W2, p4 ids, p5 scales, p7 and p3 the shared
    /// expert (common.cuh `mv_shared_slots`); n1 n_in, n2 row_bytes, n3 expert_bytes, n4 n_experts,
    /// n5 x_group, n6 nsum. Also the chunk's output vectors and its first x row.
    pub(crate) fn chunks(&self, rows_per_block: usize) -> impl Iterator<Item = (Args, usize, usize)> + '_ {
        let group = self.x_group.max(1);
        let chunk = (GRID_YZ_MAX / group).max(1) * group;
        (0..self.vectors).step_by(chunk).map(move |v0| {
            let nv = (self.vectors - v0).min(chunk);
            // First ids / scales entry of this chunk. A chunk starts at a token's first entry: with
            // a shared expert, one of each token's `x_group * nsum` entries has none.
            let mut entries0 = v0 * self.nsum;
            if self.shared.is_some() {
                entries0 -= entries0 / (group * self.nsum);
            }
            let mut a = Args::default();
            let mut block0 = 0;
            for (seg, part) in a.seg.iter_mut().zip(self.parts.iter()) {
                *seg = MvSeg {
                    w: part.w,
                    out: part.out + 4 * (v0 * part.n_out) as u64,
                    rows: part.n_out as i32,
                    block0: block0 as i32,
                };
                block0 += part.n_out.div_ceil(rows_per_block);
            }
            a.p[1] = self.w2.map_or(0, |w| w.ptr);
            a.p[4] = if self.ids == 0 {
                0
            } else {
                self.ids + 4 * entries0 as u64
            };
            a.p[5] = if self.scales == 0 {
                0
            } else {
                self.scales + 4 * entries0 as u64
            };
            a.n[1] = self.n_in as i64;
            a.n[2] = self.w.row_bytes as i64;
            a.n[3] = self.expert_bytes as i64;
            a.n[4] = self.n_experts as i64;
            a.n[5] = self.x_group as i64;
            a.n[6] = self.nsum as i64;
            // The shared expert's weight, and its up weight (a fused SwiGLU) or its gate logits
            // from the chunk's first token on.
            if let Some(sh) = self.shared {
                a.p[7] = sh.w;
                a.p[3] = match self.w2 {
                    Some(_) => sh.w2,
                    None if sh.gate_logits != 0 => sh.gate_logits + 4 * (v0 / group) as u64,
                    None => 0,
                };
            }
            (a, nv, v0 * self.nsum / group)
        })
    }
}
