// out[t][row0 + r] = dot(W[r], x[t]) (lib_mv_io.wgsl), decode's kernel: every weight byte is read once. A workgroup owns MV_ROWS consecutive rows and
// one token (grid z); its invocations stride over the row's units (MV_UNIT elements decoded from
// whole words by the format's `mv_unit4`, which loads the unit's x once for the 4 rows), each accumulating all MV_ROWS rows (one vec4 component
// per row), so consecutive invocations read consecutive bytes of each row. One workgroup sum
// (subgroup or workgroup-memory variant) gives the MV_ROWS results.

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let r0 = linear_wg(wg, nwg) * MV_ROWS;
    // Uniform per workgroup, so the reduction's barriers stay in uniform control flow.
    if (r0 >= P.rows) {
        return;
    }
    let t = wg.z;
    let xb = t * (P.n_in / 4u);
    let rb = mv_rows(r0);
    var acc = vec4<f32>(0.0);
    for (var u = li; u < P.units; u += MV_WG) {
        acc += mv_unit4(rb, u, xb);
    }
    let s = wg_sum4(acc, li, MV_WG, lanes);
    if (li < MV_ROWS && r0 + li < P.rows) {
        out[t * P.n_out + P.row0 + r0 + li] = s[li];
    }
}
