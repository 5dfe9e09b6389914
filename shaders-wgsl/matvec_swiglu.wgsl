// out[t][r] = silu(dot(Wg[r], x[t])) * dot(Wu[r], x[t]): the FFN's gate and up projections and
// the SwiGLU in one dispatch (W = gate, W2 = up, same format and shape; lib_mv_io.wgsl). As
// matvec.wgsl, with MV_R gate rows and MV_R up rows per invocation sharing each unit's x.

@group(0) @binding(4) var<storage, read> W2: array<vec4<u32>>;

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
    let xb = t * (P.n_in / 4u);
    let rb = mv_row_bytes(r0);
    var acc_g: array<f32, MV_R>;
    var acc_u: array<f32, MV_R>;
    for (var u = flat % lw; u < P.units; u += lw) {
        let x = mv_x(u, xb);
        wsel = 0u;
        for (var r = 0u; r < MV_R; r++) {
            acc_g[r] += mv_dot(rb[r], u, x);
        }
        wsel = 1u;
        for (var r = 0u; r < MV_R; r++) {
            acc_u[r] += mv_dot(rb[r], u, x);
        }
    }
    let g = mv_sum(acc_g, flat, lw, lanes);
    let up = mv_sum(acc_u, flat, lw, lanes);
    if (flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                out[t * P.n_out + P.row0 + r0 + r] = silu(g[r]) * up[r];
            }
        }
    }
}
