// Up to four matrix-vector products of one token's x in one dispatch (the projections of a
// layer that share its normed input): out_s[r] = dot(W_s[r], x) for segment s (lib_mvg_io.wgsl).
// Each workgroup belongs to one segment and is exactly matvec.wgsl's workgroup for it (same
// geometry, same units and reduction), so one launch and one tail replace up to four.

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: MvLanes) {
    let w = linear_wg(wg, nwg);
    // Past the last segment start is the total, which no workgroup reaches.
    let s = u32(w >= P.start.y) + u32(w >= P.start.z) + u32(w >= P.start.w);
    let rows = P.rows[s];
    wsel = s;
    seg_rows = rows;
    let lw = P.lanes;
    let first = (w - P.start[s]) * (MV_WG / lw) * MV_R;
    // Uniform per workgroup (from the uniform parameters, not the private copies, so WGSL's
    // uniformity analysis sees it), so the reduction's barriers stay in uniform control flow.
    if (first >= rows) {
        return;
    }
    let flat = mv_flat(li, lanes);
    let r0 = first + (flat / lw) * MV_R;
    let rb_lo = mv_row_bytes(r0);
    let rb_hi = mv_row_bytes(r0 + 4u);
    let a = mv_run(rb_lo, rb_hi, flat % lw, lw, 0u);
    let sums = mv_sums(a, flat, lw, lanes);
    if (flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < rows) {
                mvg_store(r0 + r, mv_row(sums, r));
            }
        }
    }
}
