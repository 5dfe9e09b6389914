//! The fixed geometry of the kernels that both sides must agree on: what `caps` and `policy` weigh
//! against the adapter's limits (workgroup memory of a tile, storage buffers of a fused kernel)
//! and what `kernels` writes into the generated WGSL. It depends on neither of them, so that
//! `caps` (which variants fit) needs nothing from `kernels` (how a variant's source is built).

/// Attention: the largest head dim.
pub(crate) const ATT_MAX_D: u32 = 256;
/// Query rows (tokens x heads) up to which attention splits each row's key range over
/// `kernels::ATT_SPLITS` workgroups (flash-decoding); longer batches have a workgroup per row
/// already.
pub(crate) const SPLIT_MAX_ROWS: usize = 256;
/// MoE: most experts per token.
pub(crate) const MOE_MAX_K: u32 = 16;
/// The tiled prefill attention (`attention_tiled.wgsl`): invocations (8 x 16), query rows and keys
/// per tile (each invocation scores 4 rows x 4 keys and accumulates 4 rows x 4 vec4s of dims, so
/// 4 * 16 vec4s cover ATT_MAX_D). Its chunk of staged dims and V rows are `AttTile`.
pub(crate) const ATT_T_WG: u32 = 128;
pub(crate) const ATT_T_BQ: u32 = 32;
pub(crate) const ATT_T_BK: u32 = 64;
const _: () = assert!(ATT_T_WG == 8 * 16 && ATT_T_BQ == 4 * 8 && ATT_T_BK == 4 * 16 && ATT_MAX_D == 4 * 4 * 16);
// The softmax pass gives each row four invocations.
const _: () = assert!(ATT_T_WG == 4 * ATT_T_BQ);

/// Storage buffers of the fused decode kernels (`policy` picks them only where the adapter allows
/// as many; `fused_kernels_bind_what_caps_assumes` checks these against the shaders):
/// `gdn_conv_gates`, `attn_qk_prep` and each of its halves.
pub(crate) const GATES_BINDINGS: u32 = 10;
pub(crate) const PREP_BINDINGS: u32 = 11;
pub(crate) const PREP_HALF_BINDINGS: u32 = 7;

/// Storage buffers of a `matvec_group` of `n` products: x, and a weight and an output each.
pub(crate) const fn mv_group_bindings(n: u32) -> u32 {
    1 + 2 * n
}

/// Storage buffers of `attention_combine_gate` with the planes (`policy::attn_gate`).
pub(crate) const ATT_GATE_BINDINGS: u32 = 4;
/// Storage buffers of each kernel of the MoE experts with the shared expert among them
/// (`moe_swiglu_sh`: four weights, ids, x, hidden rows; `moe_down_sh`: two weights, ids, weights,
/// gate logits, hidden rows, out).
pub(crate) const MOE_SH_BINDINGS: u32 = 7;

/// The geometry of `matmul_coop2.wgsl` (WGSL `C2_*`, generated in kernels.rs): each workgroup
/// computes `rows` x `toks` outputs in k steps of `k`, as subgroups of 32 invocations that each
/// own a `sg_rows` x `sg_toks` piece, eight 16 x 16 accumulators (64 x 32 or 32 x 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopTile {
    pub rows: u32,
    pub toks: u32,
    pub k: u32,
    pub sg_rows: u32,
    pub sg_toks: u32,
    /// Staging buffers: 2 overlaps one k step's products with the next step's staging (one
    /// barrier per step), 1 stages in place (two barriers per step).
    pub bufs: u32,
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
    };

    /// For devices with less workgroup memory than the default needs (22 KiB; lavapipe has 32).
    pub const SMALL: CoopTile = CoopTile {
        rows: 64,
        toks: 64,
        ..CoopTile::DEFAULT
    };

    /// `RxTxK` or `RxTxK/SRxST` (`WgpuOptions`' `coop_tile`; the piece defaults to 64 x 32 rows x
    /// tokens). Not checked against what the kernel takes (`valid`).
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
    pub(crate) fn fits(&self, limits: &wgpu::Limits) -> bool {
        self.valid()
            && self.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
            && self.invocations() <= limits.max_compute_invocations_per_workgroup
    }
}

/// The geometry of `attention_tiled.wgsl` besides its fixed 32 query rows x 64 keys per tile
/// (`ATT_T_*`): the head dims of q and k staged per step of the scores (`dc`, WGSL
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
        ((ATT_T_BQ + ATT_T_BK) * (self.dc / 4 + 1)).max(self.v_rows * ATT_MAX_D / 4)
    }

    /// Workgroup memory: the staging buffer, the tile's probabilities (rows padded by one), the
    /// softmax's partial maxima and sums, each row's rescale factor and query offset.
    pub fn workgroup_bytes(&self) -> u32 {
        16 * self.stage_vec4s() + 4 * (ATT_T_BQ * (ATT_T_BK + 1) + ATT_T_WG + 2 * ATT_T_BQ)
    }
}

/// Row stride (f32) of a subgroup's scratch in `matmul_coop2.wgsl`: 64 bytes, whole 16 bytes
/// (no padding: the scratch carries only the zeros and the edge tiles, and the default geometry
/// then needs exactly 48 KiB).
pub(crate) const COOP_SCRATCH_STRIDE: u32 = 16;
