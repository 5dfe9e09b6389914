// out[t][r] = silu(dot(Wg[r], x[t])) * dot(Wu[r], x[t]): the FFN's gate and up projections and
// the SwiGLU in one dispatch (W = gate, W2 = up, same format and shape; lib_mv_io.wgsl). As matvec.wgsl, with
// MV_SWIGLU_ROWS rows per workgroup: the vec4 accumulator holds (gate r0, gate r1, up r0, up r1).

@group(0) @binding(4) var<storage, read> W2: array<vec4<u32>>;

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let r0 = linear_wg(wg, nwg) * MV_SWIGLU_ROWS;
    if (r0 >= P.rows) {
        return;
    }
    let t = wg.z;
    let xb = t * (P.n_in / 4u);
    let b0 = r0 * P.row_bytes;
    let b1 = min(r0 + 1u, P.rows - 1u) * P.row_bytes;
    var acc = vec4<f32>(0.0);
    for (var u = li; u < P.units; u += MV_WG) {
        wsel = 0u;
        let g0 = mv_unit(b0, u, xb);
        let g1 = mv_unit(b1, u, xb);
        wsel = 1u;
        acc += vec4<f32>(g0, g1, mv_unit(b0, u, xb), mv_unit(b1, u, xb));
    }
    let s = wg_sum4(acc, li, MV_WG, lanes);
    if (li < MV_SWIGLU_ROWS && r0 + li < P.rows) {
        out[t * P.n_out + P.row0 + r0 + li] = silu(s[li]) * s[li + 2u];
    }
}
