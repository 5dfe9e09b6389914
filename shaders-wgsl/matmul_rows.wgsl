// out[t][o] = dot(W[o], x[t]), one invocation per output row: the variant for short rows and for
// CPU adapters (lavapipe), where a workgroup per row spends its time in barriers and reductions.
// Same bindings and parameters as matmul.wgsl; token tiles of MM_TILE on grid z.

struct Params {
    n_in: u32,
    n_out: u32,
    n_tok: u32,
    row_bytes: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;


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
    // Two vec4 accumulators instead of a private array: lavapipe leaks the scratch of dynamically
    // indexed private arrays on every dispatch. Rows past the last token re-read the last token's
    // x (in cache) and are never stored.
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    let last = nt - 1u;
    for (var i = 0u; i < P.n_in; i++) {
        let w = deq(row + (i / QK) * BLOCK_BYTES, i % QK);
        let b = t0 * P.n_in + i;
        lo += w * vec4<f32>(x[b], x[b + min(1u, last) * P.n_in], x[b + min(2u, last) * P.n_in],
                            x[b + min(3u, last) * P.n_in]);
        if (nt > 4u) {
            hi += w * vec4<f32>(x[b + 4u * P.n_in], x[b + min(5u, last) * P.n_in],
                                x[b + min(6u, last) * P.n_in], x[b + min(7u, last) * P.n_in]);
        }
    }
    for (var t = 0u; t < nt; t++) {
        out[(t0 + t) * P.n_out + o] = select(hi[max(t, 4u) - 4u], lo[min(t, 3u)], t < 4u);
    }
}
