// acc[t][j] += sigmoid(gate_logit[t]) * x[t][j]: one gate scalar per row of d values.
// One invocation per element; the row's gate is recomputed per element (cheap, and it keeps the
// kernel a plain elementwise one).
struct Params {
    n: u32, // T * d
    d: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> gate_logit: array<f32>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_wg(wg, nwg) * ELT_WG + li;
    if (i < P.n) {
        let s = sigmoid(gate_logit[i / P.d]);
        acc[i] = acc[i] + s * x[i];
    }
}
