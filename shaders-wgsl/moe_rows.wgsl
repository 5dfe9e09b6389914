// One projection of the routed experts (lib_moe_io.wgsl) for short rows (n_in <= 256, the tiny
// models'): one invocation per (slot, row), no workgroup reduction. A workgroup per few rows would
// leave most of its invocations idle and the rest waiting in the reduction's barriers, which CPU
// adapters (lavapipe, the browser's SwiftShader) pay for dearly.
@group(0) @binding(3) var<storage, read> X: array<f32>;

@compute @workgroup_size(MM_ROWS_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let o = linear_wg(wg, nwg) * MM_ROWS_WG + li; // = s * rows + r
    if (o >= P.n_slots * P.rows) {
        return;
    }
    let s = o / P.rows;
    let e = ids[s];
    // Slots routed to another piece's experts (or to an invalid id) are not this dispatch's.
    if (e < P.e0 || e >= P.e0 + P.n_e) {
        return;
    }
    let row = ((e - P.e0) * P.rows + o % P.rows) * P.row_bytes;
    let xb = (s / P.in_div) * P.n_in;
    var acc = 0.0;
    for (var i = 0u; i < P.n_in; i++) {
        acc += deq(row + (i / QK) * BLOCK_BYTES, i % QK) * X[xb + i];
    }
    moe_store(o, acc);
}
