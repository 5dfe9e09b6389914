// The RMS norms (rms_norm, add_rms_norm, gated_rms_norm): one workgroup of ROW_WG invocations
// per group of d = w.len() consecutive values, out = v / sqrt(mean(v^2) + eps) * w (times the
// op's gate). The op's file declares the bindings and three hooks: `norm_load(i)` the value v at
// element i (the first pass; it may update the element in place), `norm_value(i)` v again (the
// second pass), and `norm_store(i, y)` which writes y = v * s * w[i] (times its gate).
struct Params {
    d: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: Params;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let base = linear_wg(wg, nwg) * P.d;
    var ss = 0.0;
    for (var i = li; i < P.d; i += ROW_WG) {
        let v = norm_load(base + i);
        ss += v * v;
    }
    let s = 1.0 / sqrt(wg_sum(ss, li, ROW_WG, lanes) / f32(P.d) + P.eps);
    // Each invocation reads back only the elements it loaded: no barrier for in-place updates.
    for (var i = li; i < P.d; i += ROW_WG) {
        norm_store(base + i, norm_value(base + i) * s * w[i]);
    }
}
