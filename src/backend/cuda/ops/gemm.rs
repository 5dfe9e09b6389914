//! Matrix products on the tensor cores for the fast prefill path (kernels-cuda/gemm_q.cu):
//! `y[r][o] = dot(W[o], x[r])` with the weight dequantized inside the kernel (Q4_K, Q5_K, Q6_K,
//! Q8_0, F16, BF16) and x in f16 (`shadow.rs`), f32 accumulation and output. Tier, by weight
//! format: quantized weights take f16-rounded activations (rel L2 <= ~6e-3; measured ~3e-4 on
//! the H200), their own quantization error being far larger; F16 and BF16 weights, exact in f16,
//! take x as two f16 planes `hi + lo` (`Fmt::split`): f32-class activations, so that rounding x
//! is not the one error of the product (it flips argmax on near-ties).
//!
//! Tile shapes (gemm_q.cu `PF_CFG_*`): A 128x256 (8 warps), B 128x128 (4 warps), C 32x128 (4 warps,
//! small batches and MoE experts). Split-K writes partial planes to a workspace and
//! `pf_gemm_splitk_reduce` sums them in split order (deterministic). `plan` picks the shape and
//! the split from the H200 measurements of dev/cuda/run-prefill.sh (prefill-gpu-run1: the best
//! of every shape x split at the Qwen3.5-9B products, T = 102, 512, 4096).

use super::{grid_u32, Launch, GRID_YZ_MAX};
use crate::backend::cuda::driver::{cuda_err, DevPtr};
use crate::backend::cuda::op::Args;
use crate::backend::cuda::policy::{self, Batch, GemmActivations};
use crate::backend::cuda::profile::Phase;
pub(crate) use crate::backend::cuda::shadow::F16Planes;
use crate::backend::cuda::Inner;
use crate::backend::Tensor;
use crate::error::Result;
use crate::gguf::GgmlType;

/// A weight format the tensor-core kernels decode, with gemm_q.cu's `FMT_CONSTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fmt {
    Q4K,
    Q5K,
    Q6K,
    Q80,
    F16,
    Bf16,
}

impl Fmt {
    pub(crate) fn of(ty: GgmlType) -> Option<Fmt> {
        Some(match ty {
            GgmlType::Q4K => Fmt::Q4K,
            GgmlType::Q5K => Fmt::Q5K,
            GgmlType::Q6K => Fmt::Q6K,
            GgmlType::Q8_0 => Fmt::Q80,
            GgmlType::F16 => Fmt::F16,
            GgmlType::Bf16 => Fmt::Bf16,
            _ => return None,
        })
    }

    fn ty(self) -> GgmlType {
        match self {
            Fmt::Q4K => GgmlType::Q4K,
            Fmt::Q5K => GgmlType::Q5K,
            Fmt::Q6K => GgmlType::Q6K,
            Fmt::Q80 => GgmlType::Q8_0,
            Fmt::F16 => GgmlType::F16,
            Fmt::Bf16 => GgmlType::Bf16,
        }
    }

    /// Whether the kernel multiplies x as two f16 planes (gemm_q.cu `FmtInfo::SPLIT`,
    /// `policy::gemm_activations`).
    pub(crate) fn split(self) -> bool {
        policy::gemm_activations(self.ty()) == Some(GemmActivations::HiLo)
    }

    /// 64-wide K steps per raw super-step (one K-quant super-block, four Q8_0 blocks, 64 values).
    fn rs(self) -> usize {
        match self {
            Fmt::Q4K | Fmt::Q5K | Fmt::Q6K => 4,
            Fmt::Q80 => 2,
            Fmt::F16 | Fmt::Bf16 => 1,
        }
    }

    /// Shared-memory bytes of one raw row of a super-step (`RAWB`).
    fn rawb(self) -> usize {
        match self {
            Fmt::Q4K | Fmt::F16 | Fmt::Bf16 => 144,
            Fmt::Q5K | Fmt::Q80 => 176,
            Fmt::Q6K => 240,
        }
    }

    /// Kernel name suffixes by tile shape: `pf_gemm_` + `q4k_a`.
    fn kernels(self) -> [&'static str; 3] {
        match self {
            Fmt::Q4K => ["q4k_a", "q4k_b", "q4k_c"],
            Fmt::Q5K => ["q5k_a", "q5k_b", "q5k_c"],
            Fmt::Q6K => ["q6k_a", "q6k_b", "q6k_c"],
            Fmt::Q80 => ["q80_a", "q80_b", "q80_c"],
            Fmt::F16 => ["f16_a", "f16_b", "f16_c"],
            Fmt::Bf16 => ["bf16_a", "bf16_b", "bf16_c"],
        }
    }
}

/// A tile shape of gemm_q.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tile {
    A,
    B,
    C,
}

impl Tile {
    /// (rows BM, weight rows BN, threads, x pipeline stages S).
    fn dims(self) -> (usize, usize, usize, usize) {
        match self {
            Tile::A => (128, 256, 256, 2),
            Tile::B => (128, 128, 128, 2),
            Tile::C => (32, 128, 128, 3),
        }
    }
    pub(crate) fn bm(self) -> usize {
        self.dims().0
    }
    fn bn(self) -> usize {
        self.dims().1
    }
    fn index(self) -> usize {
        self as usize
    }

    /// Dynamic shared memory of the kernel (`GemmCfg::SMEM`): x stages (both planes for the
    /// split formats), two f16 weight tiles, the raw weight slots.
    pub(crate) fn smem(self, f: Fmt) -> usize {
        let (bm, bn, _, s) = self.dims();
        let rs = f.rs();
        let slots = ((s - 1).div_ceil(rs) + 1).max(2);
        let planes = if f.split() { 2 } else { 1 };
        planes * s * bm * 128 + 2 * bn * 128 + slots * bn * f.rawb()
    }

    /// CTAs one SM holds: the register file (A: 256 threads of ~230 registers fill it; B: 128
    /// such threads, half; C: ~120 registers) and shared memory.
    fn ctas_per_sm(self, f: Fmt, smem_per_sm: usize) -> usize {
        let by_regs = match self {
            Tile::A => 1,
            Tile::B => 2,
            Tile::C => 4,
        };
        by_regs.min(smem_per_sm / (self.smem(f) + 1024)).max(1)
    }
}

/// How one product is launched: the tile shape, the K range per split and the splits made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub tile: Tile,
    /// 64-wide K steps per split (a whole number of raw super-steps).
    pub per: usize,
    /// Splits (grid.z); 1 = no split-K.
    pub nz: usize,
}

/// The launch of a `rows x n` product over `k` (a multiple of 64) on `sms` SMs.
///
/// From the H200 measurements (prefill-gpu-run1, every shape x split timed): B 128x128 was the
/// best or within 3% of it at every 9B product and batch for every format but Q6_K, whose B tile
/// fits once per SM (its raw rows are 240 bytes) and A 128x256 wins; C 32x128 only pays for
/// batches of at most 64 rows. The split formats' B tile also fits once per SM (the lo plane's
/// x stages): A for them too, by the same reasoning (run 1 predates the split; dev/cuda's
/// harness times both). A only where a CTA may have its shared memory (an A100's 163 KiB takes
/// B). The split fills the SMs: the largest power of two up to 8 that
/// keeps the CTAs within 1.5 waves (T = 102: 4 for 8192 rows, 8 for 4096; T = 512: 1-2; T = 4096:
/// 1), each split keeping at least two raw super-steps.
pub(crate) fn plan(f: Fmt, rows: usize, n: usize, k: usize, sms: usize, smem_per_sm: usize) -> Plan {
    let tile = if rows <= 64 {
        Tile::C
    } else if (f == Fmt::Q6K || f.split()) && Tile::A.smem(f) + 1024 <= smem_per_sm {
        Tile::A
    } else {
        Tile::B
    };
    let slots = sms * tile.ctas_per_sm(f, smem_per_sm);
    let tiles = n.div_ceil(tile.bn()) * rows.div_ceil(tile.bm());
    let steps = k / 64;
    let rs = f.rs();
    let mut s = 1;
    while s < 8 && 2 * tiles * (2 * s) <= 3 * slots && steps / (2 * s) >= 2 * rs {
        s *= 2;
    }
    let per = steps.div_ceil(s).div_ceil(rs) * rs;
    Plan {
        tile,
        per: per.max(rs),
        nz: steps.div_ceil(per.max(rs)).max(1),
    }
}

/// `pf::GemmParams` (gemm_q.cu; the layout is asserted there).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct GemmParams {
    pub w: u64,
    pub x: u64,
    pub x_lo: u64,
    pub x_rows: u64,
    pub y: u64,
    pub tiles: u64,
    pub num_tiles: u64,
    pub row_bytes: i64,
    pub expert_bytes: i64,
    pub ldx: i64,
    pub ldy: i64,
    pub split_stride: i64,
    pub rows: i32,
    pub n_out: i32,
    pub k: i32,
    pub steps_per_split: i32,
}

/// `pf::ReduceParams` (gemm_q.cu).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ReduceParams {
    ws: u64,
    y: u64,
    ldy: i64,
    rows: i32,
    n: i32,
    splits: i32,
    _pad: i32,
}

/// `pf::SwigluParams` (gemm_q.cu).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SwigluParams {
    gate: u64,
    up: u64,
    h: u64,
    lo: u64,
    out: u64,
    n: i64,
}

/// A weight operand of a tensor-core product.
#[derive(Clone, Copy)]
pub(crate) struct GemmW {
    pub ptr: DevPtr,
    pub row_bytes: usize,
    pub fmt: Fmt,
    pub phase: Phase,
}

impl GemmW {
    /// The operand for a weight of type `ty` with rows of `n_in` values, when the tensor-core
    /// kernels take it: a format they decode and rows of whole 64-wide steps.
    pub(crate) fn new(ptr: DevPtr, row_bytes: usize, ty: GgmlType, n_in: usize, phase: Phase) -> Option<GemmW> {
        let fmt = Fmt::of(ty)?;
        (n_in > 0 && n_in.is_multiple_of(64) && n_in <= i32::MAX as usize).then_some(GemmW {
            ptr,
            row_bytes,
            fmt,
            phase,
        })
    }
}

/// Whether a batch of `t` rows takes the tensor-core path (`policy::Policy::batch`).
pub(crate) fn fast_batch(inner: &Inner, t: usize) -> bool {
    inner.policy.batch(t, inner.recording_here()) == Batch::TensorCores
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| cuda_err(format!("tensor-core product: {what} ({v}) exceeds i32")))
}

/// The x operand's planes as the kernel for `w` reads them: the split formats need the lo plane.
fn x_planes(w: &GemmW, x: F16Planes) -> Result<(u64, u64)> {
    if w.fmt.split() && x.lo == 0 {
        return Err(cuda_err(format!(
            "tensor-core product: {:?} weights need the activations' lo plane",
            w.fmt
        )));
    }
    Ok((x.hi, if w.fmt.split() { x.lo } else { 0 }))
}

#[allow(clippy::too_many_arguments)]
fn launch_gemm(
    inner: &Inner,
    w: &GemmW,
    tile: Tile,
    grid: [u32; 3],
    p: &GemmParams,
    flops: f64,
    reads: &[&Tensor],
    writes: &[&Tensor],
) -> Result<()> {
    let (_, _, threads, _) = tile.dims();
    inner.kernel_rw(
        Launch {
            name: ("pf_gemm_", w.fmt.kernels()[tile.index()]),
            grid,
            block: threads as u32,
            smem: tile.smem(w.fmt) as u32,
            args: Args::from_pod(p),
            phase: w.phase,
        },
        flops,
        reads,
        writes,
    )
}

/// `y [rows, n] (row stride n) = x16 [rows, k] (f16 planes, row stride k) · Wᵀ`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense(
    inner: &Inner,
    w: &GemmW,
    x16: F16Planes,
    y: DevPtr,
    rows: usize,
    n: usize,
    k: usize,
    reads: &[&Tensor],
    writes: &[&Tensor],
) -> Result<()> {
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let pl = plan(w.fmt, rows, n, k, inner.sms(), inner.kernels.smem_per_sm() as usize);
    let m_tiles = rows.div_ceil(pl.tile.bm());
    if m_tiles > GRID_YZ_MAX {
        return Err(cuda_err(format!("tensor-core product: {rows} rows exceed the grid")));
    }
    let (x, x_lo) = x_planes(w, x16)?;
    let ws = if pl.nz > 1 {
        inner.workspace("gemm split-k", pl.nz * rows * n * 4)?
    } else {
        0
    };
    let p = GemmParams {
        w: w.ptr,
        x,
        x_lo,
        y: if ws != 0 { ws } else { y },
        row_bytes: w.row_bytes as i64,
        ldx: k as i64,
        ldy: n as i64,
        split_stride: if ws != 0 { (rows * n) as i64 } else { 0 },
        rows: i32_of("rows", rows)?,
        n_out: i32_of("n_out", n)?,
        k: i32_of("k", k)?,
        steps_per_split: i32_of("steps", pl.per)?,
        ..GemmParams::default()
    };
    let grid = [
        grid_u32("matmul", "weight tiles", n.div_ceil(pl.tile.bn()))?,
        m_tiles as u32,
        pl.nz as u32,
    ];
    let flops = 2.0 * rows as f64 * n as f64 * k as f64;
    launch_gemm(inner, w, pl.tile, grid, &p, flops, reads, writes)?;
    if pl.nz == 1 {
        return Ok(());
    }
    let r = ReduceParams {
        ws,
        y,
        ldy: n as i64,
        rows: rows as i32,
        n: n as i32,
        splits: pl.nz as i32,
        _pad: 0,
    };
    inner.kernel_rw(
        Launch {
            name: ("pf_gemm_splitk_reduce", ""),
            grid: [(rows * n / 4).div_ceil(256).clamp(1, inner.sms() * 8) as u32, 1, 1],
            block: 256,
            smem: 0,
            args: Args::from_pod(&r),
            phase: w.phase,
        },
        0.0,
        &[],
        writes,
    )
}

/// The device-built tile list of a grouped product (kernels-cuda/moe_group.cu).
pub(crate) struct Groups {
    pub tile: Tile,
    pub tiles: DevPtr,
    pub num_tiles: DevPtr,
    /// Upper bound of the tile count (the grid's y extent; CTAs past the real count exit).
    pub max_tiles: usize,
    /// Rows in all groups together (for the FLOP count).
    pub rows: usize,
}

/// Grouped (MoE) product: for every tile {e, r0, r1} of the list, rows r0..r1 of
/// `y [rows, n]` = x rows (both planes gathered through `x_rows` when non-zero) · expert e's
/// `W`ᵀ, whose rows start at `w.ptr + e * expert_bytes`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn grouped(
    inner: &Inner,
    w: &GemmW,
    expert_bytes: usize,
    x16: F16Planes,
    ldx: usize,
    x_rows: DevPtr,
    y: DevPtr,
    n: usize,
    k: usize,
    g: &Groups,
    reads: &[&Tensor],
) -> Result<()> {
    if n == 0 || g.rows == 0 {
        return Ok(());
    }
    if g.max_tiles > GRID_YZ_MAX {
        return Err(cuda_err(format!(
            "grouped product: {} tiles exceed the grid",
            g.max_tiles
        )));
    }
    let (x, x_lo) = x_planes(w, x16)?;
    let p = GemmParams {
        w: w.ptr,
        x,
        x_lo,
        x_rows,
        y,
        tiles: g.tiles,
        num_tiles: g.num_tiles,
        row_bytes: w.row_bytes as i64,
        expert_bytes: expert_bytes as i64,
        ldx: ldx as i64,
        ldy: n as i64,
        n_out: i32_of("n_out", n)?,
        k: i32_of("k", k)?,
        steps_per_split: i32_of("steps", k / 64)?,
        ..GemmParams::default()
    };
    let grid = [
        grid_u32("moe_experts", "weight tiles", n.div_ceil(g.tile.bn()))?,
        g.max_tiles as u32,
        1,
    ];
    let flops = 2.0 * g.rows as f64 * n as f64 * k as f64;
    launch_gemm(inner, w, g.tile, grid, &p, flops, reads, &[])
}

/// `h = f16(silu(gate) * up)` over `n` values into `h.hi`, their lo planes into `h.lo` and the
/// same values in f32 into `out`, each when non-zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn swiglu_f16(
    inner: &Inner,
    gate: DevPtr,
    up: DevPtr,
    h: F16Planes,
    out: DevPtr,
    n: usize,
    phase: Phase,
    writes: &[&Tensor],
) -> Result<()> {
    let p = SwigluParams {
        gate,
        up,
        h: h.hi,
        lo: h.lo,
        out,
        n: n as i64,
    };
    inner.kernel_rw(
        Launch {
            name: ("pf_swiglu_f16", ""),
            grid: [n.div_ceil(256).clamp(1, inner.sms() * 8) as u32, 1, 1],
            block: 256,
            smem: 0,
            args: Args::from_pod(&p),
            phase,
        },
        0.0,
        &[],
        writes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200_SMS: usize = 132;
    const H200_SMEM: usize = 232_448 + 1024;

    /// The shared-memory sizes printed by the H200 harness (prefill-gpu-run1) for every kernel;
    /// F16 and BF16 plus their lo plane's x stages (2 x 128 x 128, 2 x 128 x 128, 3 x 32 x 128
    /// bytes: gemm_q.cu `GemmCfg::XS_BYTES`).
    #[test]
    fn smem_matches_the_kernels() {
        let want = [
            (Fmt::Q4K, [172_032, 102_400, 81_920]),
            (Fmt::Q5K, [188_416, 110_592, 90_112]),
            (Fmt::Q6K, [221_184, 126_976, 106_496]),
            (Fmt::Q80, [188_416, 110_592, 90_112]),
            (Fmt::F16, [204_800, 135_168, 112_640]),
            (Fmt::Bf16, [204_800, 135_168, 112_640]),
        ];
        for (f, sizes) in want {
            for (t, s) in [Tile::A, Tile::B, Tile::C].into_iter().zip(sizes) {
                assert_eq!(t.smem(f), s, "{f:?} {t:?}");
            }
        }
        // CTAs per SM as the harness measured them: B fits twice except for Q6_K.
        assert_eq!(Tile::B.ctas_per_sm(Fmt::Q4K, H200_SMEM), 2);
        assert_eq!(Tile::B.ctas_per_sm(Fmt::Q80, H200_SMEM), 2);
        assert_eq!(Tile::B.ctas_per_sm(Fmt::Q6K, H200_SMEM), 1);
        assert_eq!(Tile::A.ctas_per_sm(Fmt::Q6K, H200_SMEM), 1);
        assert_eq!(Tile::C.ctas_per_sm(Fmt::F16, H200_SMEM), 2);
        // The split formats' B tile fits once (the lo plane), as Q6_K's.
        assert_eq!(Tile::B.ctas_per_sm(Fmt::F16, H200_SMEM), 1);
        // Every kernel within the 227 KiB a CTA may have.
        for f in [Fmt::Q4K, Fmt::Q5K, Fmt::Q6K, Fmt::Q80, Fmt::F16, Fmt::Bf16] {
            assert!(Tile::A.smem(f) <= 232_448, "{f:?}");
        }
    }

    /// The plans for the Qwen3.5-9B products are the measured best (or within a few percent of
    /// it, noted) of prefill-gpu-run1.
    #[test]
    fn plans_follow_the_measurements() {
        let p = |f, rows, n, k| {
            let pl = plan(f, rows, n, k, H200_SMS, H200_SMEM);
            (pl.tile, pl.nz)
        };
        use Fmt::*;
        use Tile::*;
        // Q4_K: best B/4, B/1, B/1 for qkv; B/8, B/2, B/1 for 4096x4096; gate/up B/4, B/1, B/1;
        // down B/8, B/2, B/1.
        assert_eq!(p(Q4K, 102, 8192, 4096), (B, 4));
        assert_eq!(p(Q4K, 512, 8192, 4096), (B, 1));
        assert_eq!(p(Q4K, 4096, 8192, 4096), (B, 1));
        assert_eq!(p(Q4K, 102, 4096, 4096), (B, 8));
        assert_eq!(p(Q4K, 512, 4096, 4096), (B, 2));
        assert_eq!(p(Q4K, 102, 12288, 4096), (B, 4));
        assert_eq!(p(Q4K, 512, 12288, 4096), (B, 1));
        assert_eq!(p(Q4K, 102, 4096, 12288), (B, 8));
        assert_eq!(p(Q4K, 512, 4096, 12288), (B, 2));
        assert_eq!(p(Q4K, 4096, 4096, 12288), (B, 1));
        // k/v 1024 rows at T = 102: B/8 (21.2 us; best C/8 19.9 us).
        assert_eq!(p(Q4K, 102, 1024, 4096), (B, 8));
        // Q6_K: best A/4 (qkv T=102), A/8 (4096 rows T=102), A/2 (4096 rows T=512), A/1 (T=4096).
        assert_eq!(p(Q6K, 102, 8192, 4096), (A, 4));
        assert_eq!(p(Q6K, 102, 4096, 4096), (A, 8));
        assert_eq!(p(Q6K, 512, 4096, 4096), (A, 2));
        assert_eq!(p(Q6K, 4096, 12288, 4096), (A, 1));
        // Small batches: C; the split formats' larger batches A (B fits once per SM).
        assert_eq!(p(F16, 40, 64, 64).0, C);
        assert_eq!(p(F16, 512, 4096, 4096).0, A);
        assert_eq!(p(Bf16, 102, 4096, 4096).0, A);
    }

    /// Every plan covers K exactly once: splits of whole super-steps, none empty.
    #[test]
    fn splits_cover_k() {
        for f in [Fmt::Q4K, Fmt::Q5K, Fmt::Q6K, Fmt::Q80, Fmt::F16, Fmt::Bf16] {
            for k in [64usize, 256, 768, 1024, 4096, 12288, 5120] {
                if k % (64 * f.rs()) != 0 && matches!(f, Fmt::Q4K | Fmt::Q5K | Fmt::Q6K) {
                    continue; // K-quant rows are whole 256-blocks
                }
                for rows in [5usize, 64, 65, 102, 512, 4096] {
                    for n in [1usize, 32, 320, 4096, 248_320] {
                        let pl = plan(f, rows, n, k, H200_SMS, H200_SMEM);
                        let steps = k / 64;
                        assert!(pl.per.is_multiple_of(f.rs()) || pl.per >= steps, "{f:?} {pl:?}");
                        assert!(pl.per * pl.nz >= steps, "{f:?} k {k}: {pl:?}");
                        assert!(pl.per * (pl.nz - 1) < steps, "{f:?} k {k}: empty split {pl:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn params_layout() {
        assert_eq!(std::mem::size_of::<GemmParams>(), 112);
        assert_eq!(std::mem::size_of::<ReduceParams>(), 40);
        assert_eq!(std::mem::size_of::<SwigluParams>(), 48);
    }
}
