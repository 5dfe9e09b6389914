//! The op implementations, one module per family. Each checks its operands with
//! `backend::check` (the shared contract), works out the launch geometry and submits kernels from
//! `kernels-cuda/` (the file named in each module's doc).

pub(crate) mod attention;
pub(crate) mod conv;
pub(crate) mod delta;
pub(crate) mod eltwise;
pub(crate) mod gdn_step;
pub(crate) mod gemm;
pub(crate) mod linear;
pub(crate) mod matvec_tc;
pub(crate) mod moe;
pub(crate) mod mv;
pub(crate) mod norm;
pub(crate) mod rows;

use super::driver::cuda_err;
use super::op::{Args, Op};
use super::profile::Phase;
use super::Inner;
use crate::backend::Tensor;
use crate::error::Result;

/// One kernel launch: the kernel `prefix` + `suffix`, its grid and parameter block.
pub(crate) struct Launch {
    pub name: (&'static str, &'static str),
    pub grid: [u32; 3],
    pub block: u32,
    pub smem: u32,
    pub args: Args,
    pub phase: Phase,
}

/// Largest grid y and z extents.
pub(crate) const GRID_YZ_MAX: usize = 65_535;

impl Inner {
    /// Submit one launch; `uses` are the tensors it touches (kept alive while recorded).
    pub(crate) fn kernel(&self, l: Launch, uses: &[&Tensor]) -> Result<()> {
        self.kernel_rw(l, 0.0, &[], uses)
    }

    /// Submit a launch that only reads `reads` and may write `writes` (see `submit_rw`), doing
    /// `flops` floating-point operations (matrix products; 0 otherwise) for the profile.
    pub(crate) fn kernel_rw(&self, l: Launch, flops: f64, reads: &[&Tensor], writes: &[&Tensor]) -> Result<()> {
        if l.grid.contains(&0) {
            return Ok(());
        }
        if l.grid[1] as usize > GRID_YZ_MAX || l.grid[2] as usize > GRID_YZ_MAX {
            return Err(cuda_err(format!(
                "{}{}: grid {:?} exceeds the device's limits",
                l.name.0, l.name.1, l.grid
            )));
        }
        let f = self.kernels.get_with_smem(l.name.0, l.name.1, l.smem)?;
        self.submit_rw(
            Op::Kernel {
                f,
                name: l.name,
                grid: l.grid,
                block: [l.block, 1, 1],
                smem: l.smem,
                args: l.args,
                phase: l.phase,
                flops,
            },
            reads,
            writes,
        )
    }

    pub(crate) fn sms(&self) -> usize {
        self.dev.sms as usize
    }
}

/// A count as a 32-bit grid extent.
pub(crate) fn grid_u32(op: &str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| cuda_err(format!("{op}: {what} ({n}) exceeds the grid limits")))
}

/// Blocks for a grid-stride loop over `n` elements with 256 threads per block: enough to fill the
/// GPU several times over, never more than the elements need.
pub(crate) fn stride_blocks(inner: &Inner, n: usize) -> u32 {
    n.div_ceil(256).clamp(1, inner.sms() * 8) as u32
}

/// Threads per block for a reduction over groups of `d` values: a multiple of 32, at most 256.
pub(crate) fn group_threads(d: usize) -> u32 {
    (d.div_ceil(32) * 32).clamp(32, 256) as u32
}
