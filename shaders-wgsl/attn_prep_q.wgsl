// The query half of the attention preparation (where a kernel may not bind the 11 storage
// buffers of attn_qk_prep.wgsl): a workgroup per query head (lib_attn_prep.wgsl).

@group(0) @binding(2) var<storage, read> qg: array<f32>;
@group(0) @binding(3) var<storage, read> q_norm: array<f32>;
@group(0) @binding(4) var<storage, read_write> gate: array<f32>;
@group(0) @binding(5) var<storage, read_write> q_normed: array<f32>;

@compute @workgroup_size(PREP_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    prep_q(linear_wg(wg, nwg), li, lanes);
}
