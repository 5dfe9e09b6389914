//! One unit of GPU work (`Op`: a kernel launch, a memset, a device copy) and the kernel
//! parameter block every launch carries (`Args`). Below both the op queue (`launch.rs`) and the
//! buffers (`buffer.rs`), which submit ops.

use super::driver::DevPtr;
use super::kernels::Func;
use super::profile::Phase;

/// The parameter block of every kernel (kernels-cuda/common.cuh, `struct Args`, same layout):
/// pointer slots, integer slots, float slots, and the matrix-vector kernels' segment table. Each
/// kernel documents its slots.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Args {
    pub p: [u64; 8],
    pub n: [i64; 12],
    pub f: [f32; 4],
    pub seg: [MvSeg; MV_SEGS],
}

/// Products one matrix-vector launch can hold (common.cuh `MV_SEGS`): a whole `matmul_group`.
pub(crate) const MV_SEGS: usize = crate::backend::MAX_GROUP;
const _: () = assert!(
    MV_SEGS == 4 && std::mem::size_of::<Args>() == 272,
    "common.cuh `struct Args`"
);

/// One product of a matrix-vector launch (common.cuh `struct MvSeg`): its weight rows, its output,
/// its row count (0: unused entry) and its first block of the grid's x blocks.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MvSeg {
    pub w: u64,
    pub out: u64,
    pub rows: i32,
    pub block0: i32,
}

impl Args {
    /// The parameter block of a kernel that takes its own struct (the prefill kernels,
    /// `pf::GemmParams` etc.): its bytes at the start of the block. The driver copies exactly the
    /// kernel's parameter size from the block, so any struct up to `size_of::<Args>()` fits.
    pub(crate) fn from_pod<T: bytemuck::Pod>(t: &T) -> Args {
        const { assert!(std::mem::size_of::<T>() <= std::mem::size_of::<Args>()) };
        let mut a = Args::default();
        let src = bytemuck::bytes_of(t);
        bytemuck::bytes_of_mut(&mut a)[..src.len()].copy_from_slice(src);
        a
    }
}

/// One unit of GPU work. (Kernel launches dominate and are kept inline: boxing them would cost an
/// allocation per launch.)
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Op {
    Kernel {
        f: Func,
        /// Kernel name for the profile (`prefix` + `suffix`, e.g. `matvec_` + `Q4_K`).
        name: (&'static str, &'static str),
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        args: Args,
        phase: Phase,
        /// Floating-point operations of a matrix product (2 per multiply-add), else 0: the
        /// profile's achieved TFLOP/s.
        flops: f64,
    },
    Memset {
        dst: DevPtr,
        bytes: usize,
    },
    Copy {
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    },
}
