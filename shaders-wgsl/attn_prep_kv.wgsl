// The kv half of the attention preparation (where a kernel may not bind the 11 storage buffers
// of attn_qk_prep.wgsl): a workgroup per kv head (lib_attn_prep.wgsl, lib_prep_kv.wgsl).

@compute @workgroup_size(PREP_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    prep_kv(linear_wg(wg, nwg), li, lanes);
}
