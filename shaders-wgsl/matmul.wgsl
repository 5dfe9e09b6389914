// out[t][o] = dot(W[o], x[t]) for a weight W [n_out, n_in] in the block format spliced in above
// (parameters, bindings and token loads: lib_mm_io.wgsl).
//
// One workgroup per output row o (2-D grid over x/y: the LM head has ~250K rows) and a tile of
// up to MM_TILE tokens (grid z). Each invocation strides over the row, dequantizing each weight
// once and multiplying it with the tile's x values (consecutive invocations read consecutive
// elements, so both W and x loads coalesce); a workgroup tree reduction then sums the partial
// dot products of each token. W is re-read once per token tile (T / MM_TILE times in prefill).

// Partial sums, token-major: red[t * MM_WG + li] (4 KiB).
var<workgroup> red: array<f32, MM_TILE * MM_WG>;

@compute @workgroup_size(MM_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let o = linear_wg(wg, nwg);
    // Uniform per workgroup, so returning early keeps the barriers below in uniform control flow.
    if (o >= P.n_out) {
        return;
    }
    let t0 = wg.z * MM_TILE;
    let nt = min(MM_TILE, P.n_tok - t0);
    let row = o * P.row_bytes;

    // Tokens 0..3 and 4..7 of the tile (lib_mm_io.wgsl).
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    let last = nt - 1u;
    for (var i = li; i < P.n_in; i += MM_WG) {
        let w = deq(row + (i / QK) * BLOCK_BYTES, i % QK);
        let b = t0 * P.n_in + i;
        lo += w * mm_x_lo(b, last);
        if (nt > 4u) {
            hi += w * mm_x_hi(b, last);
        }
    }

    for (var t = 0u; t < 4u; t++) {
        red[t * MM_WG + li] = lo[t];
        red[(t + 4u) * MM_WG + li] = hi[t];
    }
    workgroupBarrier();
    for (var s = MM_WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var t = 0u; t < MM_TILE; t++) {
                red[t * MM_WG + li] += red[t * MM_WG + li + s];
            }
        }
        workgroupBarrier();
    }
    if (li < nt) {
        out[(t0 + li) * P.n_out + o] = red[li * MM_WG];
    }
}
