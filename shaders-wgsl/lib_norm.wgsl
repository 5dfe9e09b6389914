// The RMS norms (rms_norm, add_rms_norm, gated_rms_norm): one workgroup of ROW_WG invocations
// per group of d = w.len() consecutive values, out = v / sqrt(mean(v^2) + eps) * w (times the
// op's gate). The op's file declares the bindings and four hooks: `norm_load(i)` the value v at
// element i (the first pass; it only reads), `norm_keep(i, v)` what the op writes back of it (the
// residual add updates its accumulator in place; the others nothing), `norm_value(i)` v again
// (the second pass), and `norm_gate(i, y)`, the output out[i] for y = v * s * w[i] (y times the
// op's gate). The second pass, `norm_out`, is lib_norm_plain.wgsl's (the output only) or
// lib_norm_dot.wgsl's (the output and its packed-dot planes).
struct Params {
    d: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: Params;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let base = linear_wg(wg, nwg) * P.d;
    let last = P.d - 1u;
    // Four of an invocation's elements per round, all their loads issued before anything is used
    // or written back: one memory round trip per four elements (a 4096-wide decode row was 16
    // dependent round trips per pass, ~21 us on the H200). Indices past the end load the last
    // element (in bounds) and count as 0; the sum keeps the per-invocation order of one at a time.
    var ss = 0.0;
    for (var i0 = li; i0 < P.d; i0 += 4u * ROW_WG) {
        let i1 = i0 + ROW_WG;
        let i2 = i1 + ROW_WG;
        let i3 = i2 + ROW_WG;
        let v0 = norm_load(base + i0);
        let v1 = select(0.0, norm_load(base + min(i1, last)), i1 < P.d);
        let v2 = select(0.0, norm_load(base + min(i2, last)), i2 < P.d);
        let v3 = select(0.0, norm_load(base + min(i3, last)), i3 < P.d);
        ss += v0 * v0;
        ss += v1 * v1;
        ss += v2 * v2;
        ss += v3 * v3;
        norm_keep(base + i0, v0);
        if (i1 < P.d) {
            norm_keep(base + i1, v1);
        }
        if (i2 < P.d) {
            norm_keep(base + i2, v2);
        }
        if (i3 < P.d) {
            norm_keep(base + i3, v3);
        }
    }
    let s = 1.0 / sqrt(wg_sum(ss, li, ROW_WG, lanes) / f32(P.d) + P.eps);
    norm_out(base, li, s, lanes);
}
