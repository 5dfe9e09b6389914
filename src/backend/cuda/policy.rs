//! Every fused-variant and kernel-variant decision of the CUDA backend, as pure functions of the
//! device (`Device`), the run's options (precision, fusion) and the shapes and formats of an op,
//! each answering with an enum. The ops ask once and act on the answer; nothing here touches the
//! GPU, so the decisions for the real models' shapes are unit-tested without one (below).
//!
//! The numbers behind each threshold are measurements on the H200 (BENCHMARKS.md,
//! dev/cuda/DECISIONS.md); the variants that lost them are not selectable at run time. With
//! `fusion` off (`RILL_CUDA_FUSION=0`, `CudaOptions::fusion`) every fused decision answers "not
//! fused": each op then runs as its own launches, for debugging.

use super::{SYNC_COUNTERS, SYNC_PARTIALS};
use crate::backend::{GdnDims, Precision};
use crate::gguf::GgmlType;

/// What the decisions need to know of the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    /// Streaming multiprocessors.
    pub sms: usize,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
}

impl Device {
    /// The H200 the numbers were measured on: 132 SMs, sm_90.
    pub const H200: Device = Device { sms: 132, cc: (9, 0) };

    /// Programmatic dependent launch (compute capability 9.0 and newer).
    pub fn dependent_launch(&self) -> bool {
        self.cc.0 >= 9
    }
}

/// The device and the options of one backend: what every decision below reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub device: Device,
    pub precision: Precision,
    /// The fused variants may be chosen (`CudaOptions::fusion`).
    pub fusion: bool,
}

/// Batches up to this many tokens use the matrix-vector kernels (weights read once per token);
/// larger ones the tiled or tensor-core kernels: the decode shape.
pub const MATVEC_MAX_T: usize = 4;

/// Whether `t` token rows are a decode shape (`MATVEC_MAX_T`).
pub fn decode_rows(t: usize) -> bool {
    (1..=MATVEC_MAX_T).contains(&t)
}

/// Which kernels a batch of token rows takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    /// A decode shape (`MATVEC_MAX_T` rows at most): the matrix-vector kernels.
    Decode,
    /// The exact batched kernels (tiled f32 products).
    Exact,
    /// The fast tier's tensor-core products on f16 activations (`ops/gemm.rs`).
    TensorCores,
}

/// How the fast tier's tensor-core products (`ops/gemm.rs`) take their f16 activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmActivations {
    /// One f16 plane: the quantized formats, whose own quantization error is far larger.
    F16,
    /// Two f16 planes `hi = f16(x)`, `lo = f16(x - hi)` (f32-class, ~2^-22 relative): F16 and
    /// BF16 weights, exact in f16, where rounding x would be the product's only error (it flips
    /// argmax on near-ties).
    HiLo,
}

/// The activations of a tensor-core product of `ty` weights, if the kernels (gemm_q.cu) decode
/// that format.
pub fn gemm_activations(ty: GgmlType) -> Option<GemmActivations> {
    match ty {
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K | GgmlType::Q8_0 => Some(GemmActivations::F16),
        GgmlType::F16 | GgmlType::Bf16 => Some(GemmActivations::HiLo),
        _ => None,
    }
}

// ---- decode-shaped norms ------------------------------------------------------------------------

/// How a decode-shaped norm (or gate) kernel spreads a token row over blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowBlocks {
    /// One block per slice of 256 values (kernels-cuda/norm.cu `*_slices`), which also prepares
    /// its slice for the tensor-core products.
    Slices,
    /// One block per token row.
    Rows,
}

// ---- tensor-core decode products ----------------------------------------------------------------

/// Inputs per prepared unit of the tensor-core decode products (a super-block, or Q8_0's group
/// of 8 blocks).
pub const TC_UNIT: usize = 256;
/// Products with at least this many rows run the tall kernels (32 rows per block of 4 warps; the
/// Q8_0 SwiGLU 16): kernels-cuda/matvec_tc.cu and matvec_tc8.cu give the measurements.
pub const TC_TALL_ROWS: usize = 8192;
/// Dense Q8_0 products from this many rows up to `TC_TALL_ROWS` run `mvtc_mid_Q8_0` (32 rows per
/// block of 8 warps).
pub const TC_Q8_MID_ROWS: usize = 4096;

/// What a tensor-core kernel's weight loads need of a product's rows: a multiple of
/// `n_in_multiple` inputs, and row (and expert) bytes that are a multiple of `align`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loads {
    pub n_in_multiple: usize,
    pub align: usize,
}

/// What the tensor-core kernels of a format take: rows a multiple of `unit` (its prepared
/// layout), the loads of the plain and of the shared-expert (`_sh_`) kernels, and whether a plain
/// launch may hold several products (not Q6_K, whose kernel would lose a block per SM to the
/// per-block pointers, matvec_tc6.cuh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcTakes {
    pub unit: usize,
    pub plain: Loads,
    pub shared: Loads,
    pub groups: bool,
}

/// Whole units of 16-byte aligned rows: 16-byte loads of Q4_K super-blocks and Q8_0 groups.
const ALIGNED: Loads = Loads {
    n_in_multiple: TC_UNIT,
    align: 16,
};

/// The tensor-core decode kernels of weight format `ty`, if it has them. Q6_K's plain loads assume
/// 8 warps striding over the super-blocks of rows that start 16-byte aligned (210-byte super-blocks
/// realign every 8); its shared-expert kernels realign at run time and take rows at any even
/// address (matvec_tc6.cuh TcQ6KAny: the 35B-A3B's 420-byte expert rows).
pub const fn tc_takes(ty: GgmlType) -> Option<TcTakes> {
    match ty {
        GgmlType::Q4K | GgmlType::Q8_0 => Some(TcTakes {
            unit: TC_UNIT,
            plain: ALIGNED,
            shared: ALIGNED,
            groups: true,
        }),
        GgmlType::Q6K => Some(TcTakes {
            unit: TC_UNIT,
            plain: Loads {
                n_in_multiple: 8 * TC_UNIT,
                align: 16,
            },
            shared: Loads {
                n_in_multiple: TC_UNIT,
                align: 2,
            },
            groups: false,
        }),
        _ => None,
    }
}

/// A decode matrix-vector product as the kernel choice sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MvShape {
    /// The weight's format, and the up weight's of a fused SwiGLU.
    pub ty: GgmlType,
    pub ty2: Option<GgmlType>,
    pub n_in: usize,
    pub row_bytes: usize,
    /// Bytes per expert (0: a dense product).
    pub expert_bytes: usize,
    /// MoE experts with a shared expert among them (the `_sh_` kernels).
    pub shared: bool,
    /// Every weight pointer 16-byte aligned.
    pub aligned: bool,
    /// Rows of x the product reads.
    pub x_rows: usize,
    /// Largest grid y extent.
    pub grid_y_max: usize,
}

/// The kernels that run a decode matrix-vector product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MvKernels {
    /// The exact tensor-core kernels of this format (kernels-cuda/matvec_tc*.cu).
    TensorCores(GgmlType),
    /// The f32 kernels on dequantized weights (kernels-cuda/matvec.cuh).
    F32,
}

/// The tensor-core kernels where they take the product (Q4_K, Q8_0 or Q6_K weights, both of a
/// SwiGLU the same format, rows their loads take, aligned weights, x rows within one grid), else
/// the f32 kernels.
pub fn mv_kernels(m: &MvShape) -> MvKernels {
    let Some(t) = tc_takes(m.ty) else {
        return MvKernels::F32;
    };
    let l = if m.shared { t.shared } else { t.plain };
    let ok = m.n_in > 0
        && m.n_in.is_multiple_of(t.unit)
        && m.n_in.is_multiple_of(l.n_in_multiple)
        && m.row_bytes.is_multiple_of(l.align)
        && m.expert_bytes.is_multiple_of(l.align)
        && m.ty2.is_none_or(|t2| t2 == m.ty)
        && m.aligned
        && m.x_rows <= m.grid_y_max;
    if ok {
        MvKernels::TensorCores(m.ty)
    } else {
        MvKernels::F32
    }
}

/// The tensor-core decode kernel families (kernels-cuda/matvec_tc*.cu; the format is the suffix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcKernel {
    /// `mvtc_`: 16 rows per block of 8 warps.
    Plain,
    /// `mvtc_tall_`: 32 rows per block of 4 warps.
    Tall,
    /// `mvtc_mid_` (Q8_0): 32 rows per block of 8 warps.
    Mid,
    /// `mvtc_glu_`: the fused SwiGLU, 16 rows per block of 8 warps.
    Glu,
    /// `mvtc_glu_tall_`: the fused SwiGLU of `TC_TALL_ROWS` rows and more.
    GluTall,
    /// `mvtc_sh_`: MoE experts with a shared expert.
    Shared,
    /// `mvtc_glu_sh_`: their fused SwiGLU.
    GluShared,
}

impl TcKernel {
    /// The kernel name's prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            TcKernel::Plain => "mvtc_",
            TcKernel::Tall => "mvtc_tall_",
            TcKernel::Mid => "mvtc_mid_",
            TcKernel::Glu => "mvtc_glu_",
            TcKernel::GluTall => "mvtc_glu_tall_",
            TcKernel::Shared => "mvtc_sh_",
            TcKernel::GluShared => "mvtc_glu_sh_",
        }
    }
}

/// A tensor-core decode launch's kernel, rows per block and threads per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcGeometry {
    pub kernel: TcKernel,
    pub rows_per_block: usize,
    pub threads: u32,
}

const fn geo(kernel: TcKernel, rows_per_block: usize, threads: u32) -> TcGeometry {
    TcGeometry {
        kernel,
        rows_per_block,
        threads,
    }
}

/// The kernel of format `ty` for a product whose tallest part has `n_out` rows (`glu`: the fused
/// SwiGLU; `dense`: no experts, one x row per output, which the tall and mid Q8_0 kernels need;
/// `shared`: MoE experts with a shared expert). The shape fixes the K split, and with it the bits
/// of every row: `matmul_group` launches products together in the kernel their tallest picks.
pub fn tc_geometry(ty: GgmlType, n_out: usize, glu: bool, dense: bool, shared: bool) -> TcGeometry {
    use TcKernel::*;
    let tall = n_out >= TC_TALL_ROWS;
    match ty {
        // 4 warps: a 35B-A3B layer's 9 x 32 blocks in one wave (kernels-cuda/matvec_tc.cu).
        GgmlType::Q4K if shared && glu => geo(GluShared, 16, 128),
        _ if shared && glu => geo(GluShared, 16, 256),
        _ if shared => geo(Shared, 16, 256),
        GgmlType::Q8_0 if dense && !glu && tall => geo(Tall, 32, 128),
        GgmlType::Q8_0 if dense && !glu && n_out >= TC_Q8_MID_ROWS => geo(Mid, 32, 256),
        GgmlType::Q8_0 if dense && glu && tall => geo(GluTall, 16, 128),
        GgmlType::Q8_0 | GgmlType::Q6K if glu => geo(Glu, 16, 256),
        GgmlType::Q8_0 | GgmlType::Q6K => geo(Plain, 16, 256),
        // Q4_K: the tall SwiGLU on the tall kernels' geometry (matvec_tc.cu `mvtc_glu_tall_Q4_K`);
        // below it 8 warps (4 were slower end to end: 9B Q4_K_M decode 210.8 against 221.2 t/s).
        _ if glu && tall => geo(GluTall, 32, 128),
        _ if glu => geo(Glu, 16, 256),
        _ if tall => geo(Tall, 32, 128),
        _ => geo(Plain, 16, 256),
    }
}

/// The largest launch (weight bytes) whose dense product pulls its block rows into L2 before the
/// dependency wait: the prefetch of every launch measured slower (H200 tg128 9B q4_k_m 300.6 ->
/// 315.6 t/s without it, q8_0 236.2 -> 255.4); of the small launches only, a little faster than
/// none (35B-A3B 358.7 -> 361.7, 9B q4_k_m 317.8 -> 319.2, q8_0 equal).
pub const TC_PREFETCH_MAX_BYTES: usize = 16 << 20;

/// Whether a dense tensor-core launch of `weight_bytes` prefetches its weights into L2.
pub fn tc_dense_prefetch(weight_bytes: usize) -> bool {
    weight_bytes <= TC_PREFETCH_MAX_BYTES
}

// ---- products of one input ----------------------------------------------------------------------

/// How a decode `matmul_group` launches its products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupLaunch {
    /// Products of one format and profile phase share a launch (tensor-core ones whatever their
    /// shapes, in the kernel the tallest picks; the f32 ones when they run the same kernel in
    /// the same shape): one launch ramp and tail instead of one per product.
    Families,
    /// Every product in a launch of its own.
    PerProduct,
}

/// Q4_K_M's one Q6_K projection of an input beside its Q4_K ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixedLaunch {
    /// In their launch (kernels-cuda/matvec_tc6.cu `mvtc_mix_Q6_K_Q4_K`).
    Mixed,
    /// In a launch of its own.
    Separate,
}

/// The norm of a residual row and the next block's first products of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormedGroup {
    /// The products' launch norms the row in its prologue (kernels-cuda/matvec_tc.cuh mv_body
    /// NORM, `mvtc_norm_tall_Q4_K`): no norm launch between them.
    Prologue,
    /// The norm's launch, then the products'.
    Separate,
}

/// Widest x a NORM kernel takes (kernels-cuda/matvec_tc.cuh `NORM_V`: 4 x 128 threads x 8 values
/// per thread; its shared memory then stays under the 48 KiB any launch gets).
pub const NORM_MAX_IN: usize = 4096;
/// Super-blocks of x each warp of the NORM kernel prepares at most: with more the prologue costs
/// more than the norm's own launch (the 9B's 4 per warp measured slower).
pub const NORM_MAX_SB_PER_WARP: usize = 2;

/// The products of one input row as `normed_group` sees them: their formats and rows, and whether
/// they form one tensor-core launch family (one format and phase, on the tensor cores, at most the
/// segment table's products).
#[derive(Clone, Copy, Debug)]
pub struct GroupShape<'a> {
    pub t: usize,
    pub n_in: usize,
    /// (format, output rows) of each product.
    pub products: &'a [(GgmlType, usize)],
    pub one_tc_launch: bool,
}

// ---- the fused composites -----------------------------------------------------------------------

/// A residual add and RMSNorm after a product (`matmul_add_rms_norm`, and the routed experts'
/// down product with `next`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddNorm {
    /// The product adds its rows into the residual itself and the norm reads the finished row
    /// over slices, with no grid barrier (`rows` token rows).
    InProduct { rows: usize },
    /// The product, then `add_rms_norm`.
    Composed,
}

/// A MoE layer's shared expert on the decode path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedExpert {
    /// One more expert per token inside the routed experts' launches (common.cuh `MvShared`).
    InExpertLaunches,
    /// Launches of its own (the trait's composition).
    OwnLaunches,
}

/// The shapes of `moe_experts_shared`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedExpertShape {
    pub t: usize,
    pub k: usize,
    pub d: usize,
    pub n_ff: usize,
    pub n_ff_shared: usize,
    /// The shared expert's gate, up and down formats are the routed experts'.
    pub formats_match: bool,
}

/// A MoE layer's residual add, input norm, router and shared-gate products and routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeFfn {
    /// One launch (kernels-cuda/norm.cu `moe_norm_route`).
    NormRoute,
    /// The ops (`backend::moe_ffn_ops`).
    Ops,
}

/// Most experts `moe_norm_route` routes (its last block is moe.cu's rank routing:
/// kernels-cuda/route.cuh, 256 threads x ROUTE_PER_THREAD).
pub const NORM_ROUTE_MAX_EXPERTS: usize = 256 * 4;
/// Widest rows `moe_norm_route` takes (its router blocks hold the normed row in shared memory).
pub const NORM_ROUTE_MAX_D: usize = 8192;

/// The shapes of `moe_ffn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeFfnShape {
    /// Token rows and values per row of the normed input (`input.out`), its element count.
    pub t: usize,
    pub d: usize,
    pub numel: usize,
    pub n_experts: usize,
    /// The router and the shared expert's gate are F32 rows.
    pub router_f32: bool,
}

/// A Gated DeltaNet layer's recurrent step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnStep {
    /// One launch (kernels-cuda/gdn_step.cu: conv + SiLU, q/k L2 norm, gates, delta rule, gated
    /// RMSNorm and its prepared copies).
    OneLaunch,
    /// The three launches of the trait's default.
    Ops,
}

/// Conv taps of the one-launch kernel (gdn_step.cu `GS_K`).
pub const GDN_STEP_TAPS: usize = 4;

/// The shapes of `gdn_recurrent_step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnStepShape {
    pub t: usize,
    pub taps: usize,
    /// Values per group of the gated norm.
    pub norm_group: usize,
    pub dims: GdnDims,
}

impl Policy {
    /// This policy with the fused variants on: what the kernels take whatever the switch (the
    /// ops check a variant they are asked to run with it).
    pub fn with_fusion(self) -> Policy {
        Policy { fusion: true, ..self }
    }

    /// The kernels for a batch of `t` token rows (`recording`: inside a recorded step, where the
    /// tensor-core batch path, which reads host-side sizes and f16 copies tracked at submission,
    /// does not run).
    pub fn batch(&self, t: usize, recording: bool) -> Batch {
        if t <= MATVEC_MAX_T {
            Batch::Decode
        } else if self.precision == Precision::Fast && !recording {
            Batch::TensorCores
        } else {
            Batch::Exact
        }
    }

    /// Whether a step of `t` rows of many sequences is recorded (its row ops read the rows on
    /// the device, ops/rows.rs): where recording leaves its products' kernels as they are. Not
    /// the fast tier's batches of more than `MATVEC_MAX_T` rows, whose tensor-core products do
    /// not run inside a recorded step (`batch`): f32 tiles instead would cost far more than the
    /// launches a recording saves.
    pub fn record_rows(&self, t: usize) -> bool {
        self.batch(t, true) == self.batch(t, false)
    }

    /// How a decode-shaped kernel over `t` rows of `n` values spreads them: over slices where the
    /// rows are whole slices and, for the kernels whose blocks meet at a grid barrier (`barrier`:
    /// the RMSNorms), the partial sums fit the sync scratch (at most 32 per row, as one warp sums
    /// them) and the blocks are at most one per SM, so that all of them are resident at once on
    /// any GPU (the barrier waits for every block: one that could not be scheduled would hang).
    pub fn row_blocks(&self, t: usize, n: usize, barrier: bool) -> RowBlocks {
        let fits = decode_rows(t)
            && n > 0
            && n.is_multiple_of(256)
            && (!barrier || (n / 256 <= 32 && t * (n / 256) <= SYNC_PARTIALS.min(self.device.sms)));
        if fits {
            RowBlocks::Slices
        } else {
            RowBlocks::Rows
        }
    }

    /// How a decode `matmul_group` of `t` rows of `n_in` launches its products.
    pub fn group_launch(&self, t: usize, n_in: usize) -> GroupLaunch {
        if self.fusion && decode_rows(t) && n_in > 0 {
            GroupLaunch::Families
        } else {
            GroupLaunch::PerProduct
        }
    }

    /// Whether a group's Q6_K product joins its Q4_K family (`q6_on_tc`: the Q6_K product runs on
    /// the tensor cores; `q4_family`: a tensor-core Q4_K family of the same profile phase with
    /// room for one more product).
    pub fn mixed_launch(&self, q6_on_tc: bool, q4_family: bool) -> MixedLaunch {
        if self.fusion && q6_on_tc && q4_family {
            MixedLaunch::Mixed
        } else {
            MixedLaunch::Separate
        }
    }

    /// Whether the next block's first products take the norm of their input as their prologue:
    /// decode rows of at most `NORM_MAX_IN` values (whole super-blocks) whose products are one
    /// tensor-core Q4_K launch family on the tall kernel, whose warps then prepare at most
    /// `NORM_MAX_SB_PER_WARP` super-blocks each. On the H200 (tg128) the 35B-A3B's tall launches
    /// went 400.8 -> 406.8 t/s; NORM versions of the mixed Q6_K + Q4_K launch (three waves, each
    /// paying the prologue) and of the 9B's tall one (4 super-blocks per warp) measured slower.
    pub fn normed_group(&self, g: &GroupShape<'_>) -> NormedGroup {
        let widest = g.products.iter().map(|p| p.1).max().unwrap_or(0);
        let geometry = tc_geometry(GgmlType::Q4K, widest, false, true, false);
        let warps = geometry.threads as usize / 32;
        let fits = self.fusion
            && decode_rows(g.t)
            && g.n_in.is_multiple_of(TC_UNIT)
            && (TC_UNIT..=NORM_MAX_IN).contains(&g.n_in)
            && !g.products.is_empty()
            && g.products.iter().all(|&(ty, n_out)| ty == GgmlType::Q4K && n_out > 0)
            && g.one_tc_launch
            && geometry.kernel == TcKernel::Tall
            && (g.n_in / TC_UNIT).div_ceil(warps) <= NORM_MAX_SB_PER_WARP;
        if fits {
            NormedGroup::Prologue
        } else {
            NormedGroup::Separate
        }
    }

    /// A residual add and norm after a product into `t` rows of `d` values (`numel` in the norm's
    /// output): in the product where it runs on the tensor cores (`product_on_tc`, whose plain
    /// epilogue adds into its output) and the norm can read whole rows over slices.
    pub fn add_norm(&self, t: usize, d: usize, numel: usize, product_on_tc: bool) -> AddNorm {
        if self.fusion && product_on_tc && self.norm_reads_whole_rows(t, d, numel) {
            AddNorm::InProduct { rows: t }
        } else {
            AddNorm::Composed
        }
    }

    /// Whether the norm of a finished residual row (`t` rows of `d` values, `numel` in its
    /// output) runs over slices with no grid barrier (norm.cu `rms_norm_slices_whole`): a decode
    /// shape of whole slices.
    pub fn norm_reads_whole_rows(&self, t: usize, d: usize, numel: usize) -> bool {
        decode_rows(t)
            && numel == t * d
            && self.row_blocks(t, d, false) == RowBlocks::Slices
            && self.batch(t, false) == Batch::Decode
    }

    /// Where a MoE layer's shared expert runs on the decode path: inside the routed experts'
    /// launches where it has their hidden width and formats.
    pub fn shared_expert(&self, s: &SharedExpertShape) -> SharedExpert {
        let fits = self.fusion
            && decode_rows(s.t)
            && s.k > 0
            && s.d > 0
            && s.n_ff > 0
            && s.n_ff_shared == s.n_ff
            && s.formats_match;
        if fits {
            SharedExpert::InExpertLaunches
        } else {
            SharedExpert::OwnLaunches
        }
    }

    /// `moe_ffn` in one launch for one token whose router and shared gate are F32 rows, whose
    /// experts the rank routing takes and whose normed row reads whole over slices.
    pub fn moe_ffn(&self, m: &MoeFfnShape) -> MoeFfn {
        let fits = self.fusion
            && m.router_f32
            && m.t == 1
            && m.d <= NORM_ROUTE_MAX_D
            && m.n_experts <= NORM_ROUTE_MAX_EXPERTS
            && self.norm_reads_whole_rows(m.t, m.d, m.numel);
        if fits {
            MoeFfn::NormRoute
        } else {
            MoeFfn::Ops
        }
    }

    /// `gdn_recurrent_step` in one launch where gdn_step.cu takes the shape: one token, 4 taps,
    /// key heads of at most 128 (a multiple of 32), value heads a multiple of 32 dividing 256,
    /// whole slices of 256 value outputs, and slice counters for every key head and slice.
    pub fn gdn_step(&self, s: &GdnStepShape) -> GdnStep {
        let GdnDims { hk, hv, dk, dv } = s.dims;
        let fits = self.fusion
            && s.t == 1
            && s.taps == GDN_STEP_TAPS
            && dk.is_multiple_of(32)
            && (32..=128).contains(&dk)
            && dv.is_multiple_of(32)
            && dv > 0
            && 256 % dv == 0
            && s.norm_group == dv
            && (hv * dv).is_multiple_of(256)
            && hk + hv * dv / 256 <= SYNC_COUNTERS;
        if fits {
            GdnStep::OneLaunch
        } else {
            GdnStep::Ops
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::{Q4K, Q6K, Q8_0};

    fn h200(fusion: bool) -> Policy {
        Policy {
            device: Device::H200,
            precision: Precision::Exact,
            fusion,
        }
    }

    /// The real models' shapes (src/synth/shapes.rs): the 9B and the 35B-A3B.
    struct Model {
        n_embd: usize,
        gdn: GdnDims,
        /// Rows of the GDN input projections: qkv (conv dim), z, beta, alpha.
        gdn_rows: [usize; 4],
        /// Attention q (with its gate), k, v rows.
        attn_rows: [usize; 3],
        n_ff: usize,
        experts: usize,
        k: usize,
        n_ff_exp: usize,
        vocab: usize,
    }

    const Q9B: Model = Model {
        n_embd: 4096,
        gdn: GdnDims {
            hk: 16,
            hv: 32,
            dk: 128,
            dv: 128,
        },
        gdn_rows: [2 * 16 * 128 + 32 * 128, 32 * 128, 32, 32],
        attn_rows: [2 * 16 * 256, 4 * 256, 4 * 256],
        n_ff: 12288,
        experts: 0,
        k: 0,
        n_ff_exp: 0,
        vocab: 248_320,
    };

    const Q35B: Model = Model {
        n_embd: 2048,
        gdn: GdnDims {
            hk: 16,
            hv: 32,
            dk: 128,
            dv: 128,
        },
        gdn_rows: [2 * 16 * 128 + 32 * 128, 32 * 128, 32, 32],
        attn_rows: [2 * 16 * 256, 2 * 256, 2 * 256],
        n_ff: 0,
        experts: 256,
        k: 8,
        n_ff_exp: 512,
        vocab: 248_320,
    };

    /// The row bytes of `n` values of `ty`.
    fn row_bytes(ty: GgmlType, n: usize) -> usize {
        ty.row_size(n as u64).unwrap() as usize
    }

    fn dense(ty: GgmlType, n_in: usize) -> MvShape {
        MvShape {
            ty,
            ty2: None,
            n_in,
            row_bytes: row_bytes(ty, n_in),
            expert_bytes: 0,
            shared: false,
            aligned: true,
            x_rows: 1,
            grid_y_max: 65_535,
        }
    }

    fn gdn_step_shape(m: &Model) -> GdnStepShape {
        GdnStepShape {
            t: 1,
            taps: 4,
            norm_group: m.gdn.dv,
            dims: m.gdn,
        }
    }

    #[test]
    fn gdn_decode_takes_the_one_launch_step() {
        for m in [&Q9B, &Q35B] {
            assert_eq!(h200(true).gdn_step(&gdn_step_shape(m)), GdnStep::OneLaunch);
            assert_eq!(h200(false).gdn_step(&gdn_step_shape(m)), GdnStep::Ops);
            // A prompt, or another conv width, takes the ops.
            let prompt = GdnStepShape {
                t: 2,
                ..gdn_step_shape(m)
            };
            assert_eq!(h200(true).gdn_step(&prompt), GdnStep::Ops);
            let taps = GdnStepShape {
                taps: 3,
                ..gdn_step_shape(m)
            };
            assert_eq!(h200(true).gdn_step(&taps), GdnStep::Ops);
        }
    }

    #[test]
    fn moe_decode_takes_norm_route() {
        let d = Q35B.n_embd;
        let s = MoeFfnShape {
            t: 1,
            d,
            numel: d,
            n_experts: Q35B.experts,
            router_f32: true,
        };
        assert_eq!(h200(true).moe_ffn(&s), MoeFfn::NormRoute);
        assert_eq!(h200(false).moe_ffn(&s), MoeFfn::Ops);
        // Two tokens, a quantized router, or more experts than the rank routing takes: the ops.
        assert_eq!(
            h200(true).moe_ffn(&MoeFfnShape {
                t: 2,
                numel: 2 * d,
                ..s
            }),
            MoeFfn::Ops
        );
        assert_eq!(h200(true).moe_ffn(&MoeFfnShape { router_f32: false, ..s }), MoeFfn::Ops);
        assert_eq!(h200(true).moe_ffn(&MoeFfnShape { n_experts: 2048, ..s }), MoeFfn::Ops);
    }

    #[test]
    fn shared_expert_joins_the_routed_experts_in_decode() {
        let s = SharedExpertShape {
            t: 1,
            k: Q35B.k,
            d: Q35B.n_embd,
            n_ff: Q35B.n_ff_exp,
            n_ff_shared: 512,
            formats_match: true,
        };
        assert_eq!(h200(true).shared_expert(&s), SharedExpert::InExpertLaunches);
        assert_eq!(h200(false).shared_expert(&s), SharedExpert::OwnLaunches);
        let prompt = SharedExpertShape { t: 5, ..s };
        assert_eq!(h200(true).shared_expert(&prompt), SharedExpert::OwnLaunches);
        let mixed = SharedExpertShape {
            formats_match: false,
            ..s
        };
        assert_eq!(h200(true).shared_expert(&mixed), SharedExpert::OwnLaunches);
    }

    #[test]
    fn add_norm_goes_into_the_product_in_decode() {
        for m in [&Q9B, &Q35B] {
            let d = m.n_embd;
            assert_eq!(h200(true).add_norm(1, d, d, true), AddNorm::InProduct { rows: 1 });
            assert_eq!(h200(true).add_norm(4, d, 4 * d, true), AddNorm::InProduct { rows: 4 });
            assert_eq!(h200(false).add_norm(1, d, d, true), AddNorm::Composed);
            // The f32 kernels do not add into their output; prompts compose.
            assert_eq!(h200(true).add_norm(1, d, d, false), AddNorm::Composed);
            assert_eq!(h200(true).add_norm(5, d, 5 * d, true), AddNorm::Composed);
        }
    }

    #[test]
    fn decode_norms_run_over_slices() {
        let p = h200(true);
        for d in [Q9B.n_embd, Q35B.n_embd] {
            assert_eq!(p.row_blocks(1, d, true), RowBlocks::Slices);
            assert_eq!(p.row_blocks(4, d, true), RowBlocks::Slices);
        }
        // A row of more than 32 slices cannot meet at the barrier; 100 values are no slices.
        assert_eq!(p.row_blocks(1, 256 * 33, true), RowBlocks::Rows);
        assert_eq!(p.row_blocks(1, 256 * 33, false), RowBlocks::Slices);
        assert_eq!(p.row_blocks(1, 100, false), RowBlocks::Rows);
        // Fewer SMs than blocks: no barrier kernel.
        let small = Policy {
            device: Device { sms: 8, cc: (8, 6) },
            ..p
        };
        assert_eq!(small.row_blocks(1, 4096, true), RowBlocks::Rows);
    }

    #[test]
    fn products_of_the_models_take_the_tensor_cores() {
        for ty in [Q4K, Q8_0] {
            for n_in in [Q9B.n_embd, Q35B.n_embd, Q9B.n_ff] {
                assert_eq!(mv_kernels(&dense(ty, n_in)), MvKernels::TensorCores(ty), "{ty} {n_in}");
            }
        }
        // Q6_K's plain loads take rows of whole groups of 8 super-blocks; its `_sh_` kernels any
        // even address (the 35B-A3B's 420-byte expert rows).
        assert_eq!(mv_kernels(&dense(Q6K, 4096)), MvKernels::TensorCores(Q6K));
        assert_eq!(mv_kernels(&dense(Q6K, 512)), MvKernels::F32);
        let experts = MvShape {
            expert_bytes: 2048 * row_bytes(Q6K, 512),
            shared: true,
            x_rows: 9,
            ..dense(Q6K, 512)
        };
        assert_eq!(mv_kernels(&experts), MvKernels::TensorCores(Q6K));
        // Other formats, a SwiGLU of two formats, unaligned weights: the f32 kernels.
        assert_eq!(mv_kernels(&dense(GgmlType::Q5K, 4096)), MvKernels::F32);
        let glu = MvShape {
            ty2: Some(Q6K),
            ..dense(Q4K, 4096)
        };
        assert_eq!(mv_kernels(&glu), MvKernels::F32);
        let unaligned = MvShape {
            aligned: false,
            ..dense(Q4K, 4096)
        };
        assert_eq!(mv_kernels(&unaligned), MvKernels::F32);
    }

    #[test]
    fn tensor_core_geometry_follows_the_rows() {
        use TcKernel::*;
        let k = |ty, n_out, glu, dense, shared| tc_geometry(ty, n_out, glu, dense, shared).kernel;
        // The 9B: qkv (8192) and the FFN's SwiGLU (12288) tall, z and the attention output plain.
        assert_eq!(k(Q4K, Q9B.gdn_rows[0], false, true, false), Tall);
        assert_eq!(k(Q4K, Q9B.gdn_rows[1], false, true, false), Plain);
        assert_eq!(k(Q4K, Q9B.n_ff, true, true, false), GluTall);
        assert_eq!(k(Q4K, Q9B.attn_rows[0], false, true, false), Tall);
        assert_eq!(k(Q4K, Q9B.vocab, false, true, false), Tall);
        assert_eq!(k(Q8_0, Q9B.n_ff, true, true, false), GluTall);
        assert_eq!(tc_geometry(Q8_0, Q9B.n_ff, true, true, false).rows_per_block, 16);
        assert_eq!(k(Q8_0, Q9B.n_embd, false, true, false), Mid);
        assert_eq!(k(Q8_0, Q9B.attn_rows[1], false, true, false), Plain);
        assert_eq!(k(Q6K, Q9B.gdn_rows[0], false, true, false), Plain);
        // The 35B-A3B's experts with their shared expert: 4-warp Q4_K SwiGLU blocks.
        let sh = tc_geometry(Q4K, Q35B.n_ff_exp, true, false, true);
        assert_eq!((sh.kernel, sh.threads), (GluShared, 128));
        assert_eq!(k(Q8_0, Q35B.n_embd, false, false, true), Shared);
        // Experts without a shared expert are not dense: Q8_0 stays on the plain kernel.
        assert_eq!(k(Q8_0, 16_384, false, false, false), Plain);
        for g in [sh, tc_geometry(Q4K, 100, false, true, false)] {
            assert!(g.rows_per_block.is_multiple_of(16) && g.threads.is_multiple_of(32));
        }
    }

    #[test]
    fn prefetch_only_small_dense_launches() {
        let q4 = |rows: usize, n_in: usize| rows * row_bytes(Q4K, n_in);
        // The 9B's attention output (4096 x 4096) prefetches; its LM head does not.
        assert!(tc_dense_prefetch(q4(Q9B.n_embd, Q9B.n_embd)));
        assert!(!tc_dense_prefetch(q4(Q9B.vocab, Q9B.n_embd)));
    }

    /// The group of a GDN layer's input projections (qkv, z, beta, alpha) in `formats`.
    fn gdn_group(m: &Model, formats: [GgmlType; 4]) -> Vec<(GgmlType, usize)> {
        formats.into_iter().zip(m.gdn_rows).collect()
    }

    fn shape(products: &[(GgmlType, usize)], n_in: usize, one_tc_launch: bool) -> GroupShape<'_> {
        GroupShape {
            t: 1,
            n_in,
            products,
            one_tc_launch,
        }
    }

    #[test]
    fn q4_k_groups_take_the_normed_tall_kernel_where_it_pays() {
        let all_q4 = gdn_group(&Q35B, [Q4K; 4]);
        // The 35B-A3B: 2048 inputs, 2 super-blocks per warp of the tall kernel.
        let g = shape(&all_q4, Q35B.n_embd, true);
        assert_eq!(h200(true).normed_group(&g), NormedGroup::Prologue);
        assert_eq!(h200(false).normed_group(&g), NormedGroup::Separate);
        // The 9B: 4096 inputs, 4 per warp: measured slower, not taken.
        let all_q4 = gdn_group(&Q9B, [Q4K; 4]);
        let g = shape(&all_q4, Q9B.n_embd, true);
        assert_eq!(h200(true).normed_group(&g), NormedGroup::Separate);
        // Q4_K_M's Q6_K qkv: the mixed launch, not the normed one.
        let mixed = gdn_group(&Q35B, [Q6K, Q4K, Q4K, Q4K]);
        let g = shape(&mixed, Q35B.n_embd, false);
        assert_eq!(h200(true).normed_group(&g), NormedGroup::Separate);
        // Q8_0 products: separate.
        let q8 = gdn_group(&Q35B, [Q8_0; 4]);
        let g = shape(&q8, Q35B.n_embd, true);
        assert_eq!(h200(true).normed_group(&g), NormedGroup::Separate);
        // The attention layer's q, k, v (8192 + 512 + 512 rows): tall, taken.
        let attn: Vec<_> = Q35B.attn_rows.iter().map(|&r| (Q4K, r)).collect();
        let g = shape(&attn, Q35B.n_embd, true);
        assert_eq!(h200(true).normed_group(&g), NormedGroup::Prologue);
        // A prompt: separate.
        let g = GroupShape {
            t: 5,
            ..shape(&all_q4, Q35B.n_embd, true)
        };
        assert_eq!(h200(true).normed_group(&g), NormedGroup::Separate);
    }

    #[test]
    fn groups_share_launches_unless_fusion_is_off() {
        assert_eq!(h200(true).group_launch(1, 4096), GroupLaunch::Families);
        assert_eq!(h200(true).group_launch(4, 2048), GroupLaunch::Families);
        assert_eq!(h200(true).group_launch(5, 4096), GroupLaunch::PerProduct);
        assert_eq!(h200(false).group_launch(1, 4096), GroupLaunch::PerProduct);
        assert_eq!(h200(true).mixed_launch(true, true), MixedLaunch::Mixed);
        assert_eq!(h200(false).mixed_launch(true, true), MixedLaunch::Separate);
        assert_eq!(h200(true).mixed_launch(false, true), MixedLaunch::Separate);
    }

    #[test]
    fn batches_take_the_tensor_cores_only_in_the_fast_tier() {
        let exact = h200(true);
        let fast = Policy {
            precision: Precision::Fast,
            ..exact
        };
        assert_eq!(exact.batch(1, false), Batch::Decode);
        assert_eq!(exact.batch(512, false), Batch::Exact);
        assert_eq!(fast.batch(4, false), Batch::Decode);
        assert_eq!(fast.batch(5, false), Batch::TensorCores);
        assert_eq!(fast.batch(512, true), Batch::Exact);
        assert_eq!(gemm_activations(Q4K), Some(GemmActivations::F16));
        assert_eq!(gemm_activations(GgmlType::Bf16), Some(GemmActivations::HiLo));
        assert_eq!(gemm_activations(GgmlType::F32), None);
    }

    #[test]
    fn steps_of_rows_are_recorded_where_their_products_stay() {
        let exact = h200(true);
        let fast = Policy {
            precision: Precision::Fast,
            ..exact
        };
        for t in [1, 4, 5, 64, 256] {
            assert!(exact.record_rows(t), "exact t={t}");
        }
        assert!(fast.record_rows(4));
        assert!(!fast.record_rows(5));
        assert!(!fast.record_rows(256));
    }
}
