//! Causal depthwise conv1d + SiLU with a rolling state (spec/MODEL.md §5.3).

use crate::backend::wgpu::{gpu_err, WgpuBackend};
use crate::backend::{check, Tensor};
use crate::error::Result;

pub(crate) const SHADERS: &[(&str, &str)] = &[(
    "conv1d_causal_silu",
    include_str!("../../../../shaders-wgsl/conv1d_causal_silu.wgsl"),
)];

/// Largest kernel width: the shader keeps the K-1 previous inputs in a private array of this size.
const MAX_K: usize = 16;
/// Channels per workgroup (one invocation per channel).
const WG: u32 = 64;

/// x `[T, C]`, w `[C, K]` (tap K-1 = newest token), state `[K-1, C]` oldest first (updated),
/// out `[T, C]`. One invocation per channel loops over the tokens with a rolling window.
pub(crate) fn conv1d_causal_silu(be: &WgpuBackend, x: &Tensor, w: &Tensor, state: &Tensor, out: &Tensor) -> Result<()> {
    let op = "conv1d_causal_silu";
    let check::ConvDims { t: t_len, c, k } = check::conv1d(x, w, state, out)?;
    if k > MAX_K {
        return Err(gpu_err(format!("{op}: kernel width {k} exceeds {MAX_K}")));
    }
    check::u32_index(op, "elements", x.numel().max(w.numel()))?;
    if c == 0 {
        return Ok(());
    }
    let [gx, gy] = be.grid((c as u32).div_ceil(WG));
    be.dispatch(
        op,
        "",
        &[t_len as u32, c as u32, k as u32],
        &[x, w, state, out],
        [gx, gy, 1],
    )
}
