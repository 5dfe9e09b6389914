// The residual add and the next RMSNorm in one pass: acc += x; out = rms_norm(acc; w), over
// groups of d = w.len(). One workgroup per group; each invocation updates and then reads back
// only its own strided elements of acc, so working in place needs no extra barrier.

@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let base = linear_wg(wg, nwg) * P.d;
    var ss = 0.0;
    for (var i = li; i < P.d; i += ROW_WG) {
        let v = acc[base + i] + x[base + i];
        acc[base + i] = v;
        ss += v * v;
    }
    let s = rms_inv(ss, P.d, P.eps, li, lanes);
    for (var i = li; i < P.d; i += ROW_WG) {
        out[base + i] = acc[base + i] * s * w[i];
    }
}
