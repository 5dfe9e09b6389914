// out[t][o] = dot(W[o], x[t]), one invocation per output row: the variant for short rows and for
// CPU adapters (lavapipe), where a workgroup per row spends its time in barriers and reductions.
// Parameters, bindings and token loads: lib_mm_io.wgsl; token tiles of MM_TILE on grid z.

@compute @workgroup_size(MM_ROWS_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let o = linear_wg(wg, nwg) * MM_ROWS_WG + li;
    if (o >= P.n_out) {
        return;
    }
    let t0 = wg.z * MM_TILE;
    let nt = min(MM_TILE, P.n_tok - t0);
    let row = o * P.row_bytes;
    // One token (decode) with rows of whole eight-element groups: eight weights per decode (one
    // wide load for most formats) and one x load each, where the tile loop below makes five loads
    // per element; CPU adapters run this path for every product of a small model.
    if (nt == 1u && P.n_in % 8u == 0u) {
        let xb = t0 * P.n_in;
        var acc = vec4<f32>(0.0);
        for (var i = 0u; i < P.n_in; i += 8u) {
            let w = deq8(row + (i / QK) * BLOCK_BYTES, i % QK);
            let b = xb + i;
            acc += w.a * vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]);
            acc += w.b * vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]);
        }
        out[t0 * P.n_out + o] = (acc.x + acc.y) + (acc.z + acc.w);
        return;
    }
    // Tokens 0..3 and 4..7 of the tile (lib_mm_io.wgsl).
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    let last = nt - 1u;
    for (var i = 0u; i < P.n_in; i++) {
        let w = deq(row + (i / QK) * BLOCK_BYTES, i % QK);
        let b = t0 * P.n_in + i;
        lo += w * mm_x_lo(b, last);
        if (nt > 4u) {
            hi += w * mm_x_hi(b, last);
        }
    }
    for (var t = 0u; t < nt; t++) {
        out[(t0 + t) * P.n_out + o] = select(hi[max(t, 4u) - 4u], lo[min(t, 3u)], t < 4u);
    }
}
