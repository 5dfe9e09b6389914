// The common part of the RMS norms (rms_norm, add_rms_norm, gated_rms_norm): one workgroup of
// ROW_WG invocations per group of d values; given each invocation's partial sum of squares,
// 1 / sqrt(mean(x^2) + eps) for the whole group.
struct Params {
    d: u32, // group size = w.len()
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: Params;

fn rms_inv(ss: f32, d: u32, eps: f32, li: u32, lanes: Lanes) -> f32 {
    return 1.0 / sqrt(wg_sum(ss, li, ROW_WG, lanes) / f32(d) + eps);
}
