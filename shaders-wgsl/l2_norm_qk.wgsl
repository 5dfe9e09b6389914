// In place on the conv output u [T, conv_dim]: every q and k head (the first 2*hk groups of dk
// channels of a row) becomes x / sqrt(sum(x^2) + eps); q heads are further scaled by 1/sqrt(dk).
// v (the rest of the row) is untouched. One workgroup per (token, head); each invocation reads
// and rewrites only its own strided elements, so working in place needs no extra barrier.
struct Params {
    conv_dim: u32,
    hk: u32,
    dk: u32,
    eps: f32,
    q_scale: f32, // 1/sqrt(dk), rounded on the host exactly as the CPU backend does
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> u: array<f32>;

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let g = linear_wg(wg, nwg);
    let t = g / (2u * P.hk);
    let h = g % (2u * P.hk); // 0..hk: q heads, hk..2hk: k heads
    let base = t * P.conv_dim + h * P.dk;
    var ss = 0.0;
    for (var i = li; i < P.dk; i += ROW_WG) {
        let v = u[base + i];
        ss += v * v;
    }
    var s = 1.0 / sqrt(wg_sum(ss, li, ROW_WG, lanes) + P.eps);
    if (h < P.hk) {
        s *= P.q_scale;
    }
    for (var i = li; i < P.dk; i += ROW_WG) {
        u[base + i] = u[base + i] * s;
    }
}
