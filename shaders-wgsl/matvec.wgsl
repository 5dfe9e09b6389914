// out[t][row0 + r] = dot(W[r], x[t]) (lib_mv_io.wgsl), decode's kernel: every weight byte is read
// once. A workgroup (one token: grid z) is MV_WG / lw row groups of lw lanes (lw = P.lanes);
// each invocation owns MV_R consecutive rows and the units lane, lane + lw, ... of each: it loads
// a unit's x once (the format's `mv_x`) for its MV_R rows (`mv_run`, whole-word decoding), and
// consecutive lanes read consecutive units of a row. Rows 0..3 accumulate in the components of
// one vec4, rows 4..7 (MV_R = 8) of a second (MvAcc, lib_mv_unit.wgsl: no arrays). One reduction
// per vec4 at the end (subgroup shuffles or workgroup memory, lib_mv_reduce_*.wgsl).

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: MvLanes) {
    let lw = P.lanes;
    let first = linear_wg(wg, nwg) * (MV_WG / lw) * MV_R;
    // Uniform per workgroup, so the reduction's barriers stay in uniform control flow.
    if (first >= P.rows) {
        return;
    }
    let flat = mv_flat(li, lanes);
    let r0 = first + (flat / lw) * MV_R;
    let t = wg.z;
    let xb = t * (P.n_in / 4u);
    let rb_lo = mv_row_bytes(r0);
    let rb_hi = mv_row_bytes(r0 + 4u);
    let a = mv_run(rb_lo, rb_hi, flat % lw, lw, xb);
    let s = mv_sums(a, flat, lw, lanes);
    if (flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                out[t * P.n_out + P.row0 + r0 + r] = mv_row(s, r);
            }
        }
    }
}
