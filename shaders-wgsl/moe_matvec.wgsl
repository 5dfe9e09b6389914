// One projection of the routed experts (lib_moe_io.wgsl) for long rows. Workgroup: one slot and
// (MV_WG / lw) * MV_R rows of its expert, laid out as matvec.wgsl's (lw = P.lanes).
@group(0) @binding(3) var<storage, read> X: array<vec4<f32>>;

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: MvLanes) {
    let lw = P.lanes;
    let g = linear_wg(wg, nwg);
    let s = g / P.row_groups;
    let flat = mv_flat(li, lanes);
    let r0 = (g % P.row_groups) * (MV_WG / lw) * MV_R + (flat / lw) * MV_R;
    var e = P.e0 + P.n_e;
    if (s < P.n_slots) {
        e = ids[s];
    }
    // Not a uniform early return (ids is a storage read): inactive workgroups still reduce zeros.
    let ok = e >= P.e0 && e < P.e0 + P.n_e;
    let last = P.rows - 1u;
    let eb = (e - P.e0) * P.rows;
    var rb: array<u32, MV_R>;
    for (var r = 0u; r < MV_R; r++) {
        rb[r] = (eb + min(r0 + r, last)) * P.row_bytes;
    }
    let xb = (s / P.in_div) * (P.n_in / 4u);
    var acc: array<f32, MV_R>;
    if (ok) {
        for (var u = flat % lw; u < P.units; u += lw) {
            let x = mv_x(u, xb);
            for (var r = 0u; r < MV_R; r++) {
                acc[r] += mv_dot(rb[r], u, x);
            }
        }
    }
    let y = mv_sum(acc, flat, lw, lanes);
    if (ok && flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                moe_store(s * P.rows + r0 + r, y[r]);
            }
        }
    }
}
