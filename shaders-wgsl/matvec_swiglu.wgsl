// out[t][r] = silu(dot(Wg[r], x[t])) * dot(Wu[r], x[t]): the FFN's gate and up projections and
// the SwiGLU in one dispatch (W = gate, W2 = up, same format and shape; lib_mv_io.wgsl). As
// matvec.wgsl, with MV_R gate rows and MV_R up rows per invocation sharing each unit's x
// (lib_mv_swiglu.wgsl).

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: MvLanes) {
    let lw = P.lanes;
    let first = linear_wg(wg, nwg) * (MV_WG / lw) * MV_R;
    if (first >= P.rows) {
        return;
    }
    let flat = mv_flat(li, lanes);
    let r0 = first + (flat / lw) * MV_R;
    let t = wg.z;
    let s = mv_gate_up(r0, flat, lw, t * (P.n_in / 4u), lanes);
    if (flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                out[t * P.n_out + P.row0 + r0 + r] = mv_swiglu_row(s, r);
            }
        }
    }
}
