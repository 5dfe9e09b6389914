// out[t][r] = silu(dot(Wg[r], x[t])) * dot(Wu[r], x[t]): the FFN's gate and up projections and
// the SwiGLU in one dispatch (W = gate, W2 = up, same format and shape; lib_mv_io.wgsl). As
// matvec.wgsl, with one accumulator of MV_ROWS rows for the gate and one for up.

@group(0) @binding(4) var<storage, read> W2: array<vec4<u32>>;

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let r0 = linear_wg(wg, nwg) * MV_ROWS;
    if (r0 >= P.rows) {
        return;
    }
    let t = wg.z;
    let xb = t * (P.n_in / 4u);
    let rb = mv_rows(r0);
    var acc_g = vec4<f32>(0.0);
    var acc_u = vec4<f32>(0.0);
    for (var u = li; u < P.units; u += MV_WG) {
        wsel = 0u;
        acc_g += mv_unit4(rb, u, xb);
        wsel = 1u;
        acc_u += mv_unit4(rb, u, xb);
    }
    let g = wg_sum4(acc_g, li, MV_WG, lanes);
    let up = wg_sum4(acc_u, li, MV_WG, lanes);
    if (li < MV_ROWS && r0 + li < P.rows) {
        out[t * P.n_out + P.row0 + r0 + li] = silu(g[li]) * up[li];
    }
}
