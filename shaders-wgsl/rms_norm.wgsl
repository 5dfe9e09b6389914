// RMSNorm over groups of d consecutive values: out = x / sqrt(mean(x^2) + eps) * w.
// One workgroup per group (a token's hidden vector, or one head of it): each invocation sums the
// squares of a strided slice, a tree reduction in workgroup memory adds the partial sums.
const WG: u32 = 256u;

struct Params {
    d: u32, // group size = w.len()
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let base = linear_wg(wg, nwg) * P.d;
    var ss = 0.0;
    for (var i = li; i < P.d; i += WG) {
        let v = x[base + i];
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
    let s = 1.0 / sqrt(partial[0] / f32(P.d) + P.eps);
    for (var i = li; i < P.d; i += WG) {
        out[base + i] = x[base + i] * s * w[i];
    }
}
