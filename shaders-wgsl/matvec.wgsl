// out[t][row0 + r] = dot(W[r], x[t]) (lib_mv_io.wgsl), decode's kernel: every weight byte is read
// once. A workgroup (one token: grid z) is MV_WG / lw row groups of lw lanes (lw = P.lanes);
// each invocation owns MV_R consecutive rows and the units lane, lane + lw, ... of each: it loads
// a unit's x once (the format's `mv_x`) for its MV_R rows (`mv_dot`, whole-word decoding), and
// consecutive lanes read consecutive units of a row. One reduction per row at the end (subgroup
// shuffles or workgroup memory, lib_mv_reduce_*.wgsl).

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
    let rb = mv_row_bytes(r0);
    var acc: array<f32, MV_R>;
    for (var u = flat % lw; u < P.units; u += lw) {
        let x = mv_x(u, xb);
        for (var r = 0u; r < MV_R; r++) {
            acc[r] += mv_dot(rb[r], u, x);
        }
    }
    let s = mv_sum(acc, flat, lw, lanes);
    if (flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                out[t * P.n_out + P.row0 + r0 + r] = s[r];
            }
        }
    }
}
