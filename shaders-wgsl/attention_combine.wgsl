// Flash-decoding, second pass: merge the ATT_SPLITS pieces of each query row written by
// attention_split.wgsl: M = max m_s, out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
// Empty pieces have m = NEG_BIG and l = 0, so they weigh exactly 0. One workgroup per row.
struct Params {
    d: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg);
    let d = P.d;
    let stride = d + 2u;
    let base = row * ATT_SPLITS * stride;
    var m = -3.0e38;
    for (var s = 0u; s < ATT_SPLITS; s++) {
        m = max(m, part[base + s * stride]);
    }
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var s = 0u; s < ATT_SPLITS; s++) {
        let p = base + s * stride;
        let f = exp(part[p] - m);
        l += f * part[p + 1u];
        for (var r = 0u; r < 4u; r++) {
            let dim = li + r * ATT_WG;
            if (dim < d) {
                o[r] += f * part[p + 2u + dim];
            }
        }
    }
    let inv = 1.0 / l;
    for (var r = 0u; r < 4u; r++) {
        let dim = li + r * ATT_WG;
        if (dim < d) {
            out[row * d + dim] = o[r] * inv;
        }
    }
}
