// The attention preparation in one dispatch (lib_attn_prep.wgsl): the T * nh query heads'
// workgroups, then the T * nkv kv heads'.

@group(0) @binding(8) var<storage, read> qg: array<f32>;
@group(0) @binding(9) var<storage, read> q_norm: array<f32>;
@group(0) @binding(10) var<storage, read_write> gate: array<f32>;
@group(0) @binding(11) var<storage, read_write> q_normed: array<f32>;

@compute @workgroup_size(PREP_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let row = linear_wg(wg, nwg);
    if (row < P.q_rows) {
        prep_q(row, li, lanes);
    } else {
        prep_kv(row - P.q_rows, li, lanes);
    }
}
