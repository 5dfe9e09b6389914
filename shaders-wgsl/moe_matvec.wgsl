// One projection of the routed experts (lib_moe_io.wgsl) for long rows. Workgroup: one slot,
// MV_ROWS rows, invocations striding over the row's units (as matvec.wgsl).
@group(0) @binding(3) var<storage, read> X: array<vec4<f32>>;

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: Lanes) {
    let g = linear_wg(wg, nwg);
    let s = g / P.row_groups;
    let r0 = (g % P.row_groups) * MV_ROWS;
    var e = P.e0 + P.n_e;
    if (s < P.n_slots) {
        e = ids[s];
    }
    // Not a uniform early return (ids is a storage read): inactive workgroups still reduce zeros.
    let ok = e >= P.e0 && e < P.e0 + P.n_e;
    let last = P.rows - 1u;
    let eb = (e - P.e0) * P.rows;
    let b0 = (eb + min(r0, last)) * P.row_bytes;
    let b1 = (eb + min(r0 + 1u, last)) * P.row_bytes;
    let b2 = (eb + min(r0 + 2u, last)) * P.row_bytes;
    let b3 = (eb + min(r0 + 3u, last)) * P.row_bytes;
    let xb = (s / P.in_div) * (P.n_in / 4u);
    var acc = vec4<f32>(0.0);
    if (ok) {
        let rb = vec4<u32>(b0, b1, b2, b3);
        for (var u = li; u < P.units; u += MV_WG) {
            acc += mv_unit4(rb, u, xb);
        }
    }
    let y = wg_sum4(acc, li, MV_WG, lanes);
    if (ok && li < MV_ROWS && r0 + li < P.rows) {
        moe_store(s * P.rows + r0 + li, y[li]);
    }
}
