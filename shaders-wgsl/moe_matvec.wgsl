// One projection of the routed experts (lib_moe_io.wgsl) for long rows. Workgroup: one slot and
// (MV_WG / lw) * MV_R rows of its expert, laid out as matvec.wgsl's (lw = P.lanes).
@group(0) @binding(3) var<storage, read> X: array<vec4<f32>>;

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}

// The byte offsets of rows r0 .. r0 + 3 of the expert whose first row is eb; rows past the
// expert re-read its last row and are not stored.
fn moe_row_bytes(eb: u32, r0: u32) -> vec4<u32> {
    let rows = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(P.rows - 1u));
    return (vec4<u32>(eb) + rows) * P.row_bytes;
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
    let eb = (e - P.e0) * P.rows;
    let rb_lo = moe_row_bytes(eb, r0);
    let rb_hi = moe_row_bytes(eb, r0 + 4u);
    let xb = (s / P.in_div) * (P.n_in / 4u);
    var a = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
    if (ok) {
        a = mv_run(rb_lo, rb_hi, flat % lw, lw, xb);
    }
    let y = mv_sums(a, flat, lw, lanes);
    if (ok && flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                moe_store(s * P.rows + r0 + r, mv_row(y, r));
            }
        }
    }
}
