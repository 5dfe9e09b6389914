// The fused conv + q/k L2 norm: a workgroup per q/k head and per CONV_NORM_WG channels of v
// (lib_conv_l2qk.wgsl).

@compute @workgroup_size(CONV_NORM_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    conv_l2qk(linear_wg(wg, nwg), li, lanes);
}
