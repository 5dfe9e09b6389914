// Gated RMSNorm per head: out = x / sqrt(mean(x^2) + eps) * w * silu(z) over groups of d = w.len().
// Same structure as rms_norm: one workgroup per group, tree reduction of the sum of squares.
const WG: u32 = 256u;

struct Params {
    d: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> z: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

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
        out[base + i] = x[base + i] * s * w[i] * silu(z[base + i]);
    }
}
