//! The kernels: a typed key per compute program (no string lookups per dispatch), the WGSL each is
//! assembled from, and the constants that Rust and WGSL share (generated into every shader, so a
//! tile size or a rows-per-workgroup count is written once, here).
//!
//! A shader's source is, in order: `enable` directives (f16 / cooperative matrices), the generated
//! constants, `common.wgsl`, for a weight kernel the weight accessors and the format's file
//! (`dequant_<type>.wgsl` plus the shared snippets it needs), for a reducing kernel the reduction
//! of the selected variant (`lib_reduce_sg.wgsl` or `lib_reduce_plain.wgsl`), then the op's file.

use super::caps::{Caps, Coop};
use super::geometry::{AttTile, CoopTile, ATT_MAX_D, ATT_T_BK, ATT_T_BQ, ATT_T_WG, COOP_SCRATCH_STRIDE, MOE_MAX_K};
use crate::backend::wgpu::gpu_err;
use crate::error::Result;
use crate::gguf::GgmlType;

macro_rules! wgsl {
    ($name:literal) => {
        include_str!(concat!("../../../shaders-wgsl/", $name, ".wgsl"))
    };
}

// ---- constants shared by Rust and WGSL ---------------------------------------------------------

/// The generic matmul for shapes the fast kernels do not take (rows not a multiple of 8):
/// invocations per row and per row group, and tokens per workgroup.
pub(crate) const MM_WG: u32 = 128;
pub(crate) const MM_ROWS_WG: u32 = 64;
pub(crate) const MM_TILE: u32 = 8;
/// Output rows and tokens of a `matmul_tiled` workgroup tile, and its k step.
pub(crate) const TILE_M: u32 = 64;
pub(crate) const TILE_N: u32 = 64;
pub(crate) const TILE_K: u32 = 32;
/// Invocations of `matmul_tiled` (16 x 16, each a 4 x 4 block of outputs).
pub(crate) const TILE_WG: u32 = 256;
/// Invocations of the one-workgroup-per-row kernels (norms, embedding rows, argmax).
pub(crate) const ROW_WG: u32 = 256;
/// Values of a row one argmax workgroup scans when a row is split (rows up to this long take one
/// pass, longer ones `argmax_split` + `argmax_combine`).
pub(crate) const ARGMAX_CHUNK: u32 = 4096;
/// Invocations of the elementwise kernels.
pub(crate) const ELT_WG: u32 = 256;
/// Attention: invocations and keys per tile, largest head dim, and the number of pieces the KV
/// range of one decode query is split into (flash-decoding).
pub(crate) const ATT_WG: u32 = 64;
pub(crate) const ATT_SPLITS: u32 = 32;
/// The chunked delta rule: chunk length, largest key head dim, invocations per workgroup of both
/// kernels, and state rows per workgroup of `delta_rule_chunk_state` (whose phase a gives each
/// invocation one token and four rows: `DELTA_WG = DELTA_CHUNK · DELTA_ROWS / 4`; the prep kernel
/// gives each invocation a quarter of a token's row of the 64 × 64 products: `4 · DELTA_CHUNK`).
pub(crate) const DELTA_CHUNK: u32 = 64;
pub(crate) const DELTA_MAX_DK: u32 = 128;
pub(crate) const DELTA_WG: u32 = 256;
pub(crate) const DELTA_ROWS: u32 = 16;
const _: () = assert!(DELTA_WG == DELTA_CHUNK * DELTA_ROWS / 4 && DELTA_WG == 4 * DELTA_CHUNK);
const _: () = assert!(DELTA_ROWS.is_multiple_of(4) && DELTA_MAX_DK.is_multiple_of(4));
/// The recurrent delta rule: invocations per workgroup, and without subgroups invocations per
/// state row (few, so that each has a share of the row worth its reduction and barriers, which CPU
/// adapters pay for dearly).
pub(crate) const DELTA_REC_WG: u32 = 256;
pub(crate) const DELTA_LANES: u32 = 8;
const _: () = assert!(DELTA_REC_WG.is_multiple_of(DELTA_LANES) && DELTA_LANES.is_multiple_of(4));

/// State rows per workgroup of the recurrent delta rule: with subgroups one per subgroup
/// (`DELTA_REC_WG` over the adapter's subgroup size: 8 rows for NVIDIA's 32, 32 for lavapipe's 8,
/// whose workgroups would otherwise run three idle subgroups of four; 8 where the size varies,
/// subgroups looping over the block's rows when they are fewer), without `DELTA_REC_WG /
/// DELTA_LANES`.
pub(crate) fn delta_rec_rows(caps: &Caps) -> u32 {
    if !caps.subgroups {
        DELTA_REC_WG / DELTA_LANES
    } else if (4..=128).contains(&caps.subgroup_size) {
        DELTA_REC_WG / caps.subgroup_size
    } else {
        8
    }
}

/// Causal conv: channels per workgroup and largest kernel width.
pub(crate) const CONV_WG: u32 = 64;
pub(crate) const CONV_MAX_K: u32 = 16;
/// The fused conv + q/k L2 norm: channels per workgroup (= the largest dk it handles).
pub(crate) const CONV_NORM_WG: u32 = 128;
/// The attention preparation (`attn_qk_prep`): invocations per workgroup, one per element of a
/// head (so the largest head dim it takes).
pub(crate) const PREP_WG: u32 = ATT_MAX_D;
// The workgroup-memory reduction (lib_reduce_plain.wgsl) takes a power of two up to 256.
const _: () = assert!(PREP_WG.is_power_of_two() && PREP_WG <= 256);
/// MoE: most experts in all (`moe_route` keeps them in workgroup memory).
pub(crate) const MOE_MAX_E: u32 = 2048;
/// The routing runs one slot per invocation of a matrix-vector workgroup (`moe_route.wgsl`), which
/// has at least 64 (`Caps::mv_wg`).
const _: () = assert!(MOE_MAX_K <= 64);
/// Invocations per workgroup of `mv_dot_prep.wgsl` (one per 32-element block of x), and the
/// vec4s of one quantized block (three int8 planes of 8 words, then scale and sums).
pub(crate) const MVD_WG: u32 = 64;
pub(crate) const XQ_VEC4: u32 = 7;

/// Bytes of one parameter block (the shaders' `Params` structs are at most this big).
pub(crate) const PARAM_BYTES: u64 = 64;

/// The generated WGSL constants (one `const` per shared value) of `kernel`'s source. The geometry
/// of the matrix-vector kernels (`matvec`, `matvec_swiglu`, `moe_matvec`) is tuning numbers of
/// `Caps`: `MV_WG` invocations per workgroup, `MV_R` rows per invocation (`mv_rows`: per kernel and
/// format; the lanes per row group are a per-dispatch parameter, `mv_lanes`).
fn constants(caps: &Caps, kernel: Kernel, fmt: Option<GgmlType>) -> String {
    // matmul_coop2's geometry (the default's where the kernel is not selected: unused there).
    let c2 = caps.coop2.unwrap_or(CoopTile::DEFAULT);
    // attention_tiled's (likewise).
    let at = caps.att_tiled.unwrap_or(AttTile::DEFAULT);
    let list: &[(&str, u32)] = &[
        ("MV_WG", caps.mv_wg),
        ("MV_R", mv_rows(caps, kernel, fmt)),
        ("MM_WG", MM_WG),
        ("MM_ROWS_WG", MM_ROWS_WG),
        ("MM_TILE", MM_TILE),
        ("TILE_M", TILE_M),
        ("TILE_N", TILE_N),
        ("TILE_K", TILE_K),
        ("TILE_WG", TILE_WG),
        ("C2_R", c2.rows),
        ("C2_T", c2.toks),
        ("C2_K", c2.k),
        ("C2_SR", c2.sg_rows),
        ("C2_ST", c2.sg_toks),
        ("C2_NB", c2.sg_rows / 16),
        ("C2_BUF", c2.bufs),
        ("C2_WG", c2.invocations()),
        ("C2_WU", c2.w_units()),
        ("C2_XU", c2.x_units()),
        ("C2_SA", c2.a_stride()),
        ("C2_SB", c2.b_stride()),
        ("C2_XS", c2.toks * c2.a_stride()),
        ("C2_WS", c2.rows * c2.b_stride()),
        ("C2_SCS", COOP_SCRATCH_STRIDE),
        ("ROW_WG", ROW_WG),
        ("ARGMAX_CHUNK", ARGMAX_CHUNK),
        ("ELT_WG", ELT_WG),
        ("ATT_WG", ATT_WG),
        ("ATT_MAX_D", ATT_MAX_D),
        ("ATT_SPLITS", ATT_SPLITS),
        ("ATT_T_WG", ATT_T_WG),
        ("ATT_T_BQ", ATT_T_BQ),
        ("ATT_T_BK", ATT_T_BK),
        ("ATT_T_DC", at.dc),
        ("ATT_T_SH", at.stage_vec4s()),
        ("DELTA_ROWS", DELTA_ROWS),
        ("DELTA_CHUNK", DELTA_CHUNK),
        ("DELTA_MAX_DK", DELTA_MAX_DK),
        ("DELTA_WG", DELTA_WG),
        ("DELTA_REC_WG", DELTA_REC_WG),
        ("DELTA_REC_ROWS", delta_rec_rows(caps)),
        ("DELTA_LANES", DELTA_LANES),
        ("CONV_WG", CONV_WG),
        ("CONV_MAX_K", CONV_MAX_K),
        ("CONV_NORM_WG", CONV_NORM_WG),
        ("PREP_WG", PREP_WG),
        ("MOE_MAX_K", MOE_MAX_K),
        ("MOE_MAX_E", MOE_MAX_E),
        ("MVD_WG", MVD_WG),
        ("XQ_VEC4", XQ_VEC4),
    ];
    let mut s = String::from("// Generated from src/backend/wgpu/kernels.rs.\n");
    for (name, v) in list {
        s.push_str(&format!("const {name}: u32 = {v}u;\n"));
    }
    s
}

/// Products with at least this many rows (the LM head) run `Kernel::MatvecTall`.
pub(crate) const MV_TALL_ROWS: usize = 65536;
/// Rows of at least this many units (the FFN down products: 12288 / 64) take `Caps::mv_lanes_long`.
pub(crate) const MV_LONG_UNITS: usize = 192;

/// Rows per invocation of the matrix-vector kernels on the formats decoded element by element
/// (no whole-word unit of their own: `mv_whole_word`) at most. Their unit, unrolled over the rows,
/// makes shaders LLVM compiles slowly (lavapipe, cold: a Q5_0 SwiGLU 6 s at 1 row, 11 s at 2, 38 s
/// at 4, a Q4_0 one 50 s at 8), and it decodes every element on its own, so more rows share little.
pub(crate) const MV_GENERIC_MAX_ROWS: u32 = 2;

/// Rows per invocation of matrix-vector `kernel` on weight format `ty` (WGSL `MV_R`).
pub(crate) fn mv_rows(caps: &Caps, kernel: Kernel, ty: Option<GgmlType>) -> u32 {
    let rows = match kernel {
        Kernel::MatvecTall => caps.mv_rows_tall,
        Kernel::MatvecSwiglu | Kernel::MatvecSwigluXq => caps.mv_rows_swiglu,
        _ => caps.mv_rows,
    };
    match ty {
        Some(t) if !mv_whole_word(t) => rows.min(MV_GENERIC_MAX_ROWS),
        _ => rows,
    }
}

/// Lanes per row group of a matrix-vector dispatch over rows of `units` units (`MV_UNIT`
/// elements each): `Caps::mv_lanes` (`Caps::mv_lanes_long` for long rows), but
/// no more than the smallest power of two that covers the row (more would idle), and at most the
/// workgroup.
pub(crate) fn mv_lanes(caps: &Caps, units: usize) -> u32 {
    let cover = u32::try_from(units.max(1).next_power_of_two()).unwrap_or(u32::MAX);
    let knob = if units >= MV_LONG_UNITS {
        caps.mv_lanes_long
    } else {
        caps.mv_lanes
    };
    knob.min(cover).min(caps.mv_wg).max(1)
}

/// Lanes per row group of a matrix-vector dispatch of `rows` rows of `units` units: `mv_lanes`,
/// doubled (up to the workgroup and the row's cover) while the dispatch would have fewer than
/// `Caps::mv_min_wg` workgroups. A small product (the MoE router: 256 f32 rows of 2048) then
/// spreads over more of the GPU, each row's sum over more lanes.
pub(crate) fn mv_lanes_spread(caps: &Caps, kernel: Kernel, ty: GgmlType, units: usize, rows: usize) -> u32 {
    let cover = u32::try_from(units.max(1).next_power_of_two()).unwrap_or(u32::MAX);
    let most = caps.mv_wg.min(cover);
    let mut lanes = mv_lanes(caps, units);
    let wgs = |lanes| (rows as u64).div_ceil(u64::from(mv_rows_per_wg(caps, kernel, ty, lanes).max(1)));
    while lanes * 2 <= most && wgs(lanes) < u64::from(caps.mv_min_wg) {
        lanes *= 2;
    }
    lanes
}

/// Output rows of one workgroup of matrix-vector `kernel` on format `ty` with `lanes` lanes per
/// row group.
pub(crate) fn mv_rows_per_wg(caps: &Caps, kernel: Kernel, ty: GgmlType, lanes: u32) -> u32 {
    caps.mv_wg / lanes * mv_rows(caps, kernel, Some(ty))
}

/// Output rows of one `matvec_swiglu_xq` workgroup (its span): whole 32-row blocks of the planes,
/// in 32 / `mv_rows_per_wg` passes or one pass of several blocks (both powers of two).
pub(crate) fn mv_xq_span(caps: &Caps, ty: GgmlType, lanes: u32) -> u32 {
    mv_rows_per_wg(caps, Kernel::MatvecSwigluXq, ty, lanes).max(32)
}

// ---- kernels ----------------------------------------------------------------------------------

/// How many weight buffers a kernel reads through the format accessors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Weights {
    None,
    /// `W` only.
    One,
    /// `W` and `W2`, selected by `wsel` (`lib_w2.wgsl`).
    Two,
    /// `W0` .. `W{n-1}`, each with its output, selected by `wsel` (`group_io`).
    Group(u32),
    /// `W`, `W2`, `W3` and `W4`, selected by `wsel` (`lib_w4.wgsl`).
    Four,
}

/// Declares `Kernel` and the list of all its values (`ALL`, in discriminant order) from one list.
macro_rules! kernels {
    ($($k:ident),* $(,)?) => {
        /// Every compute program.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub(crate) enum Kernel {
            $($k),*
        }

        #[cfg(test)]
        const ALL: &[Kernel] = &[$(Kernel::$k),*];
    };
}

kernels! {
    Embed,
    EmbedRows,
    Matmul,
    MatmulRows,
    Matvec,
    MatvecTall,
    MatvecSwiglu,
    MatvecSwigluXq,
    MatvecGroup2,
    MatvecGroup3,
    MatvecGroup4,
    MatmulTiled,
    MatmulCoop2,
    MoeRoute,
    MoeMatvec,
    MvDotPrep,
    MoeRows,
    MoeCombine,
    RmsNorm,
    AddRmsNorm,
    GatedRmsNorm,
    RmsNormDot,
    AddRmsNormDot,
    GatedRmsNormDot,
    L2NormQk,
    Conv,
    ConvL2qk,
    GdnConvGates,
    AddAssign,
    Swiglu,
    SigmoidMulAssign,
    SigmoidScaleAdd,
    SplitQgate,
    Argmax,
    ArgmaxSplit,
    ArgmaxCombine,
    GdnGates,
    Rope,
    KvStore,
    AttnQkPrep,
    AttnPrepQ,
    AttnPrepKv,
    Attention,
    AttentionTiled,
    AttentionSplit,
    AttentionCombine,
    AttentionCombineGate,
    AttentionCombineGateDot,
    DeltaRecurrent,
    DeltaChunkPrep,
    DeltaChunkState,
    MoeSwigluSh,
    MoeDownSh,
    ConvRows,
    DeltaRows,
    RopeRows,
    KvStoreRows,
    AttentionRowsSplit,
    AttentionRowsCombine,
}

struct Spec {
    name: &'static str,
    body: &'static str,
    weights: Weights,
    /// Uses `wg_sum*` from the reduction snippet (and takes `lanes: Lanes`).
    reduce: bool,
    /// Shared snippets the body calls (after the reduction).
    libs: &'static [&'static str],
    /// A matrix-vector kernel: calls the format's `mv_x`/`mv_dot` (and defines `xv`) and
    /// reduces with `mv_sum` (lib_mv_reduce_*.wgsl).
    matvec: bool,
}

const fn spec(name: &'static str, body: &'static str, weights: Weights, reduce: bool) -> Spec {
    Spec {
        name,
        body,
        weights,
        reduce,
        libs: &[],
        matvec: false,
    }
}

impl Spec {
    const fn with(self, libs: &'static [&'static str]) -> Spec {
        Spec { libs, ..self }
    }
    const fn mv(self) -> Spec {
        Spec { matvec: true, ..self }
    }
}

const NORM: &str = wgsl!("lib_norm");
const NORM_PLAIN: &str = wgsl!("lib_norm_plain");
const DOT_PREP: &str = wgsl!("lib_dot_prep");
const NORM_DOT: &str = wgsl!("lib_norm_dot");
const NORM_XQ4: &str = wgsl!("lib_norm_xq4");
const NORM_XQ5: &str = wgsl!("lib_norm_xq5");
const NORM_OCT_SG: &str = wgsl!("lib_norm_oct_sg");
const NORM_OCT_PLAIN: &str = wgsl!("lib_norm_oct_plain");
const ARGMAX: &str = wgsl!("lib_argmax");
const ARGMAX_SCAN: &str = wgsl!("lib_argmax_scan");
const ATTEND: &str = wgsl!("lib_attention");
const ATT_XQ: &str = wgsl!("lib_att_xq");
const ATT_NOXQ: &str = wgsl!("lib_att_noxq");
const ATT_MERGE: &str = wgsl!("lib_att_merge");
const ATT_POS: &str = wgsl!("lib_att_pos");
const ATT_ROWS: &str = wgsl!("lib_att_rows");
const COOP2_TILES: &str = wgsl!("lib_coop2_tiles");
const MM_IO: &str = wgsl!("lib_mm_io");
const MV_IO: &str = wgsl!("lib_mv_io");
const MVG_IO: &str = wgsl!("lib_mvg_io");
const MV_SWIGLU: &str = wgsl!("lib_mv_swiglu");
const CONV_L2QK: &str = wgsl!("lib_conv_l2qk");
const GATES: &str = wgsl!("lib_gates");
const ROPE: &str = wgsl!("lib_rope");
const PREP: &str = wgsl!("lib_attn_prep");
const PREP_Q: &str = wgsl!("lib_prep_q");
const PREP_KV: &str = wgsl!("lib_prep_kv");
const TILE_IO: &str = wgsl!("lib_tile_io");
const MOE_IO: &str = wgsl!("lib_moe_io");
const MOE_SH: &str = wgsl!("lib_moe_sh");
const MOE_ROUTE: &str = wgsl!("lib_moe_route");
const DELTA_ROWS_SG: &str = wgsl!("lib_delta_rows_sg");
const DELTA_ROWS_PLAIN: &str = wgsl!("lib_delta_rows_plain");
const DELTA_TOKEN: &str = wgsl!("lib_delta_token");

/// The packed-dot norms' snippets: the norm, the planes' format, the second pass that writes
/// them, the planes binding (`xq_binding`: 4 after rms_norm's bindings, 5 after the others'),
/// and the oct exchange of the selected reduction.
fn norm_dot_libs(caps: &Caps, xq_binding: u32) -> &'static [&'static str] {
    match (caps.subgroups, xq_binding == 4) {
        (true, true) => &[NORM, DOT_PREP, NORM_DOT, NORM_XQ4, NORM_OCT_SG],
        (true, false) => &[NORM, DOT_PREP, NORM_DOT, NORM_XQ5, NORM_OCT_SG],
        (false, true) => &[NORM, DOT_PREP, NORM_DOT, NORM_XQ4, NORM_OCT_PLAIN],
        (false, false) => &[NORM, DOT_PREP, NORM_DOT, NORM_XQ5, NORM_OCT_PLAIN],
    }
}

/// `matvec_group.wgsl` for `n` products.
const fn group_spec(name: &'static str, n: u32) -> Spec {
    spec(name, wgsl!("matvec_group"), Weights::Group(n), false)
        .mv()
        .with(&[MVG_IO])
}

impl Kernel {
    /// `matvec_group.wgsl` for `n` (2 to 4) products.
    pub(crate) fn matvec_group(n: usize) -> Option<Kernel> {
        match n {
            2 => Some(Kernel::MatvecGroup2),
            3 => Some(Kernel::MatvecGroup3),
            4 => Some(Kernel::MatvecGroup4),
            _ => None,
        }
    }

    fn spec(self, caps: &Caps) -> Spec {
        use Weights::*;
        match self {
            Kernel::Embed => spec("embed", wgsl!("embed"), One, false),
            Kernel::EmbedRows => spec("embed_rows", wgsl!("embed_rows"), One, false),
            Kernel::Matmul => spec("matmul", wgsl!("matmul"), One, false).with(&[MM_IO]),
            Kernel::MatmulRows => spec("matmul_rows", wgsl!("matmul_rows"), One, false).with(&[MM_IO]),
            Kernel::Matvec => spec("matvec", wgsl!("matvec"), One, false).mv().with(&[MV_IO]),
            // The same kernel with its own rows per invocation (`mv_rows`).
            Kernel::MatvecTall => spec("matvec_tall", wgsl!("matvec"), One, false).mv().with(&[MV_IO]),
            Kernel::MatvecSwiglu => spec("matvec_swiglu", wgsl!("matvec_swiglu"), Two, false)
                .mv()
                .with(&[MV_IO, MV_SWIGLU]),
            Kernel::MatvecSwigluXq => spec("matvec_swiglu_xq", wgsl!("matvec_swiglu_xq"), Two, false)
                .mv()
                .with(&[MV_IO, MV_SWIGLU, DOT_PREP]),
            Kernel::MatvecGroup2 => group_spec("matvec_group2", 2),
            Kernel::MatvecGroup3 => group_spec("matvec_group3", 3),
            Kernel::MatvecGroup4 => group_spec("matvec_group4", 4),
            Kernel::MatmulTiled => spec("matmul_tiled", wgsl!("matmul_tiled"), One, false).with(&[TILE_IO]),
            Kernel::MatmulCoop2 => match caps.coop {
                Coop::Emulated => spec("matmul_coop2_emu", wgsl!("matmul_coop2_emu"), One, false),
                _ => spec("matmul_coop2", wgsl!("matmul_coop2"), One, false),
            }
            .with(&[TILE_IO, COOP2_TILES]),
            Kernel::MoeRoute => spec("moe_route", wgsl!("moe_route"), None, false).with(&[MOE_ROUTE]),
            Kernel::MoeMatvec => spec("moe_matvec", wgsl!("moe_matvec"), One, false).mv().with(&[MOE_IO]),
            Kernel::MvDotPrep => spec("mv_dot_prep", wgsl!("mv_dot_prep"), None, false).with(&[DOT_PREP]),
            Kernel::MoeRows => spec("moe_rows", wgsl!("moe_rows"), One, false).with(&[MOE_IO]),
            Kernel::MoeCombine => spec("moe_combine", wgsl!("moe_combine"), None, false),
            Kernel::RmsNorm => spec("rms_norm", wgsl!("rms_norm"), None, true).with(&[NORM, NORM_PLAIN]),
            Kernel::AddRmsNorm => spec("add_rms_norm", wgsl!("add_rms_norm"), None, true).with(&[NORM, NORM_PLAIN]),
            Kernel::GatedRmsNorm => {
                spec("gated_rms_norm", wgsl!("gated_rms_norm"), None, true).with(&[NORM, NORM_PLAIN])
            }
            Kernel::RmsNormDot => spec("rms_norm_dot", wgsl!("rms_norm"), None, true).with(norm_dot_libs(caps, 4)),
            Kernel::AddRmsNormDot => {
                spec("add_rms_norm_dot", wgsl!("add_rms_norm"), None, true).with(norm_dot_libs(caps, 5))
            }
            Kernel::GatedRmsNormDot => {
                spec("gated_rms_norm_dot", wgsl!("gated_rms_norm"), None, true).with(norm_dot_libs(caps, 5))
            }
            Kernel::L2NormQk => spec("l2_norm_qk", wgsl!("l2_norm_qk"), None, true),
            Kernel::Conv => spec("conv1d_causal_silu", wgsl!("conv1d_causal_silu"), None, false),
            Kernel::ConvL2qk => spec("conv1d_silu_l2qk", wgsl!("conv1d_silu_l2qk"), None, true).with(&[CONV_L2QK]),
            Kernel::GdnConvGates => {
                spec("gdn_conv_gates", wgsl!("gdn_conv_gates"), None, true).with(&[CONV_L2QK, GATES])
            }
            Kernel::AddAssign => spec("add_assign", wgsl!("add_assign"), None, false),
            Kernel::Swiglu => spec("swiglu", wgsl!("swiglu"), None, false),
            Kernel::SigmoidMulAssign => spec("sigmoid_mul_assign", wgsl!("sigmoid_mul_assign"), None, false),
            Kernel::SigmoidScaleAdd => spec("sigmoid_scale_add", wgsl!("sigmoid_scale_add"), None, false),
            Kernel::SplitQgate => spec("split_qgate", wgsl!("split_qgate"), None, false),
            Kernel::Argmax => spec("argmax", wgsl!("argmax"), None, false).with(&[ARGMAX, ARGMAX_SCAN]),
            Kernel::ArgmaxSplit => {
                spec("argmax_split", wgsl!("argmax_split"), None, false).with(&[ARGMAX, ARGMAX_SCAN])
            }
            Kernel::ArgmaxCombine => spec("argmax_combine", wgsl!("argmax_combine"), None, false).with(&[ARGMAX]),
            Kernel::GdnGates => spec("gdn_gates", wgsl!("gdn_gates"), None, false).with(&[GATES]),
            Kernel::Rope => spec("rope_neox", wgsl!("rope_neox"), None, false).with(&[ROPE]),
            Kernel::KvStore => spec("kv_store", wgsl!("kv_store"), None, false),
            Kernel::AttnQkPrep => {
                spec("attn_qk_prep", wgsl!("attn_qk_prep"), None, true).with(&[ROPE, PREP, PREP_Q, PREP_KV])
            }
            Kernel::AttnPrepQ => spec("attn_prep_q", wgsl!("attn_prep_q"), None, true).with(&[ROPE, PREP, PREP_Q]),
            Kernel::AttnPrepKv => spec("attn_prep_kv", wgsl!("attn_prep_kv"), None, true).with(&[ROPE, PREP, PREP_KV]),
            Kernel::Attention => spec("attention", wgsl!("attention"), None, false).with(&[ATT_POS, ATTEND]),
            Kernel::AttentionTiled => spec("attention_tiled", wgsl!("attention_tiled"), None, false),
            Kernel::AttentionSplit => {
                spec("attention_split", wgsl!("attention_split"), None, false).with(&[ATT_POS, ATTEND])
            }
            Kernel::AttentionCombine => {
                spec("attention_combine", wgsl!("attention_combine"), None, false).with(&[ATT_MERGE])
            }
            Kernel::AttentionCombineGate => {
                spec("attention_combine_gate", wgsl!("attention_combine_gate"), None, false)
                    .with(&[ATT_MERGE, ATT_NOXQ])
            }
            Kernel::AttentionCombineGateDot => spec(
                "attention_combine_gate_dot",
                wgsl!("attention_combine_gate"),
                None,
                false,
            )
            .with(&[ATT_MERGE, DOT_PREP, ATT_XQ]),
            Kernel::DeltaRecurrent => {
                spec("delta_rule_recurrent", wgsl!("delta_rule_recurrent"), None, false).with(if caps.subgroups {
                    &[DELTA_TOKEN, DELTA_ROWS_SG]
                } else {
                    &[DELTA_TOKEN, DELTA_ROWS_PLAIN]
                })
            }
            Kernel::DeltaChunkPrep => spec("delta_rule_chunk_prep", wgsl!("delta_rule_chunk_prep"), None, false),
            Kernel::DeltaChunkState => spec("delta_rule_chunk_state", wgsl!("delta_rule_chunk_state"), None, false),
            Kernel::MoeSwigluSh => spec("moe_swiglu_sh", wgsl!("moe_swiglu_sh"), Four, false)
                .mv()
                .with(&[MOE_SH, wgsl!("lib_moe_sh_ids")]),
            Kernel::MoeDownSh => spec("moe_down_sh", wgsl!("moe_down_sh"), Two, false)
                .mv()
                .with(&[MOE_SH]),
            // Steps of many sequences (ops/rows.rs).
            Kernel::ConvRows => spec("conv1d_silu_rows", wgsl!("conv1d_silu_rows"), None, false),
            Kernel::DeltaRows => {
                spec("delta_rule_rows", wgsl!("delta_rule_rows"), None, false).with(if caps.subgroups {
                    &[DELTA_TOKEN, DELTA_ROWS_SG]
                } else {
                    &[DELTA_TOKEN, DELTA_ROWS_PLAIN]
                })
            }
            Kernel::RopeRows => spec("rope_neox_rows", wgsl!("rope_neox_rows"), None, false).with(&[ROPE]),
            Kernel::KvStoreRows => spec("kv_store_rows", wgsl!("kv_store_rows"), None, false),
            Kernel::AttentionRowsSplit => {
                spec("attention_rows_split", wgsl!("attention_rows_split"), None, false).with(&[ATTEND, ATT_ROWS])
            }
            Kernel::AttentionRowsCombine => {
                spec("attention_rows_combine", wgsl!("attention_rows_combine"), None, false)
                    .with(&[ATT_MERGE, ATT_ROWS])
            }
        }
    }

    /// Whether the kernel reads a weight (and so needs a format).
    #[cfg(test)]
    fn has_weights(self, caps: &Caps) -> bool {
        self.spec(caps).weights != Weights::None
    }
}

// ---- weight formats ---------------------------------------------------------------------------

/// A weight format's WGSL: its file, and whether it brings its own `deq8` and matrix-vector unit
/// (`mv_x`/`mv_dot`: fast, whole-word decoding) or takes the generic ones built from `deq`.
struct Format {
    file: &'static str,
    fast_deq8: bool,
    /// The format's own matrix-vector unit (`mv_<type>.wgsl` and what it calls); empty: the
    /// generic one.
    mv: &'static [&'static str],
    /// Uses `kq_scale_min` (Q4_K, Q5_K).
    kquant: bool,
}

const fn fmt(file: &'static str, fast_deq8: bool, mv: &'static [&'static str], kquant: bool) -> Format {
    Format {
        file,
        fast_deq8,
        mv,
        kquant,
    }
}

/// `matmul_coop2`'s weight staging for `ty` (lib_c2w_*.wgsl): the formats whose dequant file
/// splits `deq8` into loads and arithmetic (Q4_K, Q6_K) load a unit at a k step's fetch and decode
/// it at its put, after the step's products (decoded next to its loads, every step waited on them:
/// H200 12288 x 4096 x 512 Q4_K 622 -> 447 us); the other formats decode at the fetch.
fn c2_weight_stage(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::Q4K | GgmlType::Q6K => wgsl!("lib_c2w_words"),
        _ => wgsl!("lib_c2w_deq8"),
    }
}

fn format(ty: GgmlType) -> Option<Format> {
    use GgmlType::*;
    Some(match ty {
        F32 => fmt(wgsl!("dequant_f32"), true, &[MV_XRUN, wgsl!("mv_f32")], false),
        F16 => fmt(wgsl!("dequant_f16"), true, &[MV_XRUN, wgsl!("mv_half")], false),
        Bf16 => fmt(wgsl!("dequant_bf16"), true, &[MV_XRUN, wgsl!("mv_half")], false),
        Q4_0 => fmt(wgsl!("dequant_q4_0"), false, &[], false),
        Q4_1 => fmt(wgsl!("dequant_q4_1"), false, &[], false),
        Q5_0 => fmt(wgsl!("dequant_q5_0"), false, &[], false),
        Q5_1 => fmt(wgsl!("dequant_q5_1"), false, &[], false),
        Q8_0 => fmt(wgsl!("dequant_q8_0"), true, &[MV_XRUN, wgsl!("mv_q8_0")], false),
        Q2K => fmt(wgsl!("dequant_q2_k"), false, &[], false),
        Q3K => fmt(wgsl!("dequant_q3_k"), false, &[], false),
        Q4K => fmt(
            wgsl!("dequant_q4_k"),
            true,
            &[wgsl!("mv_kquant"), wgsl!("mv_q4_k")],
            true,
        ),
        Q5K => fmt(
            wgsl!("dequant_q5_k"),
            true,
            &[wgsl!("mv_kquant"), wgsl!("mv_q5_k")],
            true,
        ),
        Q6K => fmt(wgsl!("dequant_q6_k"), true, &[wgsl!("mv_q6_k")], false),
        Iq4Nl => fmt(wgsl!("dequant_iq4_nl"), false, &[], false),
        Iq4Xs => fmt(wgsl!("dequant_iq4_xs"), false, &[], false),
        Mxfp4 => fmt(wgsl!("dequant_mxfp4"), false, &[], false),
        _ => return None,
    })
}

/// Whether format `ty` has its own whole-word matrix-vector unit (else the generic one, which
/// decodes element by element through `deq`).
pub(crate) fn mv_whole_word(ty: GgmlType) -> bool {
    format(ty).is_some_and(|f| !f.mv.is_empty())
}

/// Whether `kernel` runs format `ty` on packed integer dot products over x quantized by
/// `Kernel::MvDotPrep` (`Caps::mv_dot`): Q4_K and Q6_K in the dense decode kernels (their x
/// binding then holds the quantized x).
pub(crate) fn mv_dot(caps: &Caps, kernel: Kernel, ty: GgmlType) -> bool {
    caps.mv_dot
        && mv_dot_unit(ty).is_some()
        && matches!(
            kernel,
            Kernel::Matvec
                | Kernel::MatvecTall
                | Kernel::MatvecSwiglu
                | Kernel::MatvecSwigluXq
                | Kernel::MatvecGroup2
                | Kernel::MatvecGroup3
                | Kernel::MatvecGroup4
        )
}

/// The format's packed-integer-dot unit (after `lib_mv_dot.wgsl`), if it has one.
fn mv_dot_unit(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4K => Some(wgsl!("mv_q4_k_dot")),
        GgmlType::Q6K => Some(wgsl!("mv_q6_k_dot")),
        _ => None,
    }
}

/// u32 words of x quantized for the dot units: `XQ_VEC4` vec4s per 32 elements.
pub(crate) fn xq_words(n_in: usize) -> usize {
    n_in / 32 * XQ_VEC4 as usize * 4
}

/// Whether the backend has a dequantizer for `ty`.
pub(crate) fn supports(ty: GgmlType) -> bool {
    format(ty).is_some()
}

/// Elements per matrix-vector unit of a format (`MV_UNIT` in its WGSL): 8 for the plain floats,
/// 64 for the formats with their own decoder (Q8_0: a pair of blocks; the K-quants: a quarter
/// block), 32 for the generic one.
pub(crate) fn mv_unit(ty: GgmlType) -> usize {
    use GgmlType::*;
    match ty {
        F32 | F16 | Bf16 => 8,
        Q8_0 | Q4K | Q5K | Q6K => 64,
        _ => 32,
    }
}

const COMMON: &str = wgsl!("common");
const W_ACCESS: &str = wgsl!("lib_weights");
const W_ONE: &str = wgsl!("lib_w1");
const W_TWO: &str = wgsl!("lib_w2");
const W_FOUR: &str = wgsl!("lib_w4");
const KQUANT: &str = wgsl!("lib_kquant");
const DEQ8_GENERIC: &str = wgsl!("lib_deq8_generic");
const MV_GENERIC: &str = wgsl!("lib_mv_generic");
const MV_XRUN: &str = wgsl!("lib_mv_xrun");
const REDUCE_SG: &str = wgsl!("lib_reduce_sg");
const REDUCE_PLAIN: &str = wgsl!("lib_reduce_plain");
const MV_UNIT_LIB: &str = wgsl!("lib_mv_unit");
const MV_TREE: &str = wgsl!("lib_mv_tree");
const MV_REDUCE_SG: &str = wgsl!("lib_mv_reduce_sg");
const MV_REDUCE_PLAIN: &str = wgsl!("lib_mv_reduce_plain");
const MV_DOT: &str = wgsl!("lib_mv_dot");

/// The weight and output bindings of `matvec_group.wgsl` for `n` products (weight s at binding
/// 2 + 2s, its output at 3 + 2s; x is binding 1) and their accessors for the workgroup's segment
/// `wsel` (lib_mvg_io.wgsl): generated, so each count binds only what it uses.
fn group_io(n: u32) -> String {
    let mut s = String::from("// Generated from src/backend/wgpu/kernels.rs (group_io).\n");
    for i in 0..n {
        s.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> W{i}: array<vec4<u32>>;\n\
             @group(0) @binding({}) var<storage, read_write> O{i}: array<f32>;\n",
            2 + 2 * i,
            3 + 2 * i
        ));
    }
    let last = n.saturating_sub(1);
    s.push_str("fn wq(i: u32) -> vec4<u32> {\n");
    for i in 0..last {
        s.push_str(&format!("    if (wsel == {i}u) {{\n        return W{i}[i];\n    }}\n"));
    }
    s.push_str(&format!("    return W{last}[i];\n}}\n"));
    s.push_str("fn mvg_store(r: u32, v: f32) {\n");
    for i in 0..last {
        s.push_str(&format!(
            "    if (wsel == {i}u) {{\n        O{i}[r] = v;\n        return;\n    }}\n"
        ));
    }
    s.push_str(&format!("    O{last}[r] = v;\n}}\n"));
    s
}

/// A kernel's label (profile and debugger name), e.g. `matvec/q4_k`.
pub(crate) fn label(kernel: Kernel, fmt: Option<GgmlType>, caps: &Caps) -> String {
    let name = kernel.spec(caps).name;
    match fmt {
        Some(t) => format!("{name}/{}", t.name().to_lowercase()),
        None => name.to_string(),
    }
}

/// The full WGSL source of `kernel` for weight format `fmt` under the selected variants.
pub(crate) fn source(kernel: Kernel, fmt: Option<GgmlType>, caps: &Caps) -> Result<String> {
    let sp = kernel.spec(caps);
    let mut src = String::new();
    if kernel == Kernel::MatmulCoop2 {
        if caps.coop == Coop::Off || caps.coop2.is_none() {
            return Err(gpu_err("the cooperative-matrix kernel is not enabled on this device"));
        }
        src.push_str("enable f16;\n");
        if caps.coop == Coop::On {
            src.push_str("enable wgpu_cooperative_matrix;\n");
        }
    }
    src.push_str(&constants(caps, kernel, fmt));
    src.push_str(COMMON);
    match (sp.weights, fmt) {
        (Weights::None, None) => {}
        (Weights::None, Some(_)) => return Err(gpu_err(format!("{}: takes no weight format", sp.name))),
        (_, None) => return Err(gpu_err(format!("{}: needs a weight format", sp.name))),
        (w, Some(ty)) => {
            let f =
                format(ty).ok_or_else(|| gpu_err(format!("weight type {ty} is not supported by the wgpu backend")))?;
            match w {
                Weights::Two => src.push_str(W_TWO),
                Weights::Four => src.push_str(W_FOUR),
                Weights::Group(n) => src.push_str(&group_io(n)),
                _ => src.push_str(W_ONE),
            }
            src.push_str(W_ACCESS);
            if f.kquant {
                src.push_str(KQUANT);
            }
            src.push_str(f.file);
            if !f.fast_deq8 {
                src.push_str(DEQ8_GENERIC);
            }
            if kernel == Kernel::MatmulCoop2 {
                src.push_str(c2_weight_stage(ty));
            }
            // Matrix-vector units only where the kernel defines xv().
            if let Some(unit) = mv_dot_unit(ty).filter(|_| sp.matvec && mv_dot(caps, kernel, ty)) {
                src.push_str(MV_DOT);
                src.push_str(unit);
            } else if sp.matvec {
                if f.mv.is_empty() {
                    src.push_str(MV_XRUN);
                    src.push_str(MV_GENERIC);
                }
                for part in f.mv {
                    src.push_str(part);
                }
            }
        }
    }
    if sp.reduce {
        src.push_str(if caps.subgroups { REDUCE_SG } else { REDUCE_PLAIN });
    }
    if sp.matvec {
        src.push_str(MV_UNIT_LIB);
        src.push_str(MV_TREE);
        src.push_str(if caps.subgroups { MV_REDUCE_SG } else { MV_REDUCE_PLAIN });
    }
    for lib in sp.libs {
        src.push_str(lib);
    }
    src.push_str(sp.body);
    Ok(src)
}

/// How a shader declares binding `n` (parsed from its source): the layout is explicit so that the
/// parameter block can take a dynamic offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Uniform,
    Read,
    ReadWrite,
}

/// The bindings of group 0 in order of their number, from `@binding(N) var<...>` declarations.
pub(crate) fn bindings(src: &str) -> Result<Vec<Slot>> {
    let mut out: Vec<Option<Slot>> = Vec::new();
    for line in src.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let Some(at) = line.find("@binding(") else {
            continue;
        };
        let rest = &line[at + "@binding(".len()..];
        let close = rest.find(')').ok_or_else(|| gpu_err(format!("bad binding: {line}")))?;
        let n: usize = rest[..close]
            .trim()
            .parse()
            .map_err(|_| gpu_err(format!("bad binding number: {line}")))?;
        let slot = if line.contains("var<uniform>") {
            Slot::Uniform
        } else if line.contains("read_write>") {
            Slot::ReadWrite
        } else if line.contains("var<storage, read>") || line.contains("var<storage>") {
            Slot::Read
        } else {
            return Err(gpu_err(format!("unknown binding kind: {line}")));
        };
        if out.len() <= n {
            out.resize(n + 1, None);
        }
        if out[n].replace(slot).is_some() {
            return Err(gpu_err(format!("binding {n} declared twice")));
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, s)| s.ok_or_else(|| gpu_err(format!("binding {i} missing"))))
        .collect()
}

/// Every (kernel, format) pair a backend may build, for the shader validation test.
#[cfg(test)]
fn all_keys(caps: &Caps) -> Vec<(Kernel, Option<GgmlType>)> {
    use GgmlType::*;
    let types = [
        F32, F16, Bf16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Iq4Nl, Iq4Xs, Mxfp4,
    ];
    let mut v = Vec::new();
    for &k in ALL {
        if k == Kernel::MatmulCoop2 && caps.coop2.is_none() {
            continue;
        }
        if k.has_weights(caps) {
            v.extend(types.iter().map(|&t| (k, Some(t))));
        } else {
            v.push((k, None));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::wgpu::geometry::{
        mv_group_bindings, ATT_GATE_BINDINGS, GATES_BINDINGS, MOE_SH_BINDINGS, PREP_BINDINGS, PREP_HALF_BINDINGS,
    };
    use crate::backend::wgpu::options::{Tuning, WgpuOptions};

    /// One state row per subgroup where the subgroup size is fixed; 8 rows where it varies
    /// (subgroups then loop over the block's rows); the plain path's rows of `DELTA_LANES`.
    #[test]
    fn delta_rows_follow_the_subgroup_size() {
        use crate::backend::wgpu::caps::tests::caps;
        use crate::backend::Precision;
        let sg = caps(
            wgpu::Features::SUBGROUP,
            Precision::Exact,
            false,
            WgpuOptions::default(),
        );
        assert_eq!(delta_rec_rows(&sg.with_subgroup_sizes(32, 32)), 8);
        assert_eq!(delta_rec_rows(&sg.with_subgroup_sizes(8, 8)), 32);
        assert_eq!(delta_rec_rows(&sg.with_subgroup_sizes(64, 64)), 4);
        assert_eq!(delta_rec_rows(&sg.with_subgroup_sizes(8, 16)), 8);
        assert_eq!(delta_rec_rows(&sg), 8);
        let plain = WgpuOptions {
            plain: true,
            ..Default::default()
        };
        let plain = caps(wgpu::Features::SUBGROUP, Precision::Exact, false, plain).with_subgroup_sizes(8, 8);
        assert_eq!(delta_rec_rows(&plain), DELTA_REC_WG / DELTA_LANES);
    }

    #[test]
    fn bindings_are_parsed_in_order() {
        let src = "@group(0) @binding(0) var<uniform> P: Params;\n\
                   // @group(0) @binding(9) var<storage, read> commented: array<u32>;\n\
                   @group(0) @binding(2) var<storage, read_write> out: array<f32>;\n\
                   @group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;\n";
        assert_eq!(bindings(src).unwrap(), vec![Slot::Uniform, Slot::Read, Slot::ReadWrite]);
        assert!(bindings("@group(0) @binding(1) var<storage, read> a: array<u32>;").is_err());
    }

    /// Where a matrix-vector kernel (naga IR) indexes an array or a matrix that is not in a
    /// storage or workgroup buffer with a run-time index, or declares a function-scope array:
    /// naga does not unroll loops and copies a by-value array into a function variable to index
    /// it, and the NVIDIA driver put such data in local memory (these kernels ran 10x slower).
    fn private_dynamic_indexing(module: &wgpu::naga::Module, info: &wgpu::naga::valid::ModuleInfo) -> Vec<String> {
        use wgpu::naga::{AddressSpace, Expression, TypeInner};
        let types = &module.types;
        let mut found = Vec::new();
        let funcs = module.functions.iter().map(|(h, f)| (f, &info[h]));
        let entries = module
            .entry_points
            .iter()
            .enumerate()
            .map(|(i, e)| (&e.function, info.get_entry_point(i)));
        for (f, fi) in funcs.chain(entries) {
            let name = f.name.clone().unwrap_or_default();
            for (_, local) in f.local_variables.iter() {
                if matches!(types[local.ty].inner, TypeInner::Array { .. }) {
                    found.push(format!("{name}: function-scope array {:?}", local.name));
                }
            }
            for (_, e) in f.expressions.iter() {
                let Expression::Access { base, .. } = *e else {
                    continue;
                };
                let private = |space| matches!(space, AddressSpace::Function | AddressSpace::Private);
                let bad = match *fi[base].ty.inner_with(types) {
                    TypeInner::Array { .. } | TypeInner::Matrix { .. } => true,
                    TypeInner::Pointer { base: pointee, space } => {
                        private(space)
                            && matches!(types[pointee].inner, TypeInner::Array { .. } | TypeInner::Matrix { .. })
                    }
                    _ => false,
                };
                if bad {
                    found.push(format!("{name}: run-time index into a private array or matrix"));
                }
            }
        }
        found
    }

    /// The caps of an exact-tier adapter with subgroups, or its plain (browser) variant.
    fn exact_caps(plain: bool) -> Caps {
        use crate::backend::wgpu::caps::tests::caps;
        use crate::backend::Precision;
        caps(
            wgpu::Features::SUBGROUP,
            Precision::Exact,
            false,
            WgpuOptions {
                plain,
                ..Default::default()
            },
        )
    }

    /// Builds, parses and validates a kernel's WGSL and asserts that it indexes no private array
    /// or matrix at run time (`private_dynamic_indexing`); returns the module.
    fn check_registers(what: &str, k: Kernel, fmt: Option<GgmlType>, c: &Caps) -> wgpu::naga::Module {
        use wgpu::naga;
        let src = source(k, fmt, c).unwrap_or_else(|e| panic!("{what}: {e}"));
        let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{what}: {e}"));
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let found = private_dynamic_indexing(&module, &info);
        assert!(found.is_empty(), "{what}: {found:#?}");
        module
    }

    /// The matrix-vector kernels (decode's hot loop) index no private array or matrix at run
    /// time, in every format, both reductions and the row-count extremes.
    #[test]
    fn matvec_kernels_keep_their_data_in_registers() {
        use crate::backend::wgpu::caps::tests::caps;
        use crate::backend::Precision;
        let sg = wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16;
        for (plain, rows, dot) in [
            (false, 1, false),
            (false, 4, false),
            (true, 2, false),
            (true, 8, false),
            (false, 2, true),
            (true, 8, true),
        ] {
            let c = caps(
                sg,
                Precision::Exact,
                false,
                WgpuOptions {
                    plain,
                    dot: Some(dot),
                    tuning: Tuning {
                        mv_rows: Some(rows),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            );
            assert_eq!(c.mv_rows, rows);
            let mut checked = 0;
            for (k, fmt) in all_keys(&c) {
                if !k.spec(&c).matvec {
                    continue;
                }
                let what = format!("plain {plain} rows {rows} dot {dot} {}", label(k, fmt, &c));
                check_registers(&what, k, fmt, &c);
                checked += 1;
            }
            assert_eq!(
                checked,
                10 * 16,
                "matvec, matvec_tall, matvec_swiglu (and _xq), the three matvec_groups, moe_matvec, moe_swiglu_sh, \
                 moe_down_sh in every format"
            );
        }
    }

    /// Bytes of workgroup memory a module declares.
    fn workgroup_bytes(module: &wgpu::naga::Module) -> u32 {
        module
            .global_variables
            .iter()
            .filter(|(_, v)| v.space == wgpu::naga::AddressSpace::WorkGroup)
            .map(|(_, v)| module.types[v.ty].inner.size(module.to_ctx()))
            .sum()
    }

    /// The chunked delta rule kernels (prefill's sequential core) keep their per-invocation data in
    /// registers (the earlier chunk-state kernel indexed a private 128-float state row and ran
    /// from local memory on NVIDIA) and stay within the 16 KiB of workgroup memory every WebGPU
    /// adapter offers, with and without subgroups.
    #[test]
    fn delta_chunk_kernels_keep_their_data_in_registers() {
        for plain in [false, true] {
            let c = exact_caps(plain);
            for k in [Kernel::DeltaChunkPrep, Kernel::DeltaChunkState] {
                let what = format!("plain {plain} {k:?}");
                let module = check_registers(&what, k, None, &c);
                let shared = workgroup_bytes(&module);
                assert!(shared <= 16 << 10, "{what}: {shared} bytes of workgroup memory");
            }
        }
    }

    /// The row kernels of steps of many sequences keep their per-invocation data in registers
    /// (conv1d_silu_rows reads its taps' inputs from the pool, not a private window), with and
    /// without subgroups.
    #[test]
    fn row_kernels_keep_their_data_in_registers() {
        for plain in [false, true] {
            let c = exact_caps(plain);
            for k in [
                Kernel::ConvRows,
                Kernel::DeltaRows,
                Kernel::AttentionRowsSplit,
                Kernel::AttentionRowsCombine,
            ] {
                check_registers(&format!("plain {plain} {k:?}"), k, None, &c);
            }
        }
    }

    /// The tiled prefill attention in both geometries keeps its accumulators in registers (its
    /// scores in vec4s, its outputs in matrices indexed by constants) and declares exactly the
    /// workgroup memory `AttTile::workgroup_bytes` says (what caps checks against the device's
    /// limit), with and without subgroups.
    #[test]
    fn tiled_attention_declares_what_caps_assumes() {
        for plain in [false, true] {
            for t in [AttTile::DEFAULT, AttTile::SMALL] {
                let c = Caps {
                    att_tiled: Some(t),
                    ..exact_caps(plain)
                };
                let what = format!("plain {plain} {t:?}");
                let module = check_registers(&what, Kernel::AttentionTiled, None, &c);
                assert_eq!(workgroup_bytes(&module), t.workgroup_bytes(), "{what}");
            }
        }
        assert!(AttTile::SMALL.workgroup_bytes() <= 16 << 10);
    }

    /// The kernels that write packed-dot planes keep each invocation's block data in registers
    /// (the norms: its half block as a matrix, indexed by constants; the whole-block writers:
    /// plain values), with and without subgroups.
    #[test]
    fn dot_norms_keep_their_data_in_registers() {
        for plain in [false, true] {
            let c = exact_caps(plain);
            for k in [
                Kernel::RmsNormDot,
                Kernel::AddRmsNormDot,
                Kernel::GatedRmsNormDot,
                Kernel::MvDotPrep,
                Kernel::AttentionCombineGateDot,
            ] {
                check_registers(&format!("plain {plain} {k:?}"), k, None, &c);
            }
        }
    }

    /// The element-decoded formats take at most `MV_GENERIC_MAX_ROWS` rows per invocation, in the
    /// shader and in the dispatch's workgroup count alike; the whole-word formats take the tuning.
    #[test]
    fn generic_formats_keep_few_rows() {
        use crate::backend::wgpu::caps::tests::caps;
        use crate::backend::Precision;
        let c = caps(
            wgpu::Features::SUBGROUP,
            Precision::Exact,
            false,
            WgpuOptions {
                tuning: Tuning {
                    mv_rows: Some(8),
                    mv_rows_swiglu: Some(4),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        for (ty, rows, swiglu) in [
            (GgmlType::Q4K, 8, 4),
            (GgmlType::F32, 8, 4),
            (GgmlType::Q4_0, 2, 2),
            (GgmlType::Q5_0, 2, 2),
        ] {
            assert_eq!(mv_rows(&c, Kernel::Matvec, Some(ty)), rows, "{ty}");
            assert_eq!(mv_rows(&c, Kernel::MatvecSwiglu, Some(ty)), swiglu, "{ty}");
            assert_eq!(mv_rows_per_wg(&c, Kernel::Matvec, ty, 32), c.mv_wg / 32 * rows, "{ty}");
            let src = source(Kernel::Matvec, Some(ty), &c).unwrap();
            assert!(src.contains(&format!("const MV_R: u32 = {rows}u;")), "{ty}");
        }
    }

    /// The SwiGLU that writes its output's planes (matvec_swiglu_xq.wgsl) keeps a workgroup's span
    /// of outputs in workgroup memory: at the tuning's largest (256 invocations, 8 rows,
    /// one lane: 2048 rows) it must stay within the 16 KiB every WebGPU adapter offers, with and
    /// without subgroups, on the packed-dot units and the f32 ones (the registers as
    /// `matvec_kernels_keep_their_data_in_registers`).
    #[test]
    fn swiglu_planes_fit_workgroup_memory() {
        use crate::backend::wgpu::caps::tests::caps;
        use crate::backend::Precision;
        for (plain, dot) in [(false, true), (true, true), (false, false)] {
            let c = caps(
                wgpu::Features::SUBGROUP,
                Precision::Exact,
                false,
                WgpuOptions {
                    plain,
                    dot: Some(dot),
                    tuning: Tuning {
                        mv_wg: Some(256),
                        mv_rows: Some(8),
                        mv_lanes: Some(1),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            );
            assert_eq!(
                (c.mv_wg, c.mv_rows, mv_xq_span(&c, GgmlType::Q4K, mv_lanes(&c, 1))),
                (256, 8, 2048)
            );
            for ty in [GgmlType::Q4K, GgmlType::Q6K] {
                let what = format!("plain {plain} dot {dot} {ty}");
                let module = check_registers(&what, Kernel::MatvecSwigluXq, Some(ty), &c);
                let shared = workgroup_bytes(&module);
                assert!(shared <= 16 << 10, "{what}: {shared} bytes of workgroup memory");
            }
        }
    }

    /// `mv_lanes_spread` widens a small product's row groups until it has the workgroups asked
    /// for, never past the workgroup or the row's cover, and leaves everything alone when off.
    #[test]
    fn small_products_spread_their_lanes() {
        use crate::backend::wgpu::caps::tests::caps;
        use crate::backend::Precision;
        let with = |min_wg| {
            caps(
                wgpu::Features::SUBGROUP,
                Precision::Exact,
                false,
                WgpuOptions {
                    tuning: Tuning {
                        mv_min_wg: min_wg,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
        };
        let (off, on) = (with(Some(0)), with(Some(132)));
        let mv = Kernel::Matvec;
        // The MoE router, 257 f32 rows of 2048 (256 units of 8, a long row): 64 lanes x 2 rows,
        // two row groups per workgroup, 65 workgroups; spread, one row group, 129.
        assert_eq!(mv_lanes_spread(&off, mv, GgmlType::F32, 256, 257), 64);
        assert_eq!(mv_lanes_spread(&on, mv, GgmlType::F32, 256, 257), 128);
        assert_eq!(mv_rows_per_wg(&on, mv, GgmlType::F32, 128), 2);
        // Enough workgroups already (4096 rows / 8 = 512): unchanged.
        assert_eq!(mv_lanes_spread(&on, mv, GgmlType::Q4K, 16, 4096), mv_lanes(&on, 16));
        // A short row (2 units) covers only 2 lanes, however few the workgroups.
        assert_eq!(mv_lanes_spread(&on, mv, GgmlType::F32, 2, 4), 2);
    }

    /// The fused decode kernels bind as many storage buffers as `caps` assumes when it picks
    /// them for an adapter's limit.
    #[test]
    fn fused_kernels_bind_what_caps_assumes() {
        for plain in [false, true] {
            let c = exact_caps(plain);
            let storage = |k: Kernel, fmt: Option<GgmlType>| {
                let slots = bindings(&source(k, fmt, &c).unwrap()).unwrap();
                assert_eq!(slots[0], Slot::Uniform);
                slots.len() as u32 - 1
            };
            for n in 2..=4 {
                let k = Kernel::matvec_group(n).unwrap();
                assert_eq!(storage(k, Some(GgmlType::Q4K)), mv_group_bindings(n as u32), "{k:?}");
            }
            assert_eq!(storage(Kernel::GdnConvGates, None), GATES_BINDINGS);
            assert_eq!(storage(Kernel::AttnQkPrep, None), PREP_BINDINGS);
            assert_eq!(storage(Kernel::AttnPrepQ, None), 5);
            assert_eq!(storage(Kernel::AttnPrepKv, None), PREP_HALF_BINDINGS);
            for k in [Kernel::MoeSwigluSh, Kernel::MoeDownSh] {
                assert_eq!(storage(k, Some(GgmlType::Q4K)), MOE_SH_BINDINGS, "{k:?}");
            }
            assert_eq!(storage(Kernel::AttentionCombineGateDot, None), ATT_GATE_BINDINGS);
            // Within the 8 storage buffers of every adapter (caps does not check it).
            assert_eq!(storage(Kernel::MatvecSwigluXq, Some(GgmlType::Q4K)), 5);
        }
        assert_eq!(Kernel::matvec_group(1), None);
        assert_eq!(Kernel::matvec_group(5), None);
    }

    /// Every kernel in every format and variant parses, validates and compiles to SPIR-V with
    /// naga (the compiler wgpu uses), including the cooperative-matrix kernel that only the GPU
    /// machine runs: a shader error there would otherwise surface only on the device.
    #[test]
    fn every_kernel_variant_compiles() {
        use crate::backend::wgpu::caps::coop_features;
        use crate::backend::wgpu::caps::tests::caps;
        use crate::backend::Precision;
        use wgpu::naga;
        let sg = wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16;
        let variants = [
            (
                "plain",
                caps(
                    sg,
                    Precision::Fast,
                    true,
                    WgpuOptions {
                        plain: true,
                        ..Default::default()
                    },
                ),
            ),
            ("subgroups", caps(sg, Precision::Exact, false, WgpuOptions::default())),
            (
                "coop",
                caps(sg | coop_features(), Precision::Fast, true, WgpuOptions::default()),
            ),
            (
                "coop-emulated",
                caps(
                    sg,
                    Precision::Fast,
                    false,
                    WgpuOptions {
                        coop_emulate: true,
                        ..Default::default()
                    },
                ),
            ),
            // The matrix-vector workgroup sizes the tuning allows besides the default.
            (
                "plain, matvec workgroup 256",
                caps(
                    sg,
                    Precision::Exact,
                    false,
                    WgpuOptions {
                        plain: true,
                        tuning: Tuning {
                            mv_wg: Some(256),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
            ),
            (
                "subgroups, matvec workgroup 64",
                caps(
                    sg,
                    Precision::Exact,
                    false,
                    WgpuOptions {
                        tuning: Tuning {
                            mv_wg: Some(64),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
            ),
            // The geometry's extremes: one and eight rows per invocation.
            (
                "plain, matvec rows 8, workgroup 256",
                caps(
                    sg,
                    Precision::Exact,
                    false,
                    WgpuOptions {
                        plain: true,
                        tuning: Tuning {
                            mv_wg: Some(256),
                            mv_rows: Some(8),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
            ),
            (
                "subgroups, matvec rows 1",
                caps(
                    sg,
                    Precision::Exact,
                    false,
                    WgpuOptions {
                        tuning: Tuning {
                            mv_rows: Some(1),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
            ),
            // One state row per subgroup of 8 in the recurrent delta rule (lavapipe).
            (
                "subgroups of 8",
                caps(sg, Precision::Exact, false, WgpuOptions::default()).with_subgroup_sizes(8, 8),
            ),
            // The tiled attention's geometry for 16 KiB of workgroup memory (browsers).
            (
                "plain, small attention tiles",
                Caps {
                    att_tiled: Some(AttTile::SMALL),
                    ..caps(
                        sg,
                        Precision::Exact,
                        false,
                        WgpuOptions {
                            plain: true,
                            ..Default::default()
                        },
                    )
                },
            ),
        ];
        assert_eq!(variants[0].1.att_tiled, Some(AttTile::DEFAULT));
        assert_eq!((variants[6].1.mv_rows, variants[7].1.mv_rows), (8, 1));
        assert_eq!(variants[2].1.coop, Coop::On);
        assert_eq!((variants[4].1.mv_wg, variants[5].1.mv_wg), (256, 64));
        assert_eq!(variants[3].1.coop, Coop::Emulated);
        // matmul_coop2 in every geometry the kernel takes (every count of staging units, both
        // pieces, one and two buffers), on tensor cores and emulated.
        let mut variants: Vec<(String, Caps)> = variants.into_iter().map(|(n, c)| (n.to_string(), c)).collect();
        // The packed-integer-dot Q4_K units (`WgpuOptions::dot`) with both reductions.
        for plain in [false, true] {
            let c = caps(
                sg,
                Precision::Exact,
                false,
                WgpuOptions {
                    plain,
                    dot: Some(true),
                    ..Default::default()
                },
            );
            assert!(c.mv_dot);
            variants.push((format!("dot4, plain {plain}"), c));
        }
        for (tile, bufs) in [
            ("128x64x32", 2),
            ("128x64x32/32x64", 2),
            ("64x128x32", 2),
            ("128x128x32", 2),
            ("64x64x32", 2),
            ("128x64x32", 1),
            ("256x64x32", 1),
            ("128x64x64", 1),
            ("128x128x64", 1),
            ("64x64x64", 1),
        ] {
            for emulate in [false, true] {
                let want = CoopTile {
                    bufs,
                    ..CoopTile::parse(tile).unwrap()
                };
                let c = caps(
                    if emulate { sg } else { sg | coop_features() },
                    Precision::Fast,
                    !emulate,
                    WgpuOptions {
                        coop_emulate: emulate,
                        tuning: Tuning {
                            coop_tile: Some(want),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                );
                assert_eq!(c.coop2, Some(want), "{tile}, {bufs} buffers");
                let name = format!("coop2 {tile} {bufs}{}", if emulate { " emulated" } else { "" });
                variants.push((name, c));
            }
        }
        for (name, caps) in variants {
            for (k, fmt) in all_keys(&caps) {
                let what = format!("{name} {}", label(k, fmt, &caps));
                let src = source(k, fmt, &caps).unwrap_or_else(|e| panic!("{what}: {e}"));
                bindings(&src).unwrap_or_else(|e| panic!("{what}: {e}"));
                let module =
                    naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&src)));
                let info =
                    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                        .validate(&module)
                        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&src)));
                naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None)
                    .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));
            }
        }
    }
}
