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
    let rb_lo = mv_row_bytes(r0);
    let rb_hi = mv_row_bytes(r0 + 4u);
    var g = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
    var up = g;
    for (var u = flat % lw; u < P.units; u += lw) {
        let x = mv_x(u, xb);
        wsel = 0u;
        g = mv_add(g, rb_lo, rb_hi, u, x);
        wsel = 1u;
        up = mv_add(up, rb_lo, rb_hi, u, x);
    }
    let sg = mv_sums(g, flat, lw, lanes);
    let su = mv_sums(up, flat, lw, lanes);
    if (flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                out[t * P.n_out + P.row0 + r0 + r] = silu(mv_row(sg, r)) * mv_row(su, r);
            }
        }
    }
}
