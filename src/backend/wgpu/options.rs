//! What a caller may ask of the wgpu backend beyond the precision tier (`BackendOptions::wgpu`):
//! the adapter's capabilities limited (a browser's kernels on a desktop GPU), a variant forced,
//! the tuning numbers moved off their per-device values. The library reads none of these from
//! the environment: the tests build them from `RILL_TEST_WGPU` (tests/common, through `FromStr`),
//! the measurement example from its `--wgpu` flag (examples/mv_bench.rs). The user's switches
//! are read in one place, `UserSwitches::from_env`.

use std::str::FromStr;

use super::geometry::CoopTile;
use crate::error::{Error, Result};

/// Limits and overrides of the adapter's capabilities (`caps::Caps::select` applies them).
/// The default is the adapter's own choice everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgpuOptions {
    /// The fused decode dispatches (`policy`); off: one dispatch per op, for debugging.
    pub fusion: bool,
    /// No subgroups and no cooperative matrices: the kernels a browser runs (wgpu's web backend
    /// has no subgroups).
    pub plain: bool,
    /// At most this many storage buffers per kernel (never below WebGPU's 8, never above the
    /// adapter's): the fallbacks of the fused dispatches a browser takes.
    pub max_storage: Option<u32>,
    /// A storage binding of at most this many bytes: weights bound in pieces, as on lavapipe and
    /// browsers (128 MiB), with small tensors.
    pub max_binding: Option<u64>,
    /// The packed-integer-dot Q4_K/Q6_K decode products on or off; None: where the adapter runs
    /// `dot4I8Packed` natively.
    pub dot: Option<bool>,
    /// The tensor-core prefill kernel's tiling and f16 staging with plain products instead of
    /// cooperative matrices (`Precision::Fast` only): a machine without them checks the rest.
    pub coop_emulate: bool,
    /// Shaders compiled with naga's runtime checks (bounds clamps, loop counters).
    pub shader_checks: bool,
    /// The tuning numbers (None: the per-device constants of `caps`).
    pub tuning: Tuning,
}

impl Default for WgpuOptions {
    fn default() -> WgpuOptions {
        WgpuOptions {
            fusion: true,
            plain: false,
            max_storage: None,
            max_binding: None,
            dot: None,
            coop_emulate: false,
            shader_checks: false,
            tuning: Tuning::default(),
        }
    }
}

/// The kernels' tuning numbers moved off their defaults (`caps`: the values the H200 sweeps
/// chose; a value a kernel does not take keeps the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Invocations per matrix-vector workgroup: 64, 128 or 256.
    pub mv_wg: Option<u32>,
    /// Rows per matrix-vector invocation: 1, 2, 4 or 8 (also of the tall and SwiGLU products
    /// unless those are set).
    pub mv_rows: Option<u32>,
    /// Invocations per row group: a power of two up to the workgroup (also of long rows unless
    /// `mv_lanes_long` is set).
    pub mv_lanes: Option<u32>,
    pub mv_rows_tall: Option<u32>,
    pub mv_rows_swiglu: Option<u32>,
    pub mv_lanes_long: Option<u32>,
    /// Workgroups a product spreads its row groups' lanes to reach (0: no spreading).
    pub mv_min_wg: Option<u32>,
    /// Dispatches per submission; in a step's first submission; per submission of a step
    /// recorded while the device runs the one before (each 1..=256).
    pub submit_every: Option<u32>,
    pub submit_first: Option<u32>,
    pub submit_ahead: Option<u32>,
    /// The geometry of the tensor-core prefill kernel (`RxTxK[/SRxST]`, `bufs` staging buffers).
    pub coop_tile: Option<CoopTile>,
}

impl FromStr for WgpuOptions {
    type Err = Error;

    /// A comma list of `plain`, `checks`, `nofusion`, `coop_emulate`, `dot`, `nodot`, and
    /// `key=value` for `max_storage`, `max_binding`, every `Tuning` field by name and
    /// `coop_tile=RxTxK[/SRxST][:bufs]`; e.g. `plain,checks,max_storage=8,mv_rows=8`.
    fn from_str(s: &str) -> Result<WgpuOptions> {
        let mut o = WgpuOptions::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || Error::InvalidArgument(format!("wgpu option '{item}'"));
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (item, None),
            };
            let num = || -> Result<u32> { value.and_then(|v| v.parse().ok()).ok_or_else(bad) };
            let t = &mut o.tuning;
            match (key, value) {
                ("plain", None) => o.plain = true,
                ("checks", None) => o.shader_checks = true,
                ("nofusion", None) => o.fusion = false,
                ("coop_emulate", None) => o.coop_emulate = true,
                ("dot", None) => o.dot = Some(true),
                ("nodot", None) => o.dot = Some(false),
                ("max_storage", _) => o.max_storage = Some(num()?),
                ("max_binding", _) => o.max_binding = Some(value.and_then(|v| v.parse().ok()).ok_or_else(bad)?),
                ("mv_wg", _) => t.mv_wg = Some(num()?),
                ("mv_rows", _) => t.mv_rows = Some(num()?),
                ("mv_lanes", _) => t.mv_lanes = Some(num()?),
                ("mv_rows_tall", _) => t.mv_rows_tall = Some(num()?),
                ("mv_rows_swiglu", _) => t.mv_rows_swiglu = Some(num()?),
                ("mv_lanes_long", _) => t.mv_lanes_long = Some(num()?),
                ("mv_min_wg", _) => t.mv_min_wg = Some(num()?),
                ("submit_every", _) => t.submit_every = Some(num()?),
                ("submit_first", _) => t.submit_first = Some(num()?),
                ("submit_ahead", _) => t.submit_ahead = Some(num()?),
                ("coop_tile", Some(v)) => {
                    let (tile, bufs) = match v.split_once(':') {
                        Some((tile, b)) => (tile, Some(b.parse().map_err(|_| bad())?)),
                        None => (v, None),
                    };
                    let tile = CoopTile::parse(tile).ok_or_else(bad)?;
                    t.coop_tile = Some(CoopTile {
                        bufs: bufs.unwrap_or(tile.bufs),
                        ..tile
                    });
                }
                _ => return Err(bad()),
            }
        }
        Ok(o)
    }
}

/// The switches a user sets in the environment, read once when a device opens.
#[derive(Debug, Clone, Default)]
pub(crate) struct UserSwitches {
    /// `RILL_WGPU_ADAPTER=substring`: the adapter whose name contains it (lowercased).
    pub adapter: Option<String>,
    /// `RILL_WGPU_FUSION=0`: no fused decode dispatches (to tell a fused kernel's bug apart).
    pub no_fusion: bool,
}

impl UserSwitches {
    pub fn from_env() -> UserSwitches {
        let is = |name: &str, v: &str| std::env::var_os(name).is_some_and(|x| x == v);
        UserSwitches {
            adapter: std::env::var("RILL_WGPU_ADAPTER").ok().map(|s| s.to_lowercase()),
            no_fusion: is("RILL_WGPU_FUSION", "0"),
        }
    }

    /// `opts` with these switches on top (a switch only ever turns fusion off).
    pub fn apply(&self, opts: WgpuOptions) -> WgpuOptions {
        WgpuOptions {
            fusion: opts.fusion && !self.no_fusion,
            ..opts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_test_jobs_write() {
        let o: WgpuOptions = "plain, checks,max_storage=8,dot,mv_wg=256,mv_rows=8,mv_lanes=256,mv_min_wg=0"
            .parse()
            .unwrap();
        assert!(o.plain && o.shader_checks && o.fusion && !o.coop_emulate);
        assert_eq!((o.max_storage, o.dot), (Some(8), Some(true)));
        let t = o.tuning;
        assert_eq!(
            (t.mv_wg, t.mv_rows, t.mv_lanes, t.mv_min_wg),
            (Some(256), Some(8), Some(256), Some(0))
        );
        assert_eq!("".parse::<WgpuOptions>().unwrap(), WgpuOptions::default());
        let o: WgpuOptions = "nofusion,nodot,coop_emulate,max_binding=524288".parse().unwrap();
        assert!(!o.fusion && o.coop_emulate);
        assert_eq!((o.dot, o.max_binding), (Some(false), Some(524_288)));
        let c = "coop_tile=64x128x32/32x64:1"
            .parse::<WgpuOptions>()
            .unwrap()
            .tuning
            .coop_tile
            .unwrap();
        assert_eq!(
            (c.rows, c.toks, c.k, c.sg_rows, c.sg_toks, c.bufs),
            (64, 128, 32, 32, 64, 1)
        );
        for bad in [
            "fast",
            "mv_rows",
            "mv_rows=x",
            "plain=1",
            "coop_tile=axb",
            "coop_tile=64x64x32:z",
        ] {
            assert!(bad.parse::<WgpuOptions>().is_err(), "{bad}");
        }
    }

    #[test]
    fn user_switches_only_turn_fusion_off() {
        let on = UserSwitches {
            no_fusion: true,
            ..Default::default()
        };
        let o = on.apply(WgpuOptions::default());
        assert!(!o.fusion && !o.shader_checks);
        let off = WgpuOptions {
            fusion: false,
            shader_checks: true,
            ..Default::default()
        };
        assert_eq!(UserSwitches::default().apply(off), off);
    }
}
