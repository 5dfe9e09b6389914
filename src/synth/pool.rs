//! Large K-quant tensors assembled from a pool of pre-quantized blocks.
//!
//! K-quant quantization runs an iterative scale search (~15–25 M values/s per core), which
//! would dominate the time of a multi-GB file. A tensor of the right distribution is much
//! cheaper to build from a per-tensor pool of independently generated and quantized 256-value
//! blocks: every row picks its blocks at random from the pool (K-quant blocks carry their own
//! scales, so any sequence of blocks is a valid row). Rows stay distinct in practice (4096^(ne0/256)
//! combinations, ne0 ≥ 512) and the value distribution is exactly that of the direct path; only the
//! 256-value segments repeat across the tensor, which no kernel or benchmark can tell.

use rayon::prelude::*;

use super::weights::{self, Init};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;

/// Blocks per pool: 1 M values.
pub const POOL_BLOCKS: usize = 4096;
/// Tensors with more values than this (and a K-quant type) are pooled, so a pool costs at most
/// half the direct quantization work; smaller ones, and all the tiny test shapes, are
/// generated value by value. (0.8B: everything but `ssm_alpha`/`ssm_beta` is pooled.)
pub const POOL_MIN_VALUES: usize = 2 * POOL_BLOCKS * 256;
/// Separates the pool's streams and the block-choice streams from the direct rows' streams.
const POOL_SALT: u64 = 0x504F_4F4C_424C_4B53; // "POOLBLKS"
const PICK_SALT: u64 = 0x5049_434B_524F_5753; // "PICKROWS"

/// Rows must span at least this many blocks to stay (almost) distinct: 4096² ≈ 1.7e7 block
/// pairs for the 512-wide expert `ffn_down_exps` rows (2048 rows per expert: ~0.1 expected
/// duplicate pairs per expert), 4096⁴ ≈ 2.8e14 from 1024-wide rows up (embeddings:
/// ~1e-4 expected duplicates in 248k rows). Duplicate rows are harmless for benchmarks anyway.
const MIN_BLOCKS_PER_ROW: usize = 2;

/// Whether tensor rows of `ne0` values of type `ty`, `n_values` in all, are built from a pool.
pub fn use_pool(ty: GgmlType, ne0: usize, n_values: usize) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
        && ne0.is_multiple_of(256)
        && ne0 >= MIN_BLOCKS_PER_ROW * 256
        && n_values > POOL_MIN_VALUES
}

/// Quantized blocks to assemble rows from.
pub struct BlockPool {
    block_bytes: usize,
    data: Vec<u8>,
}

impl BlockPool {
    /// Generate and quantize `POOL_BLOCKS` blocks of `ty` drawn per `init` (in parallel).
    pub fn new(ty: GgmlType, init: Init, tensor_seed: u64) -> Result<BlockPool> {
        let block_bytes = ty.type_size() as usize;
        let mut data = vec![0u8; POOL_BLOCKS * block_bytes];
        data.par_chunks_mut(block_bytes)
            .enumerate()
            .try_for_each_init(
                || vec![0f32; ty.block_size() as usize],
                |vals, (i, out)| {
                    weights::fill_row(tensor_seed ^ POOL_SALT, i as u64, init, vals);
                    crate::quant::quantize(ty, vals, out)
                },
            )
            .map_err(|e| Error::InvalidArgument(format!("block pool for {ty}: {e}")))?;
        Ok(BlockPool { block_bytes, data })
    }

    /// Row `row` of the tensor: `out.len() / block_bytes` blocks picked from the pool by the
    /// row's own stream (deterministic, independent of thread count).
    pub fn fill_row(&self, tensor_seed: u64, row: u64, out: &mut [u8]) {
        let mut rng = weights::row_stream(tensor_seed ^ PICK_SALT, row);
        for dst in out.chunks_exact_mut(self.block_bytes) {
            // Multiply-shift maps 32 random bits onto 0..POOL_BLOCKS without modulo bias.
            let k = (((rng.next_u64() >> 32) * POOL_BLOCKS as u64) >> 32) as usize;
            let src = &self.data[k * self.block_bytes..(k + 1) * self.block_bytes];
            dst.copy_from_slice(src);
        }
    }
}
