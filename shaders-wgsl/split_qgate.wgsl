// Split the per-head interleaved projection qg = [q_0 | gate_0 | q_1 | gate_1 | ...] (each part
// head_dim wide) into q and gate. One invocation per output element of q (and of gate).
struct Params {
    n: u32, // elements of q (= of gate) = T * H * head_dim
    head_dim: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> qg: array<f32>;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> gate: array<f32>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_wg(wg, nwg) * ELT_WG + li;
    if (i < P.n) {
        let head = i / P.head_dim; // global head index over all tokens
        let j = i % P.head_dim;
        let src = head * 2u * P.head_dim + j;
        q[i] = qg[src];
        gate[i] = qg[src + P.head_dim];
    }
}
