//! What the adapter can do, and which kernel variants this backend therefore runs: the ONE place
//! where fast paths are chosen. Everything else asks `Caps`.
//!
//! | path | needs | else |
//! |---|---|---|
//! | subgroup reductions (`reduce_sg.wgsl`) | `SUBGROUP` | workgroup-memory trees (`reduce_plain.wgsl`) |
//! | tensor-core prefill (`matmul_coop.wgsl`, or `matmul_coop2.wgsl` with `RILL_WGPU_COOP=2`; f16 inputs) | `EXPERIMENTAL_COOPERATIVE_MATRIX` with a 16x16x16 f16 -> f32 configuration, `SHADER_F16`, `SUBGROUP`, and `Precision::Fast` | the f32 tiled kernel |
//! | per-dispatch GPU timestamps (`RILL_PROFILE=1`) | `TIMESTAMP_QUERY_INSIDE_PASSES` | a submit-and-wait wall clock per dispatch |
//! | `matmul_group` of up to 4 (3) same-format products in one decode dispatch (`matvec_group.wgsl`) | 9 (7) storage buffers per stage | one dispatch per product |
//! | `gdn_conv_gates` in one dispatch (`gdn_conv_gates.wgsl`) | 10 storage buffers per stage | `gdn_gates` + `conv1d_silu_l2qk` |
//! | `attn_qk_prep` in one dispatch (`attn_qk_prep.wgsl`) | 11 storage buffers per stage | q and k/v halves (`attn_prep_q.wgsl`, `attn_prep_kv.wgsl`; 7), else the six separate ops |
//! | prefill attention (more than `SPLIT_MAX_ROWS` query rows) over key tiles staged once for a block of 32 query rows of one KV head (`attention_tiled.wgsl`, `AttTile`) | its workgroup memory (`AttTile::DEFAULT` 25 KiB, `AttTile::SMALL` 16 KiB); not `RILL_WGPU_ATT_TILED=0` | a workgroup per query row over the whole key range (`attention.wgsl`) |
//! | the gated attention's output gate (with `mv_dot`, also the output's planes) in the decode merge of the split key range (`attention_combine_gate.wgsl`) | 4 storage buffers per stage | `attention_combine` + `sigmoid_mul_assign` (+ `mv_dot_prep` before the output projection) |
//! | a decode MoE layer's shared expert inside the routed experts' dispatches, the weighted sum inside the down products (`moe_swiglu_sh.wgsl` + `moe_down_sh.wgsl`) | 7 storage buffers per stage; not `RILL_WGPU_MOE_SHARED=0` | `moe_experts` (gate, up, down, `moe_combine`) + `matmul_swiglu` + `matmul` + `sigmoid_scale_add` |
//! | with the above, the decode MoE routing inside the gate and up dispatch, each workgroup routing its token (`moe_swiglu_route`: `moe_swiglu_sh.wgsl` with `lib_moe_route.wgsl`) | 9 storage buffers per stage and `RILL_WGPU_MOE_ROUTE=1` (off by default: every workgroup's routing costs more than the dispatch it saves, H200 35B-A3B decode 190.3 -> 174.1 t/s, interleaved medians) | `moe_route` + `moe_swiglu_sh` |
//!
//! Tuning knobs, for measuring on a new GPU without a rebuild (`scripts/gpu-wgpu-mv-sweep.sh`):
//! the matrix-vector geometry, `RILL_WGPU_MV_WG` (invocations per workgroup: 64, 128 or 256;
//! default 128), `RILL_WGPU_MV_ROWS` (rows per invocation: 1, 2, 4 or 8; default 2) and
//! `RILL_WGPU_MV_LANES` (invocations per row group, a power of two up to the workgroup; default
//! 32, fewer for short rows); per shape, `RILL_WGPU_MV_ROWS_TALL` (rows per invocation of
//! products with at least `kernels::MV_TALL_ROWS` rows, the LM head: default 4),
//! `RILL_WGPU_MV_ROWS_SWIGLU` (of the fused SwiGLU products: default 4) and
//! `RILL_WGPU_MV_LANES_LONG` (lanes per row group of rows of at least `kernels::MV_LONG_UNITS`
//! units, the FFN down products: default 64), `RILL_WGPU_MV_MIN_WG` (a product with fewer
//! workgroups than this doubles its lanes per row group, up to the workgroup, until it has them:
//! `kernels::mv_lanes_spread`; default `MV_MIN_WG_DEFAULT`, 0 = off), each following
//! `RILL_WGPU_MV_ROWS` / `RILL_WGPU_MV_LANES` when only those are set (H200, examples/mv_bench: the Q6_K head 357 -> 323
//! us with 4 rows, the Q4_K SwiGLU 27.2 -> 26.0, the Q4_K down 20.6 -> 17.6 with 64 lanes, where
//! the other shapes lose with either; formats decoded element by element take at most
//! `kernels::MV_GENERIC_MAX_ROWS` rows); `RILL_WGPU_SUBMIT_EVERY` (dispatches per submission,
//! 1..=256; default 64) and `RILL_WGPU_SUBMIT_FIRST` (dispatches in a decode step's first
//! submission, so that the GPU, idle while the host read the last token, starts before the step
//! is encoded; 1..=256, default `SUBMIT_FIRST_DEFAULT`) and `RILL_WGPU_SUBMIT_AHEAD` (dispatches
//! per submission of a decode step that starts while the device still runs the step before, the
//! executor one step ahead: 1..=256, default `SUBMIT_AHEAD_DEFAULT`). Values the kernels do not
//! take keep the default. `RILL_WGPU_FUSE=0` turns the fused decode dispatches of the table above off (one
//! dispatch per product and per step, as before them), to measure what they gain; `RILL_WGPU_MOE_SHARED=0` only the MoE shared expert's
//! (and the routing's); `RILL_WGPU_ATT_GATE=0` only the attention gate's and `RILL_WGPU_SWIGLU_XQ=0`
//! only the SwiGLU's planes (below); `RILL_WGPU_ATT_TILED=0` runs the prefill attention a workgroup
//! per query row (`attention.wgsl`) instead of the tiled kernel (for A/B runs and tests);
//! `RILL_WGPU_MOE_ROUTE=1` turns the MoE routing's on, off by
//! default (slower on the H200: measured in interleaved runs, scripts/gpu-wgpu-ab.sh).
//! `RILL_WGPU_MV_DOT=1` (or `0`) turns the Q4_K and Q6_K
//! decode products on packed integer dot products on (off). By default they are on where the
//! adapter runs `dot4I8Packed` natively (`native_dot4`): the RMS norms write their output's planes
//! from registers (`*_rms_norm_dot`, ~3 us more than the plain norm), so does the attention's
//! gated output, an input neither writes costs one more dispatch (`mv_dot_prep`, ~12 us in the H200
//! profile, a few us of wall time), and the products get 20-30% faster (H200,
//! 9B q4_k_m decode 159 -> 188 t/s, 35B-A3B 155 -> 161). Elsewhere (lavapipe, the tests' forced
//! runs, browsers) naga would write a polyfill, so they stay off unless forced.
//!
//! The tensor-core prefill kernel (`scripts/gpu-wgpu-prefill-sweep.sh`): `RILL_WGPU_COOP` picks
//! it (1: `matmul_coop.wgsl`, 64 x 64 tiles; 2: `matmul_coop2.wgsl`; default `COOP_KERNEL_DEFAULT`),
//! and for the second `RILL_WGPU_COOP_TILE=RxTxK[/SRxST]` its geometry (output rows x tokens per
//! workgroup, k step, and optionally each subgroup's piece, 64x32 or 32x64: see `CoopTile`;
//! default 128x128x32, or 128x64x32 where workgroup memory is short), `RILL_WGPU_COOP_BUF` its staging buffers (2: double-buffered k steps, one
//! barrier each; 1: one buffer, two barriers; default 2) and `RILL_WGPU_COOP_DIRECT=0` stores full
//! tiles through workgroup memory like the edges instead of straight from the accumulators. A
//! geometry the kernel or the device does not take keeps the default.
//!
//! `RILL_WGPU_PLAIN=1` forces every plain path (what the browser runs: wgpu's web backend has no
//! subgroups), so tests cover both on one machine; `RILL_WGPU_MAX_STORAGE=N` (at least 8, WebGPU's
//! guarantee) pretends the adapter allows only N storage buffers per kernel, as browsers' do, so
//! the fallbacks of the fused dispatches are tested too. `RILL_WGPU_COOP_EMULATE=1` (tests only) runs
//! the tensor-core kernel's tiling and f16 staging with the matrix products done by plain code,
//! so a machine without cooperative matrices (lavapipe) still checks everything but the
//! cooperative built-ins themselves.
//!
//! Shaders are compiled without the checks naga would add (index clamps on every array and
//! buffer access, a counter in every loop): they are this crate's own code, every loop is
//! bounded by its parameters and every index is in range by construction, and Vulkan's robust
//! buffer access still guards the buffers. `RILL_WGPU_SHADER_CHECKS=1` puts the checks back (to
//! tell a kernel bug from a driver one, and so tests run both ways).

use super::kernels;
use crate::backend::Precision;

/// Size of the cooperative-matrix tiles the coop kernel uses (`coop_mat16x16`).
const COOP_SIZE: u32 = 16;

/// How the tensor-core prefill kernel runs, if at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coop {
    /// The f32 tiled kernel (strict tier).
    Off,
    /// `coop_mat16x16<f16>` products (f16-rounded tier).
    On,
    /// The coop kernel's structure with plain products (f16-rounded tier; tests).
    Emulated,
}

/// How `attn_qk_prep` runs: its kernels need 11 storage buffers in one dispatch, 7 in two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prep {
    /// The six separate ops.
    Separate,
    /// The q heads and the k/v heads in a dispatch each.
    Halves,
    /// One dispatch.
    One,
}

/// Which tensor-core prefill kernel `RILL_WGPU_COOP` picks when unset: 2 (`matmul_coop2.wgsl`),
/// 2.6x faster than `matmul_coop.wgsl` end to end on the H200 (9B Q4_K_M pp512 651 -> 1,664 t/s,
/// scripts/gpu-wgpu-prefill-sweep.sh, BENCHMARKS.md).
pub(crate) const COOP_KERNEL_DEFAULT: u32 = 2;

/// The geometry of `matmul_coop2.wgsl` (WGSL `C2_*`, generated in kernels.rs): each workgroup
/// computes `rows` x `toks` outputs in k steps of `k`, as subgroups of 32 invocations that each
/// own a `sg_rows` x `sg_toks` piece, eight 16 x 16 accumulators (64 x 32 or 32 x 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CoopTile {
    pub rows: u32,
    pub toks: u32,
    pub k: u32,
    pub sg_rows: u32,
    pub sg_toks: u32,
    /// Staging buffers: 2 overlaps one k step's products with the next step's staging (one
    /// barrier per step), 1 stages in place (two barriers per step).
    pub bufs: u32,
    /// Full tiles are stored straight from the accumulators to the output (else through
    /// workgroup memory, as the edges always are).
    pub direct: bool,
}

/// Invocations of a subgroup in `matmul_coop2.wgsl` (NVIDIA's; the cooperative-matrix kernels
/// assume it).
const COOP_SUBGROUP: u32 = 32;

impl CoopTile {
    /// The H200's best of the sweep (128 x 128 x 32, two buffers: 48 KiB of workgroup memory).
    pub const DEFAULT: CoopTile = CoopTile {
        rows: 128,
        toks: 128,
        k: 32,
        sg_rows: 64,
        sg_toks: 32,
        bufs: 2,
        direct: true,
    };

    /// For devices with less workgroup memory than the default needs (22 KiB; lavapipe has 32).
    pub const SMALL: CoopTile = CoopTile {
        rows: 64,
        toks: 64,
        ..CoopTile::DEFAULT
    };

    /// `RxTxK` or `RxTxK/SRxST` (the `RILL_WGPU_COOP_TILE` knob; the piece defaults to 64 x 32
    /// rows x tokens). Not checked against what the kernel takes (`valid`).
    pub fn parse(s: &str) -> Option<CoopTile> {
        let nums = |s: &str| -> Option<Vec<u32>> { s.split('x').map(|n| n.trim().parse().ok()).collect() };
        let (tile, piece) = match s.split_once('/') {
            Some((t, p)) => (t, Some(p)),
            None => (s, None),
        };
        let (rows, toks, k) = match nums(tile)?[..] {
            [r, t, k] => (r, t, k),
            _ => return None,
        };
        let (sg_rows, sg_toks) = match piece.map(nums) {
            None => (64, 32),
            Some(Some(p)) if p.len() == 2 => (p[0], p[1]),
            Some(_) => return None,
        };
        Some(CoopTile {
            rows,
            toks,
            k,
            sg_rows,
            sg_toks,
            ..CoopTile::DEFAULT
        })
    }

    pub fn subgroups(&self) -> u32 {
        (self.rows / self.sg_rows) * (self.toks / self.sg_toks)
    }

    /// Invocations per workgroup (WGSL `C2_WG`).
    pub fn invocations(&self) -> u32 {
        COOP_SUBGROUP * self.subgroups()
    }

    /// Units of 8 weights (`C2_WU`) and of 8 x values (`C2_XU`) each invocation stages per k step.
    pub fn w_units(&self) -> u32 {
        self.rows * self.k / 8 / self.invocations()
    }

    pub fn x_units(&self) -> u32 {
        self.toks * self.k / 8 / self.invocations()
    }

    /// Row strides (in f16) of the staged x tile (tokens x k) and weight tile (rows x k): 16
    /// bytes of padding put the 8 row segments of 16 bytes a cooperative load reads at once in
    /// different banks, and keep the strides whole 16 bytes (cooperative loads need that).
    pub fn a_stride(&self) -> u32 {
        self.k + 8
    }

    pub fn b_stride(&self) -> u32 {
        self.k + 8
    }

    /// Workgroup memory: the staging buffers, and a 16 x `COOP_SCRATCH_STRIDE` f32 scratch per
    /// subgroup (zeros for the accumulators, the edges' write-out).
    pub fn workgroup_bytes(&self) -> u32 {
        2 * self.bufs * (self.toks * self.a_stride() + self.rows * self.b_stride())
            + 4 * self.subgroups() * 16 * COOP_SCRATCH_STRIDE
    }

    /// What `matmul_coop2.wgsl` takes: whole 16 x 16 accumulators, eight per subgroup (a 64 x 32
    /// or 32 x 64 piece), 2, 4 or 8 subgroups, whole units of staging per invocation (1, 2, 4 or
    /// 8 of each: the kernel keeps them in named registers), one or two buffers.
    pub fn valid(&self) -> bool {
        let piece = matches!((self.sg_rows, self.sg_toks), (64, 32) | (32, 64));
        let dims =
            [64, 128, 256].contains(&self.rows) && [32, 64, 128].contains(&self.toks) && [32, 64].contains(&self.k);
        if !(piece && dims && self.rows.is_multiple_of(self.sg_rows) && self.toks.is_multiple_of(self.sg_toks)) {
            return false;
        }
        let wg = self.invocations();
        let units = |n: u32| n.is_multiple_of(8 * wg) && [1, 2, 4, 8].contains(&(n / 8 / wg));
        [2, 4, 8].contains(&self.subgroups())
            && units(self.rows * self.k)
            && units(self.toks * self.k)
            && [1, 2].contains(&self.bufs)
    }

    /// `valid`, and the device holds its workgroup.
    fn fits(&self, limits: &wgpu::Limits) -> bool {
        self.valid()
            && self.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
            && self.invocations() <= limits.max_compute_invocations_per_workgroup
    }
}

/// The geometry of `attention_tiled.wgsl` besides its fixed 32 query rows x 64 keys per tile
/// (`kernels::ATT_T_*`): the head dims of q and k staged per step of the scores (`dc`, WGSL
/// `ATT_T_DC`) and the V rows of head dim `ATT_MAX_D` one staging holds (`v_rows`; the buffer is
/// shared with the q and k chunks, `stage_vec4s`, WGSL `ATT_T_SH`, and holds more rows of a
/// smaller head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttTile {
    pub dc: u32,
    pub v_rows: u32,
}

impl AttTile {
    /// 25,472 bytes of workgroup memory (desktop GPUs offer 32 KiB or more).
    pub const DEFAULT: AttTile = AttTile { dc: 16, v_rows: 16 };
    /// 16,256 bytes: within WebGPU's default 16 KiB (twice the barriers per head dim, 7 V rows).
    pub const SMALL: AttTile = AttTile { dc: 8, v_rows: 7 };

    /// vec4s of the staging buffer: the q and k chunks (rows padded by one vec4) or the V rows.
    pub fn stage_vec4s(&self) -> u32 {
        use kernels::{ATT_MAX_D, ATT_T_BK, ATT_T_BQ};
        ((ATT_T_BQ + ATT_T_BK) * (self.dc / 4 + 1)).max(self.v_rows * ATT_MAX_D / 4)
    }

    /// Workgroup memory: the staging buffer, the tile's probabilities (rows padded by one), the
    /// softmax's partial maxima and sums, each row's rescale factor and query offset.
    pub fn workgroup_bytes(&self) -> u32 {
        use kernels::{ATT_T_BK, ATT_T_BQ, ATT_T_WG};
        16 * self.stage_vec4s() + 4 * (ATT_T_BQ * (ATT_T_BK + 1) + ATT_T_WG + 2 * ATT_T_BQ)
    }
}

/// Row stride (f32) of a subgroup's scratch in `matmul_coop2.wgsl`: 64 bytes, whole 16 bytes
/// (no padding: the scratch carries only the zeros and the edge tiles, and the default geometry
/// then needs exactly 48 KiB).
pub(crate) const COOP_SCRATCH_STRIDE: u32 = 16;

/// The adapter's features and limits that select kernels, fixed when the device is created.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    /// Subgroup operations in compute shaders.
    pub subgroups: bool,
    /// The adapter's subgroup size where it has one fixed size (lavapipe 8 with AVX2, NVIDIA 32),
    /// else 0: kernels that give each subgroup a row size their blocks by it.
    pub subgroup_size: u32,
    pub coop: Coop,
    /// With `coop` on (or emulated): `matmul_coop2.wgsl` and its geometry, else `matmul_coop.wgsl`.
    pub coop2: Option<CoopTile>,
    /// `ComputePass::write_timestamp` (profiling inside one pass).
    pub timestamps_in_passes: bool,
    /// Largest storage binding in bytes (weights larger than this are bound in pieces).
    pub max_binding: u64,
    pub max_buffer: u64,
    /// Alignment of a storage binding's offset (a piece starts on a multiple of it).
    pub binding_align: u64,
    /// Alignment of a dynamic uniform offset (the parameter slots).
    pub uniform_align: u64,
    pub max_workgroups_per_dim: u32,
    /// Storage buffers one kernel may bind (`max_storage_buffers_per_shader_stage`).
    pub max_storage: u32,
    /// Most products of one input one `matmul_group` dispatch takes (1: a dispatch per product).
    pub mv_group: u32,
    /// `gdn_conv_gates` as one dispatch.
    pub fused_gates: bool,
    /// The gated attention's output gate (and, with `mv_dot`, the output's planes) applied by
    /// the dispatch that merges a decode row's split key range (`attention_combine_gate`).
    pub attn_gate: bool,
    /// With `mv_dot`, the dense FFN's one-token SwiGLU writes its output's planes for the down
    /// product (`matvec_swiglu_xq`); off: `matvec_swiglu`, and the down product's `mv_dot_prep`.
    /// On unless `RILL_WGPU_SWIGLU_XQ=0`. Its workgroups own whole 32-row blocks: with 2 rows per
    /// invocation a quarter as many workgroups doing four passes each, which cost more than the
    /// prep dispatch saved (H200 9B q4_k_m, 188.6 t/s against 190.6); with the SwiGLU's 4 rows
    /// (`mv_rows_swiglu`) two passes, and it wins: tg128 213.2 against 205.8 (interleaved medians).
    pub swiglu_xq: bool,
    /// A decode MoE layer's shared expert as one more expert per token inside the routed
    /// experts' dispatches (`moe_swiglu_sh` + `moe_down_sh`); off: the trait's composition.
    pub moe_shared: bool,
    /// With `moe_shared`, the decode MoE layer's routing inside its gate and up dispatch
    /// (`moe_swiglu_route`, two more storage buffers); off: `moe_route` before it. Off unless
    /// `RILL_WGPU_MOE_ROUTE=1`: on the H200 (35B-A3B, 576 workgroups each routing 256 experts)
    /// `moe_swiglu_route` took 80 us a layer in the profile against 68 for the two dispatches.
    pub moe_route: bool,
    /// How `attn_qk_prep` runs.
    pub prep: Prep,
    /// The prefill attention's geometry where it runs tiled (`attention_tiled.wgsl`): the
    /// first of `AttTile::DEFAULT` and `AttTile::SMALL` whose workgroup memory the device has,
    /// unless `RILL_WGPU_ATT_TILED=0`; None: a workgroup per query row (`attention.wgsl`).
    pub att_tiled: Option<AttTile>,
    /// Invocations per matrix-vector workgroup (WGSL `MV_WG`).
    pub mv_wg: u32,
    /// Rows per matrix-vector invocation (WGSL `MV_R`).
    pub mv_rows: u32,
    /// Most invocations per matrix-vector row group (`kernels::mv_lanes`).
    pub mv_lanes: u32,
    /// Rows per invocation of the tall products (`Kernel::MatvecTall`, the LM head).
    pub mv_rows_tall: u32,
    /// Rows per invocation of the fused SwiGLU products (`matvec_swiglu*`).
    pub mv_rows_swiglu: u32,
    /// Lanes per row group of the products whose rows are long (`kernels::mv_lanes`).
    pub mv_lanes_long: u32,
    /// Workgroups a matrix-vector dispatch should have at least (`kernels::mv_lanes_spread`).
    pub mv_min_wg: u32,
    /// Dispatches per submission.
    pub submit_every: u32,
    /// Dispatches in a recorded or replayed step's first submission.
    pub submit_first: u32,
    /// Dispatches per submission of a step that starts while the device still runs the one
    /// before (the executor one step ahead: nothing waits for the first submission).
    pub submit_ahead: u32,
    /// Compile shaders with naga's runtime checks (bounds clamps, loop counters).
    pub shader_checks: bool,
    /// Q4_K and Q6_K decode products on packed integer dot products (`mv_q4_k_dot.wgsl`, x quantized
    /// first by `mv_dot_prep.wgsl`; strict tier): as `RILL_WGPU_MV_DOT` says, by default where
    /// `dot4I8Packed` is native.
    pub mv_dot: bool,
    /// The adapter runs `dot4I8Packed` as one instruction (`native_dot4`; shown by `describe`).
    pub dot4_native: bool,
}

/// Defaults of the tuning knobs, and the most dispatches one submission may hold (its
/// parameter slots).
pub(crate) const MV_WG_DEFAULT: u32 = 128;
pub(crate) const MV_ROWS_DEFAULT: u32 = 2;
pub(crate) const MV_LANES_DEFAULT: u32 = 32;
pub(crate) const MV_ROWS_TALL_DEFAULT: u32 = 4;
pub(crate) const MV_ROWS_SWIGLU_DEFAULT: u32 = 4;
pub(crate) const MV_LANES_LONG_DEFAULT: u32 = 64;
/// H200 (132 SMs), tg128 with the host one step ahead and 256 dispatches per submission: 35B-A3B
/// 222.6 -> 226.3 t/s (its 256-row F32 router: 65 -> 129 workgroups), 9B 233.2 -> 233.6.
pub(crate) const MV_MIN_WG_DEFAULT: u32 = 132;
/// `RILL_WGPU_MV_MIN_WG` at most (more only widens every small product to the workgroup).
pub(crate) const MV_MIN_WG_MAX: u32 = 4096;
pub(crate) const SUBMIT_EVERY_DEFAULT: u32 = 64;
pub(crate) const SUBMIT_EVERY_MAX: u32 = 256;
pub(crate) const SUBMIT_FIRST_DEFAULT: u32 = 16;
/// H200, tg128 with the host one step ahead (interleaved medians): 64 -> 256 dispatches per
/// submission, 35B-A3B 215.1 -> 222.6 t/s, 9B 228.1 -> 233.2 (one step at a time, 256 loses:
/// the device waits for the first submission).
pub(crate) const SUBMIT_AHEAD_DEFAULT: u32 = 256;

/// Environment switches, read once.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Overrides {
    /// `RILL_WGPU_PLAIN=1`: no subgroups, no cooperative matrices.
    pub plain: bool,
    /// `RILL_WGPU_COOP_EMULATE=1`: the coop kernel without cooperative matrices (Fast only).
    pub coop_emulate: bool,
    /// `RILL_WGPU_MAX_BINDING=BYTES`: pretend the storage binding limit is this small (tests of
    /// the piecewise binding on a device with large bindings).
    pub max_binding: Option<u64>,
    /// `RILL_WGPU_MV_WG`, `RILL_WGPU_MV_ROWS`, `RILL_WGPU_MV_LANES`, `RILL_WGPU_SUBMIT_EVERY`
    /// (see the module comment).
    pub mv_wg: Option<u32>,
    pub mv_rows: Option<u32>,
    pub mv_lanes: Option<u32>,
    pub submit_every: Option<u32>,
    /// `RILL_WGPU_MV_ROWS_TALL`, `RILL_WGPU_MV_ROWS_SWIGLU`, `RILL_WGPU_MV_LANES_LONG` (see the
    /// module comment).
    pub mv_rows_tall: Option<u32>,
    pub mv_rows_swiglu: Option<u32>,
    pub mv_lanes_long: Option<u32>,
    /// `RILL_WGPU_MV_MIN_WG` (see the module comment).
    pub mv_min_wg: Option<u32>,
    /// `RILL_WGPU_SUBMIT_FIRST` and `RILL_WGPU_SUBMIT_AHEAD` (see the module comment).
    pub submit_first: Option<u32>,
    pub submit_ahead: Option<u32>,
    /// `RILL_WGPU_SHADER_CHECKS=1`: compile shaders with naga's runtime checks.
    pub shader_checks: bool,
    /// `RILL_WGPU_FUSE=0`: no fused decode dispatches.
    pub no_fuse: bool,
    /// `RILL_WGPU_MOE_SHARED=0`: the MoE shared expert in dispatches of its own (for A/B runs).
    pub no_moe_shared: bool,
    /// `RILL_WGPU_MOE_ROUTE=1`: the decode MoE routing inside the experts' gate/up dispatch
    /// (off by default: slower on the H200, see `Caps::moe_route`).
    pub moe_route: bool,
    /// `RILL_WGPU_SWIGLU_XQ=0`: the dense SwiGLU leaves its output's planes to the down product's
    /// own preparation (for A/B runs and tests).
    pub no_swiglu_xq: bool,
    /// `RILL_WGPU_ATT_GATE=0`: the attention's output gate in a dispatch of its own (for A/B runs).
    pub no_attn_gate: bool,
    /// `RILL_WGPU_ATT_TILED=0`: the prefill attention a workgroup per query row (for A/B runs).
    pub no_att_tiled: bool,
    /// `RILL_WGPU_MAX_STORAGE=N`: pretend the adapter allows only N storage buffers per kernel.
    pub max_storage: Option<u32>,
    /// `RILL_WGPU_COOP`, `RILL_WGPU_COOP_TILE`, `RILL_WGPU_COOP_BUF`, `RILL_WGPU_COOP_DIRECT`
    /// (see the module comment; a tile that does not parse is None).
    pub coop_kernel: Option<u32>,
    pub coop_tile: Option<CoopTile>,
    pub coop_bufs: Option<u32>,
    pub coop_staged: bool,
    /// `RILL_WGPU_MV_DOT=0/1`: the packed-integer-dot Q4_K/Q6_K decode products off or on (default
    /// off, see the module's notes).
    pub mv_dot: Option<bool>,
}

/// Storage buffers per kernel WebGPU guarantees (and the most an existing unfused kernel binds).
pub(crate) const MIN_STORAGE: u32 = 8;

fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok())
}

fn env_u32(name: &str) -> Option<u32> {
    env_num(name).and_then(|v| u32::try_from(v).ok())
}

impl Overrides {
    pub fn from_env() -> Overrides {
        Overrides {
            plain: env_flag("RILL_WGPU_PLAIN"),
            coop_emulate: env_flag("RILL_WGPU_COOP_EMULATE"),
            max_binding: env_num("RILL_WGPU_MAX_BINDING"),
            mv_wg: env_u32("RILL_WGPU_MV_WG"),
            mv_rows: env_u32("RILL_WGPU_MV_ROWS"),
            mv_lanes: env_u32("RILL_WGPU_MV_LANES"),
            mv_rows_tall: env_u32("RILL_WGPU_MV_ROWS_TALL"),
            mv_rows_swiglu: env_u32("RILL_WGPU_MV_ROWS_SWIGLU"),
            mv_lanes_long: env_u32("RILL_WGPU_MV_LANES_LONG"),
            mv_min_wg: env_u32("RILL_WGPU_MV_MIN_WG"),
            submit_every: env_u32("RILL_WGPU_SUBMIT_EVERY"),
            submit_first: env_u32("RILL_WGPU_SUBMIT_FIRST"),
            submit_ahead: env_u32("RILL_WGPU_SUBMIT_AHEAD"),
            shader_checks: env_flag("RILL_WGPU_SHADER_CHECKS"),
            no_fuse: std::env::var_os("RILL_WGPU_FUSE").is_some_and(|v| v == "0"),
            no_moe_shared: std::env::var_os("RILL_WGPU_MOE_SHARED").is_some_and(|v| v == "0"),
            moe_route: std::env::var_os("RILL_WGPU_MOE_ROUTE").is_some_and(|v| v == "1"),
            no_swiglu_xq: std::env::var_os("RILL_WGPU_SWIGLU_XQ").is_some_and(|v| v == "0"),
            no_attn_gate: std::env::var_os("RILL_WGPU_ATT_GATE").is_some_and(|v| v == "0"),
            no_att_tiled: std::env::var_os("RILL_WGPU_ATT_TILED").is_some_and(|v| v == "0"),
            max_storage: env_u32("RILL_WGPU_MAX_STORAGE"),
            coop_kernel: env_u32("RILL_WGPU_COOP"),
            coop_tile: std::env::var("RILL_WGPU_COOP_TILE")
                .ok()
                .and_then(|v| CoopTile::parse(&v)),
            coop_bufs: env_u32("RILL_WGPU_COOP_BUF"),
            coop_staged: std::env::var_os("RILL_WGPU_COOP_DIRECT").is_some_and(|v| v == "0"),
            mv_dot: match std::env::var("RILL_WGPU_MV_DOT").ok().as_deref().map(str::trim) {
                Some("1") => Some(true),
                Some("0") => Some(false),
                _ => None,
            },
        }
    }
}

/// Whether the adapter lists a 16x16x16 f16 x f16 -> f32 cooperative-matrix configuration.
pub(crate) fn has_coop16(adapter: &wgpu::Adapter) -> bool {
    use wgpu::wgt::CooperativeScalarType as S;
    adapter.features().contains(coop_features())
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            p.m_size == COOP_SIZE
                && p.n_size == COOP_SIZE
                && p.k_size == COOP_SIZE
                && p.ab_type == S::F16
                && p.cr_type == S::F32
        })
}

/// Whether the adapter runs WGSL's `dot4I8Packed` as one instruction: a Vulkan GPU (not a CPU
/// driver such as lavapipe, where the dot variant gains nothing) with
/// `VK_KHR_shader_integer_dot_product` (core and required in Vulkan 1.3), which wgpu-hal then
/// enables and naga then emits `OpSDot` for; everywhere else naga expands it into shifts and
/// multiplies, slower than the f32 unit.
pub(crate) fn native_dot4(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    if info.backend != wgpu::Backend::Vulkan || info.device_type == wgpu::DeviceType::Cpu {
        return false;
    }
    vulkan_dot4(adapter)
}

#[cfg(all(not(target_arch = "wasm32"), not(target_vendor = "apple")))]
fn vulkan_dot4(adapter: &wgpu::Adapter) -> bool {
    // SAFETY: only reads the adapter's properties; the handle is not kept.
    let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else {
        return false;
    };
    let pd = hal.physical_device_capabilities();
    // VK_API_VERSION_1_3: variant 0, 1.3.0.
    pd.properties().api_version >= (1 << 22) | (3 << 12) || pd.supports_extension(c"VK_KHR_shader_integer_dot_product")
}

#[cfg(any(target_arch = "wasm32", target_vendor = "apple"))]
fn vulkan_dot4(_adapter: &wgpu::Adapter) -> bool {
    false
}

pub(crate) fn coop_features() -> wgpu::Features {
    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16
}

/// The features to request: every optional one the chosen variants use.
pub(crate) fn wanted_features(adapter: &wgpu::Adapter, precision: Precision, ov: Overrides) -> wgpu::Features {
    let have = adapter.features();
    let mut f = wgpu::Features::empty();
    for opt in [
        wgpu::Features::SUBGROUP,
        wgpu::Features::SHADER_F16,
        wgpu::Features::TIMESTAMP_QUERY,
        wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
    ] {
        if have.contains(opt) {
            f |= opt;
        }
    }
    if precision == Precision::Fast && !ov.plain && !ov.coop_emulate && has_coop16(adapter) {
        f |= coop_features();
    }
    f
}

impl Caps {
    /// The variants for a device opened with `features` and `limits`.
    pub fn select(
        features: wgpu::Features,
        limits: &wgpu::Limits,
        precision: Precision,
        coop16: bool,
        dot4: bool,
        ov: Overrides,
    ) -> Caps {
        let fast = precision == Precision::Fast;
        let f16 = features.contains(wgpu::Features::SHADER_F16);
        let room = limits.max_compute_workgroup_storage_size >= super::kernels::COOP_WORKGROUP_BYTES;
        let coop = if !fast || ov.plain || !room {
            Coop::Off
        } else if ov.coop_emulate && f16 {
            Coop::Emulated
        } else if coop16 && features.contains(coop_features() | wgpu::Features::SUBGROUP) {
            Coop::On
        } else {
            Coop::Off
        };
        let coop2 = (coop != Coop::Off && ov.coop_kernel.unwrap_or(COOP_KERNEL_DEFAULT) == 2)
            .then(|| {
                let asked = CoopTile {
                    bufs: ov.coop_bufs.unwrap_or(CoopTile::DEFAULT.bufs),
                    direct: !ov.coop_staged,
                    ..ov.coop_tile.unwrap_or(CoopTile::DEFAULT)
                };
                // A geometry the kernel or the device does not take keeps the default, or the
                // smaller one where the device's workgroup memory is short.
                let keep = |t: CoopTile| CoopTile {
                    direct: asked.direct,
                    ..t
                };
                [asked, keep(CoopTile::DEFAULT), keep(CoopTile::SMALL)]
                    .into_iter()
                    .find(|t| t.fits(limits))
            })
            .flatten();
        // A power of two the plain reduction takes (<= 256) and the device allows; anything
        // else keeps the default.
        let mv_wg = ov
            .mv_wg
            .filter(|n| [64, 128, 256].contains(n) && *n <= limits.max_compute_invocations_per_workgroup)
            .unwrap_or(MV_WG_DEFAULT);
        // Rows per invocation the kernels take; lanes a power of two up to the workgroup (one
        // lane: a row per invocation).
        let rows = |n: Option<u32>| n.filter(|n| [1, 2, 4, 8].contains(n));
        let lanes = |n: Option<u32>| n.filter(|n| n.is_power_of_two() && *n <= mv_wg);
        let max_storage = match ov.max_storage {
            Some(n) => n.max(MIN_STORAGE).min(limits.max_storage_buffers_per_shader_stage),
            None => limits.max_storage_buffers_per_shader_stage,
        };
        let fuse = !ov.no_fuse;
        let fits = |n: u32| fuse && n <= max_storage;
        let mv_group = (2..=crate::backend::MAX_GROUP as u32)
            .rev()
            .find(|&n| fits(kernels::mv_group_bindings(n)))
            .unwrap_or(1);
        let prep = if fits(kernels::PREP_BINDINGS) {
            Prep::One
        } else if fits(kernels::PREP_HALF_BINDINGS) {
            Prep::Halves
        } else {
            Prep::Separate
        };
        let att_tiled = [AttTile::DEFAULT, AttTile::SMALL].into_iter().find(|t| {
            !ov.no_att_tiled
                && t.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
                && kernels::ATT_T_WG <= limits.max_compute_invocations_per_workgroup
        });
        let max_binding = match ov.max_binding {
            Some(b) => b.min(limits.max_storage_buffer_binding_size),
            None => limits.max_storage_buffer_binding_size,
        };
        Caps {
            subgroups: !ov.plain && features.contains(wgpu::Features::SUBGROUP),
            subgroup_size: 0,
            coop,
            coop2,
            timestamps_in_passes: features
                .contains(wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            max_binding,
            max_buffer: limits.max_buffer_size,
            binding_align: u64::from(limits.min_storage_buffer_offset_alignment.max(4)),
            uniform_align: u64::from(limits.min_uniform_buffer_offset_alignment.max(4)),
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension.max(1),
            max_storage,
            mv_group,
            fused_gates: fits(kernels::GATES_BINDINGS),
            attn_gate: !ov.no_attn_gate && fits(kernels::ATT_GATE_BINDINGS),
            swiglu_xq: !ov.no_swiglu_xq,
            moe_shared: !ov.no_moe_shared && fits(kernels::MOE_SH_BINDINGS),
            moe_route: ov.moe_route && !ov.no_moe_shared && fits(kernels::MOE_ROUTE_SH_BINDINGS),
            prep,
            att_tiled,
            mv_wg,
            mv_rows: rows(ov.mv_rows).unwrap_or(MV_ROWS_DEFAULT),
            mv_lanes: lanes(ov.mv_lanes).unwrap_or(MV_LANES_DEFAULT.min(mv_wg)),
            // Per shape: its own knob, else the general one where that is set, else the default.
            mv_rows_tall: rows(ov.mv_rows_tall)
                .or(rows(ov.mv_rows))
                .unwrap_or(MV_ROWS_TALL_DEFAULT),
            mv_rows_swiglu: rows(ov.mv_rows_swiglu)
                .or(rows(ov.mv_rows))
                .unwrap_or(MV_ROWS_SWIGLU_DEFAULT),
            mv_lanes_long: lanes(ov.mv_lanes_long)
                .or(lanes(ov.mv_lanes))
                .unwrap_or(MV_LANES_LONG_DEFAULT.min(mv_wg)),
            mv_min_wg: ov.mv_min_wg.map_or(MV_MIN_WG_DEFAULT, |n| n.min(MV_MIN_WG_MAX)),
            submit_every: ov
                .submit_every
                .map_or(SUBMIT_EVERY_DEFAULT, |n| n.clamp(1, SUBMIT_EVERY_MAX)),
            submit_first: ov
                .submit_first
                .map_or(SUBMIT_FIRST_DEFAULT, |n| n.clamp(1, SUBMIT_EVERY_MAX)),
            submit_ahead: ov
                .submit_ahead
                .map_or(SUBMIT_AHEAD_DEFAULT, |n| n.clamp(1, SUBMIT_EVERY_MAX)),
            shader_checks: ov.shader_checks,
            mv_dot: ov.mv_dot.unwrap_or(dot4),
            dot4_native: dot4,
        }
    }

    /// These caps on an adapter whose subgroups have between `min` and `max` invocations
    /// (`wgpu::AdapterInfo`): the size is known only when the two agree.
    pub fn with_subgroup_sizes(self, min: u32, max: u32) -> Caps {
        Caps {
            subgroup_size: if min == max && min.is_power_of_two() { min } else { 0 },
            ..self
        }
    }

    /// The precision tier the selected kernels meet.
    pub fn precision(&self) -> Precision {
        match self.coop {
            Coop::Off => Precision::Exact,
            Coop::On | Coop::Emulated => Precision::Fast,
        }
    }

    /// The tuning knobs' values, for `describe`.
    fn knobs(&self) -> [u32; 10] {
        [
            self.mv_wg,
            self.mv_rows,
            self.mv_rows_tall,
            self.mv_rows_swiglu,
            self.mv_lanes,
            self.mv_lanes_long,
            self.mv_min_wg,
            self.submit_every,
            self.submit_first,
            self.submit_ahead,
        ]
    }

    /// The knobs' defaults (`knobs` order).
    fn default_knobs(mv_wg: u32) -> [u32; 10] {
        [
            MV_WG_DEFAULT,
            MV_ROWS_DEFAULT,
            MV_ROWS_TALL_DEFAULT,
            MV_ROWS_SWIGLU_DEFAULT,
            MV_LANES_DEFAULT.min(mv_wg),
            MV_LANES_LONG_DEFAULT.min(mv_wg),
            MV_MIN_WG_DEFAULT,
            SUBMIT_EVERY_DEFAULT,
            SUBMIT_FIRST_DEFAULT,
            SUBMIT_AHEAD_DEFAULT,
        ]
    }

    /// One line for `rill bench` and logs.
    pub fn describe(&self) -> String {
        format!(
            "reductions {}, prefill {}{}{}, binding limit {} MiB, {}{}{}{}",
            if self.subgroups { "subgroup" } else { "workgroup-memory" },
            match self.coop {
                Coop::Off => "f32 tiles",
                Coop::On => "cooperative-matrix f16",
                Coop::Emulated => "emulated cooperative-matrix f16",
            },
            match self.coop2 {
                Some(t) => format!(
                    " (coop2 {}x{}x{}/{}x{}, {} buffer{}{})",
                    t.rows,
                    t.toks,
                    t.k,
                    t.sg_rows,
                    t.sg_toks,
                    t.bufs,
                    if t.bufs == 1 { "" } else { "s" },
                    if t.direct { "" } else { ", staged stores" }
                ),
                None => String::new(),
            },
            match self.att_tiled {
                Some(AttTile::DEFAULT) => "",
                Some(_) => ", attention in small tiles",
                None => ", attention per query row",
            },
            self.max_binding >> 20,
            self.describe_fusion(),
            // The knobs only when set away from their defaults.
            match self.knobs() {
                k if k == Caps::default_knobs(self.mv_wg) => String::new(),
                [wg, rows, tall, swiglu, lanes, long, min_wg, every, first, ahead] => format!(
                    ", matvec workgroup {wg} rows {rows} (tall {tall}, swiglu {swiglu}) lanes {lanes} (long rows \
                     {long}, spread to {min_wg} workgroups), submit every {every} (first {first}, ahead {ahead})"
                ),
            },
            if self.shader_checks {
                ", shader runtime checks on"
            } else {
                ""
            },
            match (self.mv_dot, self.dot4_native) {
                (true, true) => ", k-quant matvec on dot4",
                (true, false) => ", k-quant matvec on dot4 (emulated)",
                (false, _) => "",
            }
        )
    }

    /// The fused decode dispatches in use, e.g. `fused: groups of 4, gates, prep in 1`.
    fn describe_fusion(&self) -> String {
        let mut parts = Vec::new();
        if self.mv_group > 1 {
            parts.push(format!("groups of {}", self.mv_group));
        }
        if self.fused_gates {
            parts.push("gates".to_string());
        }
        if self.attn_gate {
            parts.push("attention gate".to_string());
        }
        if self.moe_shared {
            parts.push("moe shared expert".to_string());
        }
        if self.moe_route {
            parts.push("moe routing".to_string());
        }
        if self.mv_dot && self.swiglu_xq {
            parts.push("swiglu planes".to_string());
        }
        match self.prep {
            Prep::One => parts.push("prep in 1".to_string()),
            Prep::Halves => parts.push("prep in 2".to_string()),
            Prep::Separate => {}
        }
        if parts.is_empty() {
            "no fused decode dispatches".to_string()
        } else {
            format!("fused: {}", parts.join(", "))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The H200's workgroup memory (the WebGPU default of 16 KiB is too small for the coop tile).
    pub(crate) fn limits() -> wgpu::Limits {
        wgpu::Limits {
            max_compute_workgroup_storage_size: 48 << 10,
            ..wgpu::Limits::default()
        }
    }

    pub(crate) fn caps(features: wgpu::Features, precision: Precision, coop16: bool, ov: Overrides) -> Caps {
        Caps::select(features, &limits(), precision, coop16, false, ov)
    }

    #[test]
    fn dot_units_only_where_asked_for() {
        let dot = |native, mv_dot| {
            let ov = Overrides {
                mv_dot,
                ..Default::default()
            };
            Caps::select(wgpu::Features::SUBGROUP, &limits(), Precision::Exact, false, native, ov).mv_dot
        };
        assert!(dot(true, None), "on by default where dot4I8Packed is native");
        assert!(!dot(false, None), "off where naga would emulate it");
        assert!(dot(true, Some(true)));
        assert!(dot(false, Some(true)), "RILL_WGPU_MV_DOT=1 (lavapipe tests)");
        assert!(!dot(true, Some(false)));
        // The strict tier either way.
        let c = caps(wgpu::Features::SUBGROUP, Precision::Exact, false, Overrides::default());
        assert_eq!(c.precision(), Precision::Exact);
    }

    #[test]
    fn plain_override_turns_every_fast_path_off() {
        let all = wgpu::Features::SUBGROUP | coop_features();
        let fast = caps(all, Precision::Fast, true, Overrides::default());
        assert!(fast.subgroups);
        assert_eq!(fast.coop, Coop::On);
        assert_eq!(fast.precision(), Precision::Fast);
        let plain = caps(
            all,
            Precision::Fast,
            true,
            Overrides {
                plain: true,
                ..Default::default()
            },
        );
        assert!(!plain.subgroups);
        assert_eq!(plain.coop, Coop::Off);
        assert_eq!(plain.precision(), Precision::Exact);
    }

    #[test]
    fn cooperative_matrices_only_at_fast_precision_and_with_the_feature() {
        let all = wgpu::Features::SUBGROUP | coop_features();
        assert_eq!(caps(all, Precision::Exact, true, Overrides::default()).coop, Coop::Off);
        assert_eq!(
            caps(wgpu::Features::SUBGROUP, Precision::Fast, true, Overrides::default()).coop,
            Coop::Off
        );
        assert_eq!(caps(all, Precision::Fast, false, Overrides::default()).coop, Coop::Off);
        let emu = Overrides {
            coop_emulate: true,
            ..Default::default()
        };
        let f16 = wgpu::Features::SHADER_F16;
        assert_eq!(caps(f16, Precision::Fast, false, emu).coop, Coop::Emulated);
        assert_eq!(
            caps(wgpu::Features::empty(), Precision::Fast, false, emu).coop,
            Coop::Off
        );
        assert_eq!(caps(f16, Precision::Exact, false, emu).coop, Coop::Off);
    }

    #[test]
    fn cooperative_matrices_need_room_for_their_tiles() {
        let all = wgpu::Features::SUBGROUP | coop_features();
        let small = Caps::select(
            all,
            &wgpu::Limits::default(),
            Precision::Fast,
            true,
            false,
            Overrides::default(),
        );
        assert_eq!(small.coop, Coop::Off);
    }

    #[test]
    fn second_coop_kernel_takes_only_geometries_it_and_the_device_hold() {
        let all = wgpu::Features::SUBGROUP | coop_features();
        let pick = |kernel: Option<u32>, tile: &str, bufs: Option<u32>, staged: bool, precision| {
            caps(
                all,
                precision,
                true,
                Overrides {
                    coop_kernel: kernel,
                    coop_tile: CoopTile::parse(tile),
                    coop_bufs: bufs,
                    coop_staged: staged,
                    ..Default::default()
                },
            )
            .coop2
        };
        let d = CoopTile::DEFAULT;
        let fast = Precision::Fast;
        assert_eq!(pick(None, "", None, false, fast).is_some(), COOP_KERNEL_DEFAULT == 2);
        assert_eq!(pick(Some(1), "", None, false, fast), None);
        assert_eq!(pick(Some(2), "", None, false, Precision::Exact), None);
        assert_eq!(pick(Some(2), "", None, false, fast), Some(d));
        assert_eq!((d.invocations(), d.w_units(), d.x_units()), (256, 2, 2));
        assert_eq!(
            (
                CoopTile::SMALL.invocations(),
                CoopTile::SMALL.w_units(),
                CoopTile::SMALL.x_units()
            ),
            (64, 4, 4)
        );
        let t = pick(Some(2), "64x128x32/32x64", Some(1), true, fast).unwrap();
        assert_eq!(
            (t.rows, t.toks, t.k, t.sg_rows, t.sg_toks, t.bufs, t.direct),
            (64, 128, 32, 32, 64, 1, false)
        );
        assert_eq!(t.subgroups(), 4);
        // 128 x 128 x 32 double-buffered just fits 48 KiB; with k 64 only single-buffered.
        assert_eq!(
            pick(Some(2), "128x128x32", Some(2), false, fast).map(|t| t.rows),
            Some(128)
        );
        assert_eq!(
            pick(Some(2), "128x128x64", Some(2), false, fast),
            Some(d),
            "too big: the default"
        );
        assert_eq!(pick(Some(2), "128x128x64", Some(1), false, fast).map(|t| t.k), Some(64));
        for bad in [
            "128x64",
            "128x64x48",
            "96x64x32",
            "128x64x32/16x16",
            "256x128x32",
            "64x32x32",
            "axbxc",
        ] {
            assert_eq!(pick(Some(2), bad, None, false, fast), Some(d), "{bad}");
        }
        assert_eq!(pick(Some(2), "", Some(3), false, fast), Some(d), "three buffers");
        // Less workgroup memory than the default needs (lavapipe's 32 KiB, or 28): the small
        // geometry, which needs less than the first kernel (so a device that holds either holds it).
        assert!(CoopTile::SMALL.workgroup_bytes() <= kernels::COOP_WORKGROUP_BYTES);
        let ov = Overrides {
            coop_kernel: Some(2),
            ..Default::default()
        };
        for kib in [28, 32] {
            let small = wgpu::Limits {
                max_compute_workgroup_storage_size: kib << 10,
                ..wgpu::Limits::default()
            };
            let c = Caps::select(all, &small, fast, true, false, ov);
            assert_eq!((c.coop, c.coop2), (Coop::On, Some(CoopTile::SMALL)), "{kib} KiB");
        }
    }

    /// The tiled prefill attention where the device holds its workgroup memory: the default
    /// geometry with 32 KiB (and the H200's 48), the small one with WebGPU's default 16 KiB, the
    /// per-row kernel with less or with `RILL_WGPU_ATT_TILED=0`.
    #[test]
    fn tiled_attention_where_its_tiles_fit() {
        assert_eq!(
            (AttTile::DEFAULT.workgroup_bytes(), AttTile::SMALL.workgroup_bytes()),
            (25_472, 16_256)
        );
        let pick = |bytes: u32, off: bool| {
            let lim = wgpu::Limits {
                max_compute_workgroup_storage_size: bytes,
                ..wgpu::Limits::default()
            };
            let ov = Overrides {
                no_att_tiled: off,
                ..Default::default()
            };
            Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, ov).att_tiled
        };
        assert_eq!(pick(48 << 10, false), Some(AttTile::DEFAULT));
        assert_eq!(pick(32 << 10, false), Some(AttTile::DEFAULT));
        assert_eq!(wgpu::Limits::default().max_compute_workgroup_storage_size, 16 << 10);
        assert_eq!(pick(16 << 10, false), Some(AttTile::SMALL));
        assert_eq!(pick(12 << 10, false), None);
        assert_eq!(pick(48 << 10, true), None);
    }

    #[test]
    fn binding_limit_can_only_be_lowered() {
        let lim = wgpu::Limits::default();
        let ov = |b| Overrides {
            max_binding: Some(b),
            ..Default::default()
        };
        let low = Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, ov(4096));
        assert_eq!(low.max_binding, 4096);
        let high = Caps::select(
            wgpu::Features::empty(),
            &lim,
            Precision::Exact,
            false,
            false,
            ov(u64::MAX),
        );
        assert_eq!(high.max_binding, lim.max_storage_buffer_binding_size);
    }

    /// The fused decode dispatches by the adapter's storage buffers per kernel: WebGPU's 8
    /// (groups of 3, the attention preparation in halves, the attention gate), 10 (groups of 4, the
    /// gates), 11 and more (everything); `RILL_WGPU_MAX_STORAGE` lowers it (never below 8), `RILL_WGPU_FUSE=0`
    /// turns all off.
    #[test]
    fn fused_dispatches_follow_the_storage_buffer_limit() {
        let pick = |adapter: u32, ov: Overrides| {
            let lim = wgpu::Limits {
                max_storage_buffers_per_shader_stage: adapter,
                ..wgpu::Limits::default()
            };
            let c = Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, ov);
            (c.max_storage, c.mv_group, c.fused_gates, c.prep, c.attn_gate)
        };
        let none = Overrides::default();
        assert_eq!(pick(8, none), (8, 3, false, Prep::Halves, true));
        assert_eq!(pick(10, none), (10, 4, true, Prep::Halves, true));
        // The MoE routing inside the experts' dispatch needs 9.
        let moe = |adapter: u32, ov: Overrides| {
            let lim = wgpu::Limits {
                max_storage_buffers_per_shader_stage: adapter,
                ..wgpu::Limits::default()
            };
            let c = Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, ov);
            (c.moe_shared, c.moe_route)
        };
        // Off by default (slower on the H200), on with RILL_WGPU_MOE_ROUTE=1 where 9 fit.
        assert_eq!(moe(9, none), (true, false));
        let route = Overrides {
            moe_route: true,
            ..Default::default()
        };
        assert_eq!(moe(8, route), (true, false));
        assert_eq!(moe(9, route), (true, true));
        let no_shared = Overrides {
            no_moe_shared: true,
            moe_route: true,
            ..Default::default()
        };
        assert_eq!(moe(9, no_shared), (false, false));
        assert_eq!(pick(11, none), (11, 4, true, Prep::One, true));
        assert_eq!(pick(1 << 20, none), (1 << 20, 4, true, Prep::One, true));
        let lowered = |n| Overrides {
            max_storage: Some(n),
            ..Default::default()
        };
        assert_eq!(pick(1 << 20, lowered(8)), (8, 3, false, Prep::Halves, true));
        assert_eq!(pick(1 << 20, lowered(4)).0, 8, "never below WebGPU's guarantee");
        assert_eq!(pick(10, lowered(64)).0, 10, "never above the adapter's");
        let off = Overrides {
            no_fuse: true,
            ..Default::default()
        };
        assert_eq!(pick(1 << 20, off), (1 << 20, 1, false, Prep::Separate, false));
    }

    #[test]
    fn tuning_knobs_take_only_what_the_kernels_allow() {
        let lim = wgpu::Limits::default();
        let knobs = |mv_wg, mv_rows, mv_lanes, submit_every| {
            let c = Caps::select(
                wgpu::Features::empty(),
                &lim,
                Precision::Exact,
                false,
                false,
                Overrides {
                    mv_wg: Some(mv_wg),
                    mv_rows: Some(mv_rows),
                    mv_lanes: Some(mv_lanes),
                    submit_every: Some(submit_every),
                    ..Default::default()
                },
            );
            (c.mv_wg, c.mv_rows, c.mv_lanes, c.submit_every)
        };
        assert_eq!(knobs(64, 1, 64, 16), (64, 1, 64, 16));
        assert_eq!(knobs(256, 8, 1, 256), (256, 8, 1, 256));
        assert_eq!(
            knobs(96, 3, 48, 0),
            (MV_WG_DEFAULT, MV_ROWS_DEFAULT, MV_LANES_DEFAULT, 1),
            "not powers of two; at least one dispatch"
        );
        assert_eq!(
            knobs(512, 16, 512, 9999),
            (MV_WG_DEFAULT, MV_ROWS_DEFAULT, MV_LANES_DEFAULT, SUBMIT_EVERY_MAX)
        );
        assert_eq!(knobs(64, 2, 128, 64).2, MV_LANES_DEFAULT, "lanes beyond the workgroup");
        let d = Caps::select(
            wgpu::Features::empty(),
            &lim,
            Precision::Exact,
            false,
            false,
            Overrides::default(),
        );
        assert_eq!(
            (d.mv_wg, d.mv_rows, d.mv_lanes, d.submit_every, d.submit_first),
            (
                MV_WG_DEFAULT,
                MV_ROWS_DEFAULT,
                MV_LANES_DEFAULT,
                SUBMIT_EVERY_DEFAULT,
                SUBMIT_FIRST_DEFAULT
            )
        );
        let first = |n| {
            let ov = Overrides {
                submit_first: Some(n),
                ..Default::default()
            };
            Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, ov).submit_first
        };
        assert_eq!((first(8), first(0), first(9999)), (8, 1, SUBMIT_EVERY_MAX));
    }
}
