//! What the adapter can do, and which kernel variants this backend therefore runs: the ONE place
//! where kernel variants are chosen (the fused decode dispatches are `policy`'s, from these caps).
//! Everything else asks `Caps`. `Caps::select` is a pure function of the adapter's features and
//! limits, the precision tier and the caller's `WgpuOptions`, so it is tested without a GPU.
//!
//! | path | needs | else |
//! |---|---|---|
//! | subgroup reductions (`reduce_sg.wgsl`) | `SUBGROUP` | workgroup-memory trees (`reduce_plain.wgsl`) |
//! | tensor-core prefill (`matmul_coop2.wgsl` in a `CoopTile` geometry; f16 inputs) | `EXPERIMENTAL_COOPERATIVE_MATRIX` with a 16x16x16 f16 -> f32 configuration, `SHADER_F16`, `SUBGROUP`, `Precision::Fast`, and workgroup memory for `CoopTile::DEFAULT` (48 KiB) or `CoopTile::SMALL` (22 KiB) | the f32 tiled kernel |
//! | per-dispatch GPU timestamps (`RILL_PROFILE=1`) | `TIMESTAMP_QUERY_INSIDE_PASSES` | a submit-and-wait wall clock per dispatch |
//! | prefill attention (more than `SPLIT_MAX_ROWS` query rows) over key tiles staged once for a block of 32 query rows of one KV head (`attention_tiled.wgsl`, `AttTile`) | its workgroup memory (`AttTile::DEFAULT` 25 KiB, `AttTile::SMALL` 16 KiB) | a workgroup per query row over the whole key range (`attention.wgsl`) |
//! | Q4_K and Q6_K decode products on packed integer dot products (`mv_q4_k_dot.wgsl`, x quantized per block into int8 planes) | `dot4I8Packed` native (`native_dot4`) | the f32 units |
//!
//! The packed-dot units: the RMS norms write their output's planes from registers
//! (`*_rms_norm_dot`, ~3 us more than the plain norm), so does the attention's gated output, an
//! input neither writes costs one more dispatch (`mv_dot_prep`, ~12 us in the H200 profile, a few
//! us of wall time), and the products get 20-30% faster (H200, 9B q4_k_m decode 159 -> 188 t/s,
//! 35B-A3B 155 -> 161). Where naga would write a polyfill (lavapipe, browsers) they are slower than
//! the f32 units, so they stay off unless `WgpuOptions::dot` forces them (the tests do).
//!
//! The tuning numbers are per-device constants below (the H200 sweeps' choices, which lavapipe
//! runs too), moved only through `WgpuOptions::tuning` (tests, `examples/mv_bench.rs --wgpu`):
//! the matrix-vector geometry (invocations per workgroup, rows per invocation, lanes per row
//! group; per shape, the rows of the tall products (at least `kernels::MV_TALL_ROWS` rows, the LM
//! head) and of the fused SwiGLU products, the lanes of long rows (at least
//! `kernels::MV_LONG_UNITS` units, the FFN down products), and the workgroups a small product
//! spreads its lanes to reach, `kernels::mv_lanes_spread`), the dispatches per submission, and the
//! tensor-core prefill tile. Values the kernels do not take keep the default.
//!
//! `WgpuOptions::plain` forces every plain path (what the browser runs: wgpu's web backend has no
//! subgroups) and `max_storage` lowers the storage buffers per kernel (at least 8, WebGPU's
//! guarantee, as browsers allow), so tests cover both on one machine; `coop_emulate` runs the
//! tensor-core kernel's tiling and f16 staging with the matrix products done by plain code, so a
//! machine without cooperative matrices (lavapipe) still checks everything but the cooperative
//! built-ins themselves.
//!
//! Shaders are compiled without the checks naga would add (index clamps on every array and
//! buffer access, a counter in every loop): they are this crate's own code, every loop is
//! bounded by its parameters and every index is in range by construction, and Vulkan's robust
//! buffer access still guards the buffers. `shader_checks` (`WgpuOptions`, `checks` in the tests' `RILL_TEST_WGPU`) puts the
//! checks back (to tell a kernel bug from a driver one, and so tests run both ways).

use super::geometry::{AttTile, CoopTile, ATT_T_WG};
use super::options::WgpuOptions;
use super::policy;
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

/// The adapter's features and limits that select kernels, fixed when the device is created.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    /// Subgroup operations in compute shaders.
    pub subgroups: bool,
    /// The adapter's subgroup size where it has one fixed size (lavapipe 8 with AVX2, NVIDIA 32),
    /// else 0: kernels that give each subgroup a row size their blocks by it.
    pub subgroup_size: u32,
    pub coop: Coop,
    /// With `coop` on (or emulated): the geometry of `matmul_coop2.wgsl`; None with it off.
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
    /// Storage buffers one kernel may bind (`max_storage_buffers_per_shader_stage`): what
    /// `policy` weighs the fused dispatches against.
    pub max_storage: u32,
    /// The fused decode dispatches are allowed (`WgpuOptions::fusion`); `policy` decides each.
    pub fusion: bool,
    /// The prefill attention's geometry where it runs tiled (`attention_tiled.wgsl`): the
    /// first of `AttTile::DEFAULT` and `AttTile::SMALL` whose workgroup memory the device has;
    /// None: a workgroup per query row (`attention.wgsl`).
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
    /// Q4_K and Q6_K decode products on packed integer dot products (`mv_q4_k_dot.wgsl`, x
    /// quantized first by `mv_dot_prep.wgsl`; strict tier): by default where `dot4I8Packed` is
    /// native, else as `WgpuOptions::dot` forces.
    pub mv_dot: bool,
    /// The adapter runs `dot4I8Packed` as one instruction (`native_dot4`; shown by `describe`).
    pub dot4_native: bool,
}

/// The per-device tuning numbers (one set: the H200's sweeps chose them, and lavapipe and
/// browsers run them too), and the most dispatches one submission may hold (its parameter
/// slots). H200, examples/mv_bench: the Q6_K head 357 -> 323 us with 4 rows, the Q4_K SwiGLU 27.2
/// -> 26.0, the Q4_K down 20.6 -> 17.6 with 64 lanes, where the other shapes lose with either;
/// formats decoded element by element take at most `kernels::MV_GENERIC_MAX_ROWS` rows.
pub(crate) const MV_WG_DEFAULT: u32 = 128;
pub(crate) const MV_ROWS_DEFAULT: u32 = 2;
pub(crate) const MV_LANES_DEFAULT: u32 = 32;
pub(crate) const MV_ROWS_TALL_DEFAULT: u32 = 4;
pub(crate) const MV_ROWS_SWIGLU_DEFAULT: u32 = 4;
pub(crate) const MV_LANES_LONG_DEFAULT: u32 = 64;
/// H200 (132 SMs), tg128 with the host one step ahead and 256 dispatches per submission: 35B-A3B
/// 222.6 -> 226.3 t/s (its 256-row F32 router: 65 -> 129 workgroups), 9B 233.2 -> 233.6.
pub(crate) const MV_MIN_WG_DEFAULT: u32 = 132;
/// `Tuning::mv_min_wg` at most (more only widens every small product to the workgroup).
pub(crate) const MV_MIN_WG_MAX: u32 = 4096;
pub(crate) const SUBMIT_EVERY_DEFAULT: u32 = 64;
pub(crate) const SUBMIT_EVERY_MAX: u32 = 256;
/// A decode step's first submission is short so that the GPU, idle while the host read the last
/// token, starts before the step is encoded.
pub(crate) const SUBMIT_FIRST_DEFAULT: u32 = 16;
/// H200, tg128 with the host one step ahead (interleaved medians): 64 -> 256 dispatches per
/// submission, 35B-A3B 215.1 -> 222.6 t/s, 9B 228.1 -> 233.2 (one step at a time, 256 loses:
/// the device waits for the first submission).
pub(crate) const SUBMIT_AHEAD_DEFAULT: u32 = 256;

/// Storage buffers per kernel WebGPU guarantees (and the most an existing unfused kernel binds).
pub(crate) const MIN_STORAGE: u32 = 8;

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
pub(crate) fn wanted_features(adapter: &wgpu::Adapter, precision: Precision, opts: &WgpuOptions) -> wgpu::Features {
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
    if precision == Precision::Fast && !opts.plain && !opts.coop_emulate && has_coop16(adapter) {
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
        opts: &WgpuOptions,
    ) -> Caps {
        let t = &opts.tuning;
        let fast = precision == Precision::Fast;
        let f16 = features.contains(wgpu::Features::SHADER_F16);
        let coop = if !fast || opts.plain {
            Coop::Off
        } else if opts.coop_emulate && f16 {
            Coop::Emulated
        } else if coop16 && features.contains(coop_features() | wgpu::Features::SUBGROUP) {
            Coop::On
        } else {
            Coop::Off
        };
        // The geometry asked for, else the default, else the smaller one where the device's
        // workgroup memory is short; none fits: no tensor-core prefill.
        let coop2 = (coop != Coop::Off)
            .then(|| {
                [t.coop_tile, Some(CoopTile::DEFAULT), Some(CoopTile::SMALL)]
                    .into_iter()
                    .flatten()
                    .find(|t| t.fits(limits))
            })
            .flatten();
        let coop = if coop2.is_some() { coop } else { Coop::Off };
        // A power of two the plain reduction takes (<= 256) and the device allows; anything
        // else keeps the default.
        let mv_wg = t
            .mv_wg
            .filter(|n| [64, 128, 256].contains(n) && *n <= limits.max_compute_invocations_per_workgroup)
            .unwrap_or(MV_WG_DEFAULT);
        // Rows per invocation the kernels take; lanes a power of two up to the workgroup (one
        // lane: a row per invocation).
        let rows = |n: Option<u32>| n.filter(|n| [1, 2, 4, 8].contains(n));
        let lanes = |n: Option<u32>| n.filter(|n| n.is_power_of_two() && *n <= mv_wg);
        let max_storage = match opts.max_storage {
            Some(n) => n.max(MIN_STORAGE).min(limits.max_storage_buffers_per_shader_stage),
            None => limits.max_storage_buffers_per_shader_stage,
        };
        let att_tiled = [AttTile::DEFAULT, AttTile::SMALL].into_iter().find(|t| {
            t.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
                && ATT_T_WG <= limits.max_compute_invocations_per_workgroup
        });
        let max_binding = match opts.max_binding {
            Some(b) => b.min(limits.max_storage_buffer_binding_size),
            None => limits.max_storage_buffer_binding_size,
        };
        let submits = |n: Option<u32>, default| n.map_or(default, |n| n.clamp(1, SUBMIT_EVERY_MAX));
        Caps {
            subgroups: !opts.plain && features.contains(wgpu::Features::SUBGROUP),
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
            fusion: opts.fusion,
            att_tiled,
            mv_wg,
            mv_rows: rows(t.mv_rows).unwrap_or(MV_ROWS_DEFAULT),
            mv_lanes: lanes(t.mv_lanes).unwrap_or(MV_LANES_DEFAULT.min(mv_wg)),
            // Per shape: its own number, else the general one where that is set, else the default.
            mv_rows_tall: rows(t.mv_rows_tall).or(rows(t.mv_rows)).unwrap_or(MV_ROWS_TALL_DEFAULT),
            mv_rows_swiglu: rows(t.mv_rows_swiglu)
                .or(rows(t.mv_rows))
                .unwrap_or(MV_ROWS_SWIGLU_DEFAULT),
            mv_lanes_long: lanes(t.mv_lanes_long)
                .or(lanes(t.mv_lanes))
                .unwrap_or(MV_LANES_LONG_DEFAULT.min(mv_wg)),
            mv_min_wg: t.mv_min_wg.map_or(MV_MIN_WG_DEFAULT, |n| n.min(MV_MIN_WG_MAX)),
            submit_every: submits(t.submit_every, SUBMIT_EVERY_DEFAULT),
            submit_first: submits(t.submit_first, SUBMIT_FIRST_DEFAULT),
            submit_ahead: submits(t.submit_ahead, SUBMIT_AHEAD_DEFAULT),
            shader_checks: opts.shader_checks,
            mv_dot: opts.dot.unwrap_or(dot4),
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

    /// The device's side of the fused-dispatch decisions (`policy`).
    pub fn device(&self) -> policy::Device {
        policy::Device {
            max_storage: self.max_storage,
            fusion: self.fusion,
            dot: self.mv_dot,
        }
    }

    /// The precision tier the selected kernels meet.
    pub fn precision(&self) -> Precision {
        match self.coop {
            Coop::Off => Precision::Exact,
            Coop::On | Coop::Emulated => Precision::Fast,
        }
    }

    /// The tuning numbers, for `describe`.
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

    /// Their per-device defaults (`knobs` order).
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
                    " (coop2 {}x{}x{}/{}x{}, {} buffer{})",
                    t.rows,
                    t.toks,
                    t.k,
                    t.sg_rows,
                    t.sg_toks,
                    t.bufs,
                    if t.bufs == 1 { "" } else { "s" }
                ),
                None => String::new(),
            },
            match self.att_tiled {
                Some(AttTile::DEFAULT) => "",
                Some(_) => ", attention in small tiles",
                None => ", attention per query row",
            },
            self.max_binding >> 20,
            policy::describe(self.device()),
            // The tuning only when moved off its defaults.
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
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::wgpu::options::Tuning;

    /// The H200's workgroup memory (the WebGPU default of 16 KiB is too small for the coop tile).
    pub(crate) fn limits() -> wgpu::Limits {
        wgpu::Limits {
            max_compute_workgroup_storage_size: 48 << 10,
            ..wgpu::Limits::default()
        }
    }

    pub(crate) fn caps(features: wgpu::Features, precision: Precision, coop16: bool, opts: WgpuOptions) -> Caps {
        Caps::select(features, &limits(), precision, coop16, false, &opts)
    }

    fn tuned(tuning: Tuning) -> WgpuOptions {
        WgpuOptions {
            tuning,
            ..Default::default()
        }
    }

    #[test]
    fn dot_units_only_where_asked_for() {
        let dot = |native, dot| {
            let o = WgpuOptions {
                dot,
                ..Default::default()
            };
            Caps::select(wgpu::Features::SUBGROUP, &limits(), Precision::Exact, false, native, &o).mv_dot
        };
        assert!(dot(true, None), "on by default where dot4I8Packed is native");
        assert!(!dot(false, None), "off where naga would emulate it");
        assert!(dot(true, Some(true)));
        assert!(dot(false, Some(true)), "forced (the lavapipe tests)");
        assert!(!dot(true, Some(false)));
        // The strict tier either way.
        let c = caps(
            wgpu::Features::SUBGROUP,
            Precision::Exact,
            false,
            WgpuOptions::default(),
        );
        assert_eq!(c.precision(), Precision::Exact);
    }

    #[test]
    fn plain_option_turns_every_fast_path_off() {
        let all = wgpu::Features::SUBGROUP | coop_features();
        let fast = caps(all, Precision::Fast, true, WgpuOptions::default());
        assert!(fast.subgroups);
        assert_eq!(fast.coop, Coop::On);
        assert_eq!(fast.precision(), Precision::Fast);
        let plain = caps(
            all,
            Precision::Fast,
            true,
            WgpuOptions {
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
        let none = WgpuOptions::default();
        assert_eq!(caps(all, Precision::Exact, true, none).coop, Coop::Off);
        assert_eq!(
            caps(wgpu::Features::SUBGROUP, Precision::Fast, true, none).coop,
            Coop::Off
        );
        assert_eq!(caps(all, Precision::Fast, false, none).coop, Coop::Off);
        let emu = WgpuOptions {
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
            &WgpuOptions::default(),
        );
        assert_eq!((small.coop, small.coop2), (Coop::Off, None));
    }

    #[test]
    fn coop_kernel_takes_only_geometries_it_and_the_device_hold() {
        let all = wgpu::Features::SUBGROUP | coop_features();
        let pick = |tile: &str, bufs: Option<u32>, precision| {
            let coop_tile = CoopTile::parse(tile).map(|t| CoopTile {
                bufs: bufs.unwrap_or(t.bufs),
                ..t
            });
            caps(
                all,
                precision,
                true,
                tuned(Tuning {
                    coop_tile,
                    ..Default::default()
                }),
            )
            .coop2
        };
        let d = CoopTile::DEFAULT;
        let fast = Precision::Fast;
        assert_eq!(pick("", None, fast), Some(d));
        assert_eq!(pick("", None, Precision::Exact), None);
        assert_eq!((d.invocations(), d.w_units(), d.x_units()), (256, 2, 2));
        assert_eq!(
            (
                CoopTile::SMALL.invocations(),
                CoopTile::SMALL.w_units(),
                CoopTile::SMALL.x_units()
            ),
            (64, 4, 4)
        );
        let t = pick("64x128x32/32x64", Some(1), fast).unwrap();
        assert_eq!(
            (t.rows, t.toks, t.k, t.sg_rows, t.sg_toks, t.bufs),
            (64, 128, 32, 32, 64, 1)
        );
        assert_eq!(t.subgroups(), 4);
        // 128 x 128 x 32 double-buffered just fits 48 KiB; with k 64 only single-buffered.
        assert_eq!(pick("128x128x32", Some(2), fast).map(|t| t.rows), Some(128));
        assert_eq!(pick("128x128x64", Some(2), fast), Some(d), "too big: the default");
        assert_eq!(pick("128x128x64", Some(1), fast).map(|t| t.k), Some(64));
        for bad in ["128x64x48", "96x64x32", "128x64x32/16x16", "256x128x32", "64x32x32"] {
            assert_eq!(pick(bad, None, fast), Some(d), "{bad}");
        }
        assert_eq!(pick("128x64x32", Some(3), fast), Some(d), "three buffers");
        // Less workgroup memory than the default needs (lavapipe's 32 KiB, or 28): the small
        // geometry; less than it needs: no tensor-core prefill.
        for kib in [28, 32] {
            let small = wgpu::Limits {
                max_compute_workgroup_storage_size: kib << 10,
                ..wgpu::Limits::default()
            };
            let c = Caps::select(all, &small, fast, true, false, &WgpuOptions::default());
            assert_eq!((c.coop, c.coop2), (Coop::On, Some(CoopTile::SMALL)), "{kib} KiB");
        }
        let short = wgpu::Limits {
            max_compute_workgroup_storage_size: CoopTile::SMALL.workgroup_bytes() - 4,
            ..wgpu::Limits::default()
        };
        let c = Caps::select(all, &short, fast, true, false, &WgpuOptions::default());
        assert_eq!((c.coop, c.coop2, c.precision()), (Coop::Off, None, Precision::Exact));
    }

    /// The tiled prefill attention where the device holds its workgroup memory: the default
    /// geometry with 32 KiB (and the H200's 48), the small one with WebGPU's default 16 KiB, the
    /// per-row kernel with less.
    #[test]
    fn tiled_attention_where_its_tiles_fit() {
        assert_eq!(
            (AttTile::DEFAULT.workgroup_bytes(), AttTile::SMALL.workgroup_bytes()),
            (25_472, 16_256)
        );
        let pick = |bytes: u32| {
            let lim = wgpu::Limits {
                max_compute_workgroup_storage_size: bytes,
                ..wgpu::Limits::default()
            };
            Caps::select(
                wgpu::Features::empty(),
                &lim,
                Precision::Exact,
                false,
                false,
                &WgpuOptions::default(),
            )
            .att_tiled
        };
        assert_eq!(pick(48 << 10), Some(AttTile::DEFAULT));
        assert_eq!(pick(32 << 10), Some(AttTile::DEFAULT));
        assert_eq!(wgpu::Limits::default().max_compute_workgroup_storage_size, 16 << 10);
        assert_eq!(pick(16 << 10), Some(AttTile::SMALL));
        assert_eq!(pick(12 << 10), None);
    }

    #[test]
    fn binding_limit_can_only_be_lowered() {
        let lim = wgpu::Limits::default();
        let pick = |b| {
            let o = WgpuOptions {
                max_binding: Some(b),
                ..Default::default()
            };
            Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, &o).max_binding
        };
        assert_eq!(pick(4096), 4096);
        assert_eq!(pick(u64::MAX), lim.max_storage_buffer_binding_size);
    }

    #[test]
    fn storage_buffer_limit_can_only_be_lowered_and_never_below_webgpus() {
        let pick = |adapter: u32, max_storage| {
            let lim = wgpu::Limits {
                max_storage_buffers_per_shader_stage: adapter,
                ..wgpu::Limits::default()
            };
            let o = WgpuOptions {
                max_storage,
                ..Default::default()
            };
            Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, &o).max_storage
        };
        assert_eq!(pick(1 << 20, None), 1 << 20);
        assert_eq!(pick(1 << 20, Some(8)), 8);
        assert_eq!(pick(1 << 20, Some(4)), 8, "never below WebGPU's guarantee");
        assert_eq!(pick(10, Some(64)), 10, "never above the adapter's");
    }

    #[test]
    fn tuning_takes_only_what_the_kernels_allow() {
        let lim = wgpu::Limits::default();
        let pick = |t: Tuning| Caps::select(wgpu::Features::empty(), &lim, Precision::Exact, false, false, &tuned(t));
        let knobs = |mv_wg, mv_rows, mv_lanes, submit_every| {
            let c = pick(Tuning {
                mv_wg: Some(mv_wg),
                mv_rows: Some(mv_rows),
                mv_lanes: Some(mv_lanes),
                submit_every: Some(submit_every),
                ..Default::default()
            });
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
        let d = pick(Tuning::default());
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
        assert_eq!(
            (
                d.mv_rows_tall,
                d.mv_rows_swiglu,
                d.mv_lanes_long,
                d.mv_min_wg,
                d.submit_ahead
            ),
            (
                MV_ROWS_TALL_DEFAULT,
                MV_ROWS_SWIGLU_DEFAULT,
                MV_LANES_LONG_DEFAULT,
                MV_MIN_WG_DEFAULT,
                SUBMIT_AHEAD_DEFAULT
            )
        );
        let first = |n| {
            pick(Tuning {
                submit_first: Some(n),
                ..Default::default()
            })
            .submit_first
        };
        assert_eq!((first(8), first(0), first(9999)), (8, 1, SUBMIT_EVERY_MAX));
        // The per-shape numbers follow the general ones where only those are set.
        let c = pick(Tuning {
            mv_rows: Some(8),
            mv_lanes: Some(1),
            ..Default::default()
        });
        assert_eq!((c.mv_rows_tall, c.mv_rows_swiglu, c.mv_lanes_long), (8, 8, 1));
    }
}
