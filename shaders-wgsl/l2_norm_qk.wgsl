// In place on the conv output u [T, conv_dim]: every q and k head (the first 2*hk groups of dk
// channels of a row) becomes x / sqrt(sum(x^2) + eps); q heads are further scaled by 1/sqrt(dk).
// v (the rest of the row) is untouched. One workgroup per (token, head); each invocation reads
// and rewrites only its own strided elements, so working in place needs no extra barrier.
const WG: u32 = 128u;

struct Params {
    conv_dim: u32,
    hk: u32,
    dk: u32,
    eps: f32,
    q_scale: f32, // 1/sqrt(dk), rounded on the host exactly as the CPU backend does
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> u: array<f32>;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = linear_wg(wg, nwg);
    let t = g / (2u * P.hk);
    let h = g % (2u * P.hk); // 0..hk: q heads, hk..2hk: k heads
    let base = t * P.conv_dim + h * P.dk;
    var ss = 0.0;
    for (var i = li; i < P.dk; i += WG) {
        let v = u[base + i];
        ss += v * v;
    }
    partial[li] = ss;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            partial[li] += partial[li + stride];
        }
        workgroupBarrier();
    }
    var s = 1.0 / sqrt(partial[0] + P.eps);
    if (h < P.hk) {
        s *= P.q_scale;
    }
    for (var i = li; i < P.dk; i += WG) {
        u[base + i] = u[base + i] * s;
    }
}
